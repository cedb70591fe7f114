"""Child program for tests/pump/test_threads.py: conversations from several processes at once.

Run as `python tests/support/procs_threads.py converse <db> --organism O --path A,B,...
--count N --go-fd FD` with PYTHONPATH set to the repository root. The child
opens the bus, says "ready", waits for the barrier (see
tests/support/procs_coordination.py), then runs N conversations. Each one starts
from the organism's root (`initialize_root`, raced by every child), calls
down the path with `extend_chain` and answers back up with
`prune_for_response`. It prints one JSON line per conversation: the UUIDs it
created (root first) and, for each answer, the (target, thread) it was told
to reply to, deepest first. Exit status 0, or 1 with a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

if __name__ == "__main__":  # run as a script: make `tests.` importable like in the parent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bus import Bus  # noqa: E402
from bus.pump import threads  # noqa: E402
from tests.support.procs_coordination import say  # noqa: E402
from tests.support.procs_coordination import wait_for_go  # noqa: E402

PROGRAM = Path(__file__).resolve()


def converse(args: argparse.Namespace) -> None:
    bus = Bus.open(args.db, create=False)
    names = args.path.split(",")
    wait_for_go(args.go_fd)
    for _ in range(args.count):
        created = [threads.initialize_root(bus.conn, args.organism).uuid]
        for name in names:
            created.append(threads.extend_chain(bus.conn, created[-1], name).uuid)
        answers = []
        for uuid in reversed(created[1:]):
            pruned = threads.prune_for_response(bus.conn, uuid)
            answers.append([pruned.target, pruned.thread.uuid])
        say(json.dumps({"created": created, "answers": answers}))
    bus.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="procs_threads")
    roles = parser.add_subparsers(dest="role", required=True)
    p = roles.add_parser("converse")
    p.add_argument("db")
    p.add_argument("--organism", required=True)
    p.add_argument("--path", required=True, help="comma-separated listener names")
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--go-fd", type=int)
    p.set_defaults(func=converse)
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
