"""Child-process program for tests/pump/test_pump_processes.py: a pump that can be killed.

    python tests/support/procs_pump.py --db PATH --organism FILE --lease-ms N [--block-at K]
                               [--serve]

Prints "ready", runs the pump until idle (with --serve: until SIGTERM), then
prints one JSON line of its stats. With --block-at K the pump prints
"committing" just before its K-th commit and blocks there, between the
handlers and the commit, for the parent to SIGKILL it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from bus import Bus
from bus.pump import Pump
from bus.pump.organism import load_organism


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", required=True)
    parser.add_argument("--organism", required=True)
    parser.add_argument("--lease-ms", type=int, default=300)
    parser.add_argument("--block-at", type=int, default=0)
    parser.add_argument("--serve", action="store_true")
    args = parser.parse_args()
    commits = []

    def before_commit(finished: list) -> None:
        commits.append(len(finished))
        if len(commits) == args.block_at:
            say(f"committing {len(finished)}")
            threading.Event().wait()  # until SIGKILL

    with Bus.open(args.db) as bus:
        pump = Pump(bus, load_organism(args.organism), lease_ms=args.lease_ms, oob=False,
                    before_commit=before_commit)
        signal.signal(signal.SIGTERM, lambda *_: pump.stop())
        say("ready")
        stats = pump.run(until_idle=not args.serve)
    say(json.dumps(stats.to_json_dict()))


if __name__ == "__main__":
    main()
