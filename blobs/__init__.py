"""Content-addressed storage for payloads too large for a message row.

The lowest package: it imports nothing of ours (bus imports it).
"""

from __future__ import annotations

from blobs.errors import BlobCorrupt
from blobs.errors import BlobError
from blobs.errors import BlobMissing
from blobs.errors import BlobRefInvalid
from blobs.store import BlobStore

__all__ = ["BlobCorrupt", "BlobError", "BlobMissing", "BlobRefInvalid", "BlobStore"]
