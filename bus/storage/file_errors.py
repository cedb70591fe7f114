"""A failed file write as the bus reports it: DiskFull or BusReadOnly.

The writes themselves (temp file, fsync, rename) are `blobs.files`'s, the lowest layer.
"""

from __future__ import annotations

import errno
import os

from bus.storage.errors import BusError
from bus.storage.errors import BusReadOnly
from bus.storage.errors import DiskFull

_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_NO_WRITE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


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
