"""Listener code: the modules organism.yaml names, imported, and imported again on hot-reload.

    module = import_from("tools.calc", organism.base_dir)   # as `import`, remembers its source
    with reimported({"tools.calc": "listeners[0].handler"}, source, base_dir) as names:
        routes = build_routes(organism)     # sees the new code; the old one if this raises

A hot-reload re-imports a module only when its source file changed since the
pump imported it (a SHA-256 of the bytes, not the mtime: an edit within the
file system's timestamp granularity would be missed), so a module nobody
edited keeps its objects and its state. The new module is executed from the
source itself, never from `__pycache__`, whose check of mtime and size can
take an edit made in the same second for the old code. Until the new
module's import and the caller's block both succeed, the old module stays
what `sys.modules` gives: a module that fails to import (a syntax error, an
exception at import time) changes nothing, and the pump goes on running the
code it had.

Only the modules organism.yaml names are re-imported, not the modules they
import in turn.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Iterator
from typing import Mapping

from bus.pump.errors import OrganismInvalid

# Module name -> SHA-256 of the source it runs (None: no source file, never re-imported).
_digests: dict[str, str | None] = {}


def import_from(name: str, directory: Path) -> ModuleType:
    """`importlib.import_module(name)` with `directory` first on the path; the module's
    source is remembered, so a hot-reload can tell whether it changed since."""
    with _importable_from(directory):
        module = importlib.import_module(name)
    if name not in _digests:
        _digests[name] = _digest(_source_path(module))
    return module


@contextmanager
def reimported(references: Mapping[str, str], source: str,
               directory: Path) -> Iterator[list[str]]:
    """Import afresh each module of `references` (module name -> the organism key that
    names it) whose source changed; yields their names, in order.

    Raises OrganismInvalid naming the key when a module cannot be imported again. If
    the block raises, the modules it replaced are put back.
    """
    replaced: dict[str, tuple[ModuleType, str | None]] = {}
    try:
        for name, field in references.items():
            fresh = _changed_source(name, source, field)
            if fresh is not None:
                replaced[name] = (sys.modules[name], _digests.get(name))
                _import_again(name, fresh, directory, source, field)
        yield list(replaced)
    except BaseException:
        for name, (old, digest) in replaced.items():
            _install(name, old)
            _digests[name] = digest
        raise


def _changed_source(name: str, source: str, field: str) -> tuple[Path, bytes] | None:
    """The path and bytes of module `name`'s source if it changed since it was imported."""
    module = sys.modules.get(name)
    path = _source_path(module) if module is not None else None
    if path is None or _digests.get(name) is None:
        return None  # not imported yet (the routes import it), or not from a source file
    try:
        code = path.read_bytes()
    except OSError as exc:
        raise OrganismInvalid(source, field, (
            f"the source of {name!r} cannot be read again ({exc}); the pump goes on with "
            "the code it had: put the file back and send hot-reload again")) from None
    if hashlib.sha256(code).hexdigest() == _digests[name]:
        return None
    return path, code


def _import_again(name: str, found: tuple[Path, bytes], directory: Path, source: str,
                  field: str) -> None:
    """Execute module `name` from `found` (its source) as a new module object, in
    `sys.modules` while it runs (dataclasses and type hints look it up there)."""
    path, code = found
    old = sys.modules[name]
    try:
        spec = importlib.util.spec_from_file_location(
            name, path, submodule_search_locations=old.__spec__.submodule_search_locations)
        module = importlib.util.module_from_spec(spec)
        _install(name, module)
        with _importable_from(directory):
            exec(compile(code, str(path), "exec", dont_inherit=True), module.__dict__)
    # The module's own code failed (SystemExit too: it would end the OOB server's
    # thread): report it, keep the old one.
    except (Exception, SystemExit) as exc:
        _install(name, old)
        raise OrganismInvalid(source, field, (
            f"importing {name!r} again failed: {type(exc).__name__}: {exc}; the pump goes "
            "on with the code it had: fix the module and send hot-reload again")) from None
    _digests[name] = hashlib.sha256(code).hexdigest()


def _install(name: str, module: ModuleType) -> None:
    """`module` as `name` for `import name` and `from parent import child` alike."""
    sys.modules[name] = module
    parent_name, _, child = name.rpartition(".")
    parent = sys.modules.get(parent_name) if parent_name else None
    if parent is not None:
        setattr(parent, child, module)


def _source_path(module: ModuleType) -> Path | None:
    spec = getattr(module, "__spec__", None)
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def _digest(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


@contextmanager
def _importable_from(directory: Path) -> Iterator[None]:
    entry = str(directory)
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        sys.path.remove(entry)
