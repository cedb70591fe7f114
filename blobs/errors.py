"""The blob store's errors: plain exceptions, because `blobs` imports nothing of ours.

The bus hands out its store through `bus.storage.blob_errors`, which raises the bus's
subclasses of these (`bus.storage.errors.BlobMissing` is a `BusError` and a
`blobs.errors.BlobMissing`), so a caller may catch either.
"""

from __future__ import annotations


class BlobError(Exception):
    """Base class of every error the blob store raises on purpose."""


class BlobMissing(BlobError):
    """No blob is stored under the reference."""


class BlobCorrupt(BlobError):
    """The stored bytes no longer hash to the reference."""


class BlobRefInvalid(BlobError, ValueError):
    """A string that is not a blob reference like 'sha256-<64 hex>'; no file was touched."""
