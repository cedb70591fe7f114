"""A directory of immutable blobs named by their SHA-256: `sha256-<hex>`.

Writes are atomic and durable before `put` returns: temp file in the same
directory, fsync, rename, fsync of the directory. So a message committed
after `put` never points at a blob that a crash could lose or tear.

Errors are the store's own (blobs/errors.py) and the OSError of a failed
write; the bus translates both into its BusErrors (bus/storage/blob_errors.py).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from pathlib import Path

from blobs.errors import BlobCorrupt
from blobs.errors import BlobMissing
from blobs.errors import BlobRefInvalid
from blobs.files import TEMP_PREFIX
from blobs.files import write_atomically

_REF = re.compile(r"sha256-[0-9a-f]{64}")


class BlobStore:
    """Blobs under `root`, created on first write."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def put(self, data: bytes) -> str:
        """Store `data`; return its reference. Storing the same bytes again is a no-op.

        An existing blob gets a fresh modification time, so gc's grace period
        protects it while the message that now references it is being committed;
        an existing copy that no longer matches its hash is rewritten.
        Raises the OSError, leaving no partial file, when the directory cannot
        take it.
        """
        return self.store(data)[0]

    def store(self, data: bytes) -> tuple[str, bool]:
        """`put`, also saying whether this call created the file (for `discard`)."""
        ref = "sha256-" + hashlib.sha256(data).hexdigest()
        path = self.root / ref
        if self._intact(path, ref):
            os.utime(path)
            return ref, False
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomically(path, data)  # new, or replacing a damaged copy
        return ref, True

    def discard(self, refs: list[str]) -> None:
        """Delete blobs a write created and then did not commit."""
        for ref in refs:
            self.path(ref).unlink(missing_ok=True)

    @staticmethod
    def _intact(path: Path, ref: str) -> bool:
        try:
            return "sha256-" + hashlib.sha256(path.read_bytes()).hexdigest() == ref
        except FileNotFoundError:
            return False

    def get(self, ref: str) -> bytes:
        """The blob's bytes; raises BlobMissing, or BlobCorrupt if they fail the hash."""
        try:
            data = self.path(ref).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"blob {ref} is not in {self.root}") from None
        if "sha256-" + hashlib.sha256(data).hexdigest() != ref:
            raise BlobCorrupt(f"blob {ref} in {self.root} does not match its hash")
        return data

    def head(self, ref: str, size: int) -> tuple[bytes, int]:
        """The blob's first `size` bytes, unchecked (a preview), and its whole size.

        Raises BlobMissing.
        """
        try:
            with open(self.path(ref), "rb") as f:
                return f.read(size), os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            raise BlobMissing(f"blob {ref} is not in {self.root}") from None

    def exists(self, ref: str) -> bool:
        return self.path(ref).is_file()

    def path(self, ref: str) -> Path:
        """Where the blob lives; raises BlobRefInvalid for a malformed reference."""
        if not isinstance(ref, str) or not _REF.fullmatch(ref):
            raise BlobRefInvalid(f"{ref!r} is not a blob reference like 'sha256-<64 hex>'")
        return self.root / ref

    def list_refs(self) -> list[str]:
        """Every stored reference (temp files of writes in progress excluded)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if _REF.fullmatch(p.name))

    def gc(self, referenced: set[str], grace_seconds: float, now: float | None = None) -> list[str]:
        """Delete blobs not in `referenced` and untouched for `grace_seconds`; return them.

        Also removes temp files left by writers that crashed, after the same grace.
        Known limit: a `put` of the same bytes between the age check and the
        unlink (an hour-old unreferenced blob, re-published in that instant)
        loses its file; the message then reports blob_missing.
        """
        cutoff = (time.time() if now is None else now) - grace_seconds
        removed = []
        for path in self._candidates():
            if path.name in referenced:
                continue
            try:
                if path.stat().st_mtime >= cutoff:
                    continue
                path.unlink()
            except FileNotFoundError:
                continue
            if _REF.fullmatch(path.name):  # temp files go too, but are not blobs
                removed.append(path.name)
        return removed

    def _candidates(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [p for p in self.root.iterdir()
                if _REF.fullmatch(p.name) or p.name.startswith(TEMP_PREFIX)]
