"""The pump's side threads: lease renewal (with heartbeats), OOB server, checkpoints.

`Pump.run` opens them around its loop (`with Services(pump):`) and closes
them after it: threads that run beside the pump's two (the loop and the
database thread) and outlive neither. They read the pump's state (its
running units to renew, its finished units waiting for a commit) and the
step's (where the commit under way checkpoints: `step.checkpoint_place`).
The pump is typed `Any` here: importing bus.pump.pump for its type would be
an import cycle.
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any
from typing import Callable

from bus.log import checkpoints
from bus.log.checkpoints import Checkpointer
from bus.coordination.heartbeats import STOPPED
from bus.coordination.heartbeats import Heartbeat
from bus.pump.oob import OobServer
from bus.pump.oob import load_public_key
from bus.pump.oob import socket_path_for
from bus.pump.step import checkpoint_place

log = logging.getLogger("bus.pump")


class Services:
    """The pump's side threads: lease renewal (with heartbeats), OOB server, checkpoints."""

    def __init__(self, pump: Any) -> None:
        self.pump = pump
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.heartbeat: Heartbeat | None = None
        self.oob: OobServer | None = None
        self.checkpointer: Checkpointer | None = None

    def __enter__(self) -> Services:
        try:
            return self._open()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise

    def _open(self) -> Services:
        pump = self.pump
        # While finished units queue up for their commits, the pump commits all the
        # time: its checkpoints run on a thread. Otherwise a step that only routes
        # and claims checkpoints in its commit, and one that commits replies leaves
        # it to the next: after a reply's commit the woken client writes its next
        # request while the checkpoint runs, and the log never started over (it
        # grew to the backstop, all commits past 1000 pages checkpointing); after a
        # claim, the reply's commit finds the log copied and starts it over.
        self.checkpointer = Checkpointer(pump.bus, where=lambda: (
            checkpoints.THREAD if pump._finished else checkpoint_place())).__enter__()
        pump._db_pool.submit(lambda: self.checkpointer.attach_thread_of(pump.bus)).result()
        self.heartbeat = Heartbeat(pump.bus.path, f"pump:{pump.name}",
                                   interval=pump.lease_ms / 3000, status="working",
                                   on_beat=pump._renew).start()
        keys = pump.organism.oob.authorized_keys
        if pump.use_oob and keys:
            self.oob = OobServer(pump.bus, socket_path_for(pump.bus.path, pump.organism.oob.socket),
                                 [load_public_key(path) for path in keys],
                                 pump.table.dispatch, pump.organism.oob.window_s)
            self._thread(self.oob.serve_forever, "pump-oob", self.stopped)
        return self

    def _thread(self, target: Callable[..., None], name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self.threads.append(thread)

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()
        try:
            if self.oob is not None:
                self.oob.close()
            if self.heartbeat is not None:
                # A run that ended (stop(): SIGTERM, SIGINT; or idle) beats `stopped`
                # last, as `worker done` does; one that raised keeps its last beat and
                # decays to dead, like a killed pump, for an operator to look at.
                clean = not exc_info or exc_info[0] is None
                self.heartbeat.stop(last_status=STOPPED if clean else None)
        finally:
            if self.checkpointer is not None:  # on the thread its connection belongs to
                self.pump._db_pool.submit(self.checkpointer.stop).result()
