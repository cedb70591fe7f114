"""The paused holder of tests/coordination/test_fences.py, as a child process.

    python tests/support/procs_fences.py DB WORKER LEASE_MS

WORKER was spawned (`worker spawn`) by the parent. The child starts it
(`Workers.start`: the task's lease, with a fence) and prints one JSON line,
{"task", "fence", "lease_until_ms"}. Then it works as a holder does: it
renews its lease with its fence every tenth of the lease. The parent stops
it (SIGSTOP) past its lease, lets another agent take the task, and
continues it (SIGCONT). Its next renew is refused; it then tries, as a
woken-up holder would, to release the task, publish its result and hand its
work in, each through the command line with its fence, and prints one JSON
line: what each attempt returned (exit code and the JSON error). It exits 0
after reporting; 3 if its lease lapsed with nobody taking the task (the
parent did not stop it in time, which the test must not mistake for fencing).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # run as a script: make `tests.` importable like in the parent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bus import Bus  # noqa: E402
from bus.coordination.claims import StaleFence  # noqa: E402
from workers.lifecycle import Workers  # noqa: E402


def say(record: dict) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def command(db: str, program: str, *args: str) -> dict:
    """Run `bus` or `worker` with --json; its exit code and its JSON error, if any."""
    done = subprocess.run([sys.executable, "-m", program, "--db", db, *args, "--json"],
                          capture_output=True, text=True, timeout=120)
    error = json.loads(done.stderr.splitlines()[-1]) if done.stderr.strip() else None
    return {"exit": done.returncode, "error": error, "stdout": done.stdout}


def hold(bus: Bus, task: str, agent: str, fence: int, lease_ms: int) -> str:
    """Renew with the fence until a renewal fails; the StaleFence message (or exit 3)."""
    while True:
        time.sleep(lease_ms / 10_000)
        try:
            if not bus.claims.renew(task, agent, fence=fence):
                say({"lapsed": True})
                sys.exit(3)
        except StaleFence as refused:
            return str(refused)


def main(db: str, worker: str, lease_ms: int) -> None:
    with Bus.open(db) as bus:
        started = Workers(bus).start(worker, lease_ms)
        [claim] = [c for c in bus.claims.list() if c.task_id == started.task]
        say({"task": claim.task_id, "fence": claim.fence, "lease_until_ms": claim.lease_until_ms})
        renew_refused = hold(bus, claim.task_id, worker, claim.fence, lease_ms)
    fence = str(claim.fence)
    say({
        "renew": renew_refused,
        "release": command(db, "bus.cli", "release", "--task", claim.task_id, "--agent", worker,
                           "--fence", fence),
        "publish": command(db, "bus.cli", "publish", "--from", worker, "--type", "result",
                           "--task", claim.task_id, "--fence", fence,
                           "--payload", '{"by": "paused holder"}'),
        "done": command(db, "workers.cli", "done", worker, "--allow-empty", "--fence", fence,
                        "--message", "the paused holder's work"),
    })


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
