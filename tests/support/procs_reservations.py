"""Child program for tests/coordination/test_reservations_processes.py.

`python tests/support/procs_reservations.py <go-fd> <bus CLI args...>` prints "ready", blocks on
the barrier pipe (file descriptor <go-fd>) until the parent closes its write end, then
runs the `bus` command line in-process, so its exit status and output are the CLI's own.
Everything is imported before "ready": released children race at once.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make `tests.` importable like in the parent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.procs_coordination import wait_for_go  # noqa: E402

PROGRAM = Path(__file__).resolve()


def main(argv: list[str]) -> None:
    from bus.cli import main as bus_main  # imported before the barrier on purpose

    go_fd = int(argv[0])
    wait_for_go(go_fd)
    bus_main(args=argv[1:], prog_name="bus")  # standalone mode: exits with the CLI's status


if __name__ == "__main__":
    main(sys.argv[1:])
