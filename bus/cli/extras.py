"""Optional parts behind extras: a command whose extra is not installed names it.

The core install is the embedded bus. The views (`[views]`: Textual, Starlette,
uvicorn, Plotly), the MCP server (`[mcp]`) and the Spark history (`[spark]`)
are imported only by the commands that use them, through `import_extra`.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import click

OURS = ("bus", "workers", "blobs")  # a missing module of ours is a bug, not a missing extra


class ExtraMissing(click.ClickException):
    """Exit 1 with `Error: bus top needs textual ...: pip install 'agentbus[views]'`."""

    def __init__(self, command: str, missing: str, extra: str) -> None:
        super().__init__(f"{command} needs {missing}, which the {extra} extra installs:"
                         f" pip install 'agentbus[{extra}]'")
        self.extra = extra


def import_extra(module: str, extra: str, command: str) -> ModuleType:
    """Import `module` of ours whose dependencies come with `agentbus[extra]`.

    `command` is what the user ran (`bus top`), for the message.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        named = extra_missing(exc, extra, command)
        if named is None:
            raise
        raise named from None


def require_extra(package: str, extra: str, command: str) -> None:
    """Fail now, naming `extra`, if its `package` is not installed; finds it without importing."""
    if importlib.util.find_spec(package) is None:
        raise ExtraMissing(command, package, extra)


def extra_missing(exc: ModuleNotFoundError, extra: str, command: str) -> ExtraMissing | None:
    """The error naming `extra` for a module it would install; None for one of ours."""
    missing = (exc.name or "").partition(".")[0]
    if not missing or missing in OURS:
        return None
    return ExtraMissing(command, missing, extra)
