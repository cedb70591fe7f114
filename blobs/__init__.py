"""Content-addressed storage for payloads too large for a message row."""

from __future__ import annotations

from blobs.store import BlobCorrupt
from blobs.store import BlobMissing
from blobs.store import BlobStore

__all__ = ["BlobCorrupt", "BlobMissing", "BlobStore"]
