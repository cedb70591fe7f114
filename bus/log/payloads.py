"""Where a payload lives: inline in its row, in the blob store, or nowhere (too large).

One `PayloadPolicy` per open bus (`Bus.payloads`) decides for every writer:
the log's one write path (`messages.append`) applies it to every row, whether
a publish, a channel's send, the pump's sends and commits or a part's own
announcement, so the size limit, the blob threshold and the cleanup of blobs a
failed write left behind are decided here and nowhere else.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator
from typing import Sequence

from bus.storage.blob_errors import BusBlobStore
from bus.storage.errors import ValidationFailed
from bus.log.messages import Row

BLOB_THRESHOLD = 4096  # bytes of payload JSON above which it goes to the blob store
MAX_PAYLOAD_BYTES = 16 * 1024 * 1024  # bytes of payload JSON one message may carry
BYTES_PER_CHAR_MAX = 4  # UTF-8: a payload of n characters is at most 4n bytes


class PayloadPolicy:
    """The size limit, the blob offload and the staging of blobs for one bus."""

    def __init__(self, blobs: BusBlobStore, blob_threshold: int = BLOB_THRESHOLD,
                 max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> None:
        self.blobs = blobs
        self.blob_threshold = blob_threshold
        self.max_payload_bytes = max_payload_bytes
        self._local = threading.local()  # the refs staged by this thread's outermost block

    def all_inline(self, rows: Sequence[Row]) -> bool:
        """True when no row's payload can be near the blob threshold or the size limit.

        The common case: such rows need neither a size check, a blob nor staging.
        """
        small = min(self.blob_threshold, self.max_payload_bytes) // BYTES_PER_CHAR_MAX
        return all(row.payload is None or len(row.payload) <= small for row in rows)

    def check_size(self, row: Row, field: str = "payload") -> None:
        """Raise ValidationFailed when the row's payload JSON is over max_payload_bytes."""
        # Short payloads skip the encode.
        if row.payload is None or len(row.payload) * BYTES_PER_CHAR_MAX <= self.max_payload_bytes:
            return
        size = len(row.payload.encode())
        if size > self.max_payload_bytes:
            raise ValidationFailed(
                field, f"is {size} bytes of JSON; the limit is {self.max_payload_bytes} bytes"
                       " (Bus.open(max_payload_bytes=...), bus --max-payload-bytes): store"
                       " large data in a file and send its path", value_length=size)

    def place(self, row: Row) -> Row:
        """The row, with a payload over blob_threshold bytes moved to the blob store.

        Checks the size limit first (ValidationFailed): nothing is written for a refused row.
        A blob first written inside `staging()` is deleted if that block raises.
        """
        self.check_size(row)
        if row.payload is None or len(row.payload) * BYTES_PER_CHAR_MAX <= self.blob_threshold:
            return row
        data = row.payload.encode()
        if len(data) <= self.blob_threshold:
            return row
        ref, created = self.blobs.store(data)
        staged = getattr(self._local, "staged", None)
        if created and staged is not None:
            staged.append(ref)
        return row._replace(payload=None, payload_ref=ref)

    @contextlib.contextmanager
    def staging(self) -> Iterator[None]:
        """Delete the blobs first written inside the block if the block raises.

        So a refused or failed write (full disk, unknown channel, a limit)
        leaves no blob behind. Known limit, as in `BlobStore.gc`: identical
        bytes put by another writer in the same instant lose their file too.
        """
        if getattr(self._local, "staged", None) is not None:
            yield  # nested: the outermost block decides
            return
        self._local.staged = []
        try:
            yield
        except BaseException:
            self.blobs.discard(self._local.staged)
            raise
        finally:
            self._local.staged = None
