"""Child-process program for tests/log/test_process_loop.py: a consumer running `Consumer.run`.

Run as `python tests/support/procs_consumer.py <db> <agent> [--hang-at SEQ]` with
PYTHONPATH set to the repository root (the `python_env` fixture does that).
It talks to the parent through stdout lines (flushed):

  ready             the bus is open and the loop is about to start
  waiting           before each wait on the commit signal (nothing is waiting)
  handling <seq>    the handler started on a message
  handled <seq>     the handler returned (the ack follows)
  stopped <n>       the loop ended (SIGTERM: `stop()`), after handling n messages

With `--hang-at SEQ` the handler blocks for ever on that message, for the
parent to kill the process mid-handler. The loop waits on the commit signal
for up to an hour (`idle_wait`), so only a wake or a stop can end that wait in
a test's time. Any unexpected exception prints a traceback to stderr and
exits with status 1.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from bus import Bus
from bus import Consumer
from bus import Message

IDLE_WAIT_S = 3600.0


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class AnnouncedWaits:
    """The bus, saying "waiting" before each wait, so the parent knows when to publish."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.poll = bus.poll
        self.ack = bus.ack

    def wait_for_change(self, timeout: float, interrupt: int | None = None) -> bool:
        say("waiting")
        return self.bus.wait_for_change(timeout, interrupt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="procs_consumer")
    parser.add_argument("db")
    parser.add_argument("agent")
    parser.add_argument("--hang-at", type=int, default=None)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)

    def handle(message: Message) -> None:
        say(f"handling {message.seq}")
        if message.seq == args.hang_at:
            threading.Event().wait()  # until SIGKILL
        say(f"handled {message.seq}")

    with Bus.open(args.db, create=False) as bus:
        # The first wait on a thread returns at once (it has nothing to compare with):
        # spend it here, so that each "waiting" below is a real wait.
        bus.wait_for_change(0)
        with Consumer(AnnouncedWaits(bus), args.agent, handle, idle_wait=IDLE_WAIT_S) as consumer:
            signal.signal(signal.SIGTERM, lambda *_: consumer.stop())
            say("ready")
            stats = consumer.run()
    say(f"stopped {stats.handled}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
