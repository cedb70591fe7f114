"""Durable file writes (temp file, fsync, rename, fsync of the directory) and their errors."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from bus.errors import BusError
from bus.errors import BusReadOnly
from bus.errors import DiskFull

TEMP_PREFIX = ".tmp-"
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_NO_WRITE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never half.

    The directory is fsynced after the rename: the new entry lives in its data.
    """
    fd, temp = tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def os_error(exc: OSError, path: str = "") -> BusError | None:
    """DiskFull or BusReadOnly for a failed file operation, None for other failures."""
    where = str(exc.filename or path)
    if exc.errno in _NO_SPACE:
        return DiskFull(where, exc.strerror or str(exc))
    if exc.errno in _NO_WRITE:
        return BusReadOnly(where, exc.strerror or str(exc))
    return None


class translate_os_errors:
    """Turn a full disk or a refused file write into DiskFull or BusReadOnly."""

    __slots__ = ("path",)

    def __init__(self, path: str | os.PathLike[str] = "") -> None:
        self.path = os.fspath(path)

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None and issubclass(exc_type, OSError):
            named = os_error(exc, self.path)
            if named is not None:
                raise named from exc
        return False
