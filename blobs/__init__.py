"""Content-addressed storage for payloads too large for a message row.

The lowest package: it imports nothing of ours (bus imports it).
"""

from __future__ import annotations

import importlib

from blobs.errors import BlobCorrupt
from blobs.errors import BlobError
from blobs.errors import BlobMissing
from blobs.errors import BlobRefInvalid

__all__ = ["BlobCorrupt", "BlobError", "BlobMissing", "BlobRefInvalid", "BlobStore"]


def __getattr__(name: str) -> object:
    """`BlobStore`, loaded when first used (PEP 562): importing the errors, as every bus
    module does, need not load the store and hashlib with it."""
    if name != "BlobStore":
        raise AttributeError(f"module 'blobs' has no attribute {name!r}")
    return importlib.import_module("blobs.store").BlobStore
