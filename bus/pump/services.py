"""The pump's side threads: lease renewal (with heartbeats), change watcher, OOB server,
checkpoints. `Pump.run` opens them around its loop (`with Services(pump):`).

They read and set the pump's private state (its sleeping flag, scan, finished
units): they are part of the pump, in a module of their own for its length.
The pump is typed `Any` here: importing bus.pump.pump for its type would be
an import cycle.
"""

from __future__ import annotations

import logging
import threading
from typing import Any
from typing import Callable

from bus import checkpoints
from bus.checkpoints import Checkpointer
from bus.db import translate_busy
from bus.errors import BusError
from bus.heartbeats import Heartbeat
from bus.messages import now_ms
from bus.pump import work
from bus.pump.oob import OobServer
from bus.pump.oob import load_public_key
from bus.pump.oob import socket_path_for

log = logging.getLogger("bus.pump")
WATCH_S = 0.5
WATCH_POLL_S = 0.05  # the watcher looks at `stopped` this often while it waits for commits


class Services:
    """The pump's side threads: lease renewal (with heartbeats), change watcher, OOB
    server, checkpoints."""

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
            self.__exit__()
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
            checkpoints.THREAD if pump._finished else pump._checkpoint)).__enter__()
        pump._db_pool.submit(lambda: self.checkpointer.attach(pump.bus.conn)).result()
        self.heartbeat = Heartbeat(pump.bus.path, f"pump:{pump.name}",
                                   interval=pump.lease_ms / 3000, status="working",
                                   on_beat=pump._renew).start()
        self._thread(self._watch, "pump-watch")
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

    def _watch(self) -> None:
        # Short waits, so that stopping (which also sets `_sleeping`) joins this
        # thread at once: `run(until_idle=True)` used to end WATCH_S late.
        while not self.stopped.is_set():
            if not self.pump._sleeping.wait(WATCH_S) or self.stopped.is_set():
                continue
            try:
                if self.pump.bus.wait_for_change(WATCH_POLL_S) and self._worth_a_step():
                    self.pump._poke()
            except BusError as exc:  # busy or closed: look again, or stop with the pump
                log.warning("pump change watcher: %s", exc)
                self.stopped.wait(WATCH_S)

    def _worth_a_step(self) -> bool:
        """After a commit: whether it left the sleeping loop something to do.

        Most commits the watcher sees are the pump's own (its claims, while
        the handlers run); waking the loop for those only took time from them.
        So: the inbox holds something, a unit can be claimed, the routing
        table changed, or a lease (another pump's claim) runs out before the
        loop would wake anyway (its scan then learns when). Finished handlers
        and `stop()` wake the loop themselves. Running until idle, any commit
        may be another pump's last: look again.
        """
        pump = self.pump
        if pump._until_idle or pump.table.routes is not pump._scan.routes:
            return True
        with translate_busy():
            ready, next_expiry = work.has_work(pump.bus.conn, pump.name, now_ms())
        return ready or (next_expiry is not None and next_expiry < pump._wake_at_ms)

    def __exit__(self, *exc_info: object) -> None:
        self.stopped.set()
        self.pump._sleeping.set()  # the watcher waits for this: let it see `stopped`
        for thread in self.threads:
            thread.join()
        self.pump._sleeping.clear()
        try:
            if self.oob is not None:
                self.oob.close()
            if self.heartbeat is not None:
                self.heartbeat.stop()
        finally:
            if self.checkpointer is not None:  # on the thread its connection belongs to
                self.pump._db_pool.submit(self.checkpointer.stop).result()
