"""Child-process program for tests/coordination/test_tasks.py: agents taking ready tasks with claim-next.

    python tests/support/procs_tasks.py DB --agent A --go-fd N

The child prints "ready", waits on the barrier (tests/support/children.py), then
calls `claim_next` until nothing is ready and prints the ids it got as one
JSON line. Leases are long: the race is about handing each task out once.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bus import Bus

LEASE_MS = 3_600_000


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--agent", required=True)
    parser.add_argument("--go-fd", type=int, required=True)
    args = parser.parse_args(argv)
    with Bus.open(args.db) as bus:
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        while os.read(args.go_fd, 1):  # b"": the parent closed the barrier
            pass
        taken = []
        while (claimed := bus.tasks.claim_next(args.agent, LEASE_MS)) is not None:
            taken.append(claimed.task.task_id)
    sys.stdout.write(json.dumps(taken) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
