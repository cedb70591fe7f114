"""Group commit: publishes from several threads of one process share a transaction.

SQLite has one writer at a time, and each thread of a `Bus` has its own
connection, so without this, 16 threads publishing at once queue on the
file's write lock and each pays a whole commit (and SQLite's busy-handler
sleeps) for one row. Here the first thread to arrive becomes the leader: it
takes every request queued so far, writes them all in one BEGIN IMMEDIATE
transaction on its own connection, and wakes their threads. Requests that
arrive while that commit is in flight wait for the next one, whose leader is
one of them. Every caller still gets its own results (seq, duplicate flag)
and returns only once its rows are committed: durability is unchanged, and
a failed transaction fails every request in it, none half-written.

A thread whose connection is already inside a transaction must not wait for
another leader (it may hold the write lock that leader needs) nor commit
other threads' rows inside a transaction it may roll back; `Bus` writes such
a publish directly, in that transaction.
"""

from __future__ import annotations

import threading
from typing import Callable
from typing import Generic
from typing import Sequence
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Request(Generic[Item, Result]):
    __slots__ = ("items", "results", "error", "done", "wake")

    def __init__(self, items: Sequence[Item]) -> None:
        self.items = items
        self.results: list[Result] = []
        self.error: BaseException | None = None
        self.done = False
        # Each waiter sleeps on its own lock (acquired here, released to wake it),
        # so a commit wakes exactly the threads it concerns, not every waiter.
        self.wake = threading.Lock()
        self.wake.acquire()

    def outcome(self) -> list[Result]:
        if self.error is not None:
            raise self.error
        return self.results


class GroupCommit(Generic[Item, Result]):
    """Batches concurrent `submit` calls into one call of `write`.

    `write(batches)` gets the items of each waiting request, in arrival order,
    and returns one list of results per request; it runs in the leader's
    thread and must do all of its work in one transaction.
    """

    def __init__(self, write: Callable[[list[Sequence[Item]]], list[list[Result]]]) -> None:
        self._write = write
        self._lock = threading.Lock()
        self._queue: list[_Request[Item, Result]] = []
        self._leading = False
        self.commits = 0  # transactions written, for tests and benchmarks

    @property
    def queued(self) -> int:
        """Requests waiting for the next transaction (the one in flight not counted)."""
        with self._lock:
            return len(self._queue)

    def submit(self, items: Sequence[Item]) -> list[Result]:
        """Write `items` in the next group transaction; return their results."""
        request: _Request[Item, Result] = _Request(items)
        with self._lock:
            self._queue.append(request)
            follow = self._leading
            self._leading = True
        if follow:
            request.wake.acquire()  # released when its batch is written, or to lead
            if request.done:
                return request.outcome()
        self._lead()
        return request.outcome()

    def _lead(self) -> None:
        with self._lock:
            batch, self._queue = self._queue, []
        try:
            results = self._write([request.items for request in batch])
            for request, result in zip(batch, results):
                request.results = result
        except BaseException as exc:  # noqa: BLE001 - every waiter hears of it
            for request in batch:
                request.error = exc
        finally:
            self._hand_over(batch)

    def _hand_over(self, batch: list[_Request[Item, Result]]) -> None:
        """Wake the batch's callers; the first request still queued leads next."""
        with self._lock:
            self.commits += 1
            successor = self._queue[0] if self._queue else None
            self._leading = successor is not None
        for request in batch:
            request.done = True
            if request.wake.locked():
                request.wake.release()
        if successor is not None:
            successor.wake.release()
