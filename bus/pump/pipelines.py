"""Where the pump runs its listeners' pipelines: a worker thread per listener.

A unit's input goes through its listener's pipeline (parse, repair, C14N,
envelope and payload XSD, deserialization: `commit.checked_input`) before
its handler sees it. On the event loop's thread, one unit after another,
one listener's pipeline held up every other listener's and the loop. Each
listener has a pipeline of its own, side by side: here each
listener has one worker thread, so the pipelines of different listeners
overlap, while one listener's inputs still finish their pipelines, and
reach its handler, in the order they were claimed.

What that buys is overlap, not speed. lxml 6.1 keeps the GIL through
parsing, C14N, XSD validation and decoding (a spinning thread beside them
never gets it: scripts/bench_pump.py's pipelines scenario and
docs/benchmarks.md), so two pipelines share one core whatever the threads;
what overlaps is any step that waits (a payload class whose `__post_init__`
looks something up) and, under a free-threaded Python, the work itself. The
hop to a thread and back costs 40-60 us of CPU per input, more than a small
input's whole pipeline, so an envelope under `MIN_BYTES` is checked on the
loop, unless its listener's worker still has inputs queued (it would
overtake them).

lxml parsers and schemas are per thread (bus/xml/parser.py), so each worker
compiles each schema it uses once.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from bus.log.messages import Message
from bus.pump.commit import Encoded
from bus.pump.commit import Finished
from bus.pump.commit import checked_input
from bus.pump.routing import Listener
from bus.pump.work import Unit
from bus.xml.envelope import Envelope

MIN_BYTES = 16384  # smaller envelopes are checked on the loop (see the module docstring)


class Pipelines:
    """The pipelines of one running pump: `await check(...)` on its event loop."""

    def __init__(self, min_bytes: int | None = None) -> None:
        self.min_bytes = MIN_BYTES if min_bytes is None else min_bytes
        self._workers: dict[str, ThreadPoolExecutor] = {}
        self._queued: dict[str, int] = {}  # inputs sent to a listener's worker, not back yet

    async def check(self, unit: Unit, message: Message, listener: Listener,
                    encoded: Encoded | None) -> Envelope | Finished:
        """`checked_input` of the unit, on its listener's worker unless it is cheap."""
        name = listener.name
        if not self._queued.get(name) and (encoded is not None
                                           or _size(message) < self.min_bytes):
            return checked_input(unit, message, listener, encoded)
        self._queued[name] = self._queued.get(name, 0) + 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._worker(name), checked_input, unit, message, listener, encoded)
        finally:
            self._queued[name] -= 1

    def _worker(self, name: str) -> ThreadPoolExecutor:
        """The listener's own worker thread, started on its first input."""
        worker = self._workers.get(name)
        if worker is None:
            worker = self._workers[name] = ThreadPoolExecutor(
                1, thread_name_prefix=f"pump-pipeline-{name}")
        return worker

    def close(self) -> None:
        """Stop the workers (each finishes what it has queued)."""
        workers, self._workers = self._workers, {}
        for worker in workers.values():
            worker.shutdown(wait=True)


def _size(message: Message) -> int:
    """The length of the envelope's XML; 0 when the row holds none (its error is cheap)."""
    payload = message.payload
    xml = payload.get("xml") if isinstance(payload, dict) else None
    return len(xml) if isinstance(xml, str) else 0
