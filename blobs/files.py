"""Durable file writes: temp file, fsync, rename, fsync of the directory.

In `blobs`, the lowest package, so the bus (its export) and the workers (their
state mirrors) write files the same way the blob store does.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

TEMP_PREFIX = ".tmp-"


def write_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that readers see the old or the new file, never half.

    The directory is fsynced after the rename: the new entry lives in its data.
    On failure the temp file is removed and the OSError propagates.
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
