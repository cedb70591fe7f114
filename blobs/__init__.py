"""Content-addressed storage for payloads too large for a message row."""

from __future__ import annotations

from blobs.store import BlobStore
from bus.errors import BlobCorrupt
from bus.errors import BlobMissing

__all__ = ["BlobCorrupt", "BlobMissing", "BlobStore"]
