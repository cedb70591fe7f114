"""The blob store as the bus hands it out (`Bus.blobs`): its errors are BusErrors.

`blobs` sits below the bus and raises its own plain exceptions and the OSError
of a failed write. Users of the bus catch BusError, so each call that can fail
is translated here: BlobMissing, BlobCorrupt and BlobRefInvalid become the
bus.storage.errors classes of the same name; a full disk or a refused write while
storing becomes DiskFull or BusReadOnly, as for every other file the bus writes.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import blobs
from bus.storage.errors import BlobCorrupt
from bus.storage.errors import BlobMissing
from bus.storage.errors import BlobRefInvalid
from bus.storage.errors import BusError
from bus.storage.file_errors import translate_os_errors


@contextlib.contextmanager
def blob_errors_as_bus_errors() -> Iterator[None]:
    """Raise the blob store's errors inside the block as the bus.storage.errors classes."""
    try:
        yield
    except BusError:
        raise  # already translated (get calls path, which is translated too)
    except blobs.BlobMissing as exc:
        raise BlobMissing(str(exc)) from exc
    except blobs.BlobCorrupt as exc:
        raise BlobCorrupt(str(exc)) from exc
    except blobs.BlobRefInvalid as exc:
        raise BlobRefInvalid("ref", str(exc)) from exc


class BusBlobStore(blobs.BlobStore):
    """A `blobs.BlobStore` whose errors are the bus's (see the module docstring)."""

    def store(self, data: bytes) -> tuple[str, bool]:
        # Only writing is translated to DiskFull/BusReadOnly: a refused read
        # is not "cannot be written", so get/head let their OSError through.
        with blob_errors_as_bus_errors(), translate_os_errors(self.root):
            return super().store(data)

    def get(self, ref: str) -> bytes:
        with blob_errors_as_bus_errors():
            return super().get(ref)

    def head(self, ref: str, size: int) -> tuple[bytes, int]:
        with blob_errors_as_bus_errors():
            return super().head(ref, size)

    def exists(self, ref: str) -> bool:
        with blob_errors_as_bus_errors():
            return super().exists(ref)

    def path(self, ref: str) -> Path:
        with blob_errors_as_bus_errors():
            return super().path(ref)

    def discard(self, refs: list[str]) -> None:
        with blob_errors_as_bus_errors():
            super().discard(refs)
