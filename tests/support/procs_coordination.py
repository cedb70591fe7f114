"""Child-process programs for tests/coordination/test_claims.py and tests/coordination/test_heartbeats.py.

Run as `python tests/support/procs_coordination.py <role> [options]` with PYTHONPATH
set to the repository root (the `python_env` fixture does that). Every role
talks to the parent through flushed stdout lines and, where children must
start together, a start barrier:

    --go-fd N   the child prints "ready" and then blocks reading file
                descriptor N; the parent closes its (only) write end, so every
                child waiting on the same pipe is released at the same moment.

Roles that must stay alive until the parent kills them block reading stdin,
which the parent never writes. Any unexpected exception prints a traceback to
stderr and exits with status 1; every role that finishes normally exits 0.

The parent side (`Child`, `Barrier`, `Children`) lives at the end of this
file so both test modules share it; it uses only the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import traceback
from pathlib import Path

from bus import Bus
from bus.coordination.heartbeats import Heartbeat
from tests.support import children

RACE_MAX_ATTEMPTS = 1_000_000_000  # the race is about leases, not about dead tasks
BEAT_TIMEOUT = 30.0  # for a child's Heartbeat thread to send its first beats


def say(text: str) -> None:
    """One line to the parent, written in one flushed write."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def wait_for_go(fd: int | None) -> None:
    """Block until the parent closes the write end of the barrier pipe."""
    if fd is None:
        return
    say("ready")
    while os.read(fd, 1):  # b"" means EOF: the parent closed the pipe
        pass
    os.close(fd)


def block_until_killed() -> None:
    sys.stdin.read()  # the parent never writes: this blocks until SIGKILL
    raise AssertionError("stdin closed: the parent was supposed to kill this process")


def wall_ms() -> int:
    """Epoch milliseconds from the same clock the bus stamps claims with."""
    return time.time_ns() // 1_000_000


def wait_for_beats(hb: Heartbeat, count: int) -> None:
    """Wait until the Heartbeat thread has committed `count` beats (a deadline bounds it)."""
    deadline = time.monotonic() + BEAT_TIMEOUT
    while hb.beats < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"only {hb.beats} beats after {BEAT_TIMEOUT} s")
        time.sleep(0.005)


# --- roles ------------------------------------------------------------------


def race(args: argparse.Namespace) -> None:
    """Race the other children for `tasks` tasks with short leases; write every grant.

    Round after round, the tasks are visited in this child's own random
    order. A granted claim is then, at random: released at once; extended
    at once by claiming again; kept and released on the next visit (by then
    the lease has usually expired and maybe been taken over, so the release
    may return False); or kept and left to expire. Each grant is one JSON
    line in `out`:

        task, agent, start (the holding's claimed_at_ms), attempts, fence,
        lease_until_ms, new_holding (False when this grant extended the
        holding this child already had), t_call (wall ms before try_claim),
        and for the grant a release followed: t_before_release (wall ms just
        before release was called) and release_ok (what release returned).
    """
    rng = random.Random(args.seed)
    bus = Bus.open(args.db)
    tasks = [f"task-{n:03d}" for n in range(args.tasks)]
    records: list[dict] = []
    mine: dict[str, dict] = {}  # task -> {"record", "release_later"} while this child holds it
    counts = {"calls": 0, "refused": 0, "released": 0, "release_refused": 0, "rounds": 0}

    def release(task: str) -> None:
        record = mine.pop(task)["record"]
        record["t_before_release"] = wall_ms()
        record["release_ok"] = bus.claims.release(task, args.agent)
        counts["released" if record["release_ok"] else "release_refused"] += 1

    def claim(task: str) -> dict | None:
        lease = rng.randint(args.lease_min, args.lease_max)
        t_call = wall_ms()
        result = bus.claims.try_claim(task, args.agent, lease, max_attempts=RACE_MAX_ATTEMPTS)
        counts["calls"] += 1
        held = mine.pop(task, None)
        if not result.granted:
            counts["refused"] += 1
            return None
        claim_ = result.claim
        if claim_ is None or claim_.agent != args.agent or claim_.task_id != task:
            raise AssertionError(f"granted, but the claim is {claim_}")
        previous = held["record"] if held else None
        # Still this child's holding: the bus kept its start and attempt count.
        extended = previous is not None and (previous["start"], previous["attempts"]) == (
            claim_.claimed_at_ms, claim_.attempts)
        record = {
            "task": task, "agent": args.agent,
            "start": previous["start"] if extended else claim_.claimed_at_ms,
            "attempts": claim_.attempts, "fence": claim_.fence,
            "lease_until_ms": claim_.lease_until_ms,
            "lease_ms": lease, "new_holding": not extended, "t_call": t_call,
        }
        records.append(record)
        mine[task] = {"record": record, "release_later": False}
        return record

    wait_for_go(args.go_fd)
    end = time.monotonic() + args.seconds
    while time.monotonic() < end and counts["rounds"] < args.max_rounds:
        counts["rounds"] += 1
        rng.shuffle(tasks)
        for task in tasks:
            if time.monotonic() >= end:
                break
            if task in mine and mine[task]["release_later"]:
                release(task)
                continue
            if claim(task) is None:
                continue
            choice = rng.random()
            if choice < 0.40:
                release(task)
            elif choice < 0.55:
                claim(task)  # usually an extension of the lease just granted
            elif choice < 0.75:
                mine[task]["release_later"] = True
            # else: keep it and let the lease run out
    bus.close()
    with open(args.out, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record) + "\n")
    say(json.dumps({"grants": len(records), **counts}))


def claim_all(args: argparse.Namespace) -> None:
    """Claim each of `tasks` once (real clock), all children at once; report the outcomes.

    Prints {"granted": [task ids], "dead": [task ids refused as dead]}.
    """
    bus = Bus.open(args.db)
    tasks = args.tasks.split(",")
    random.Random(args.seed).shuffle(tasks)
    wait_for_go(args.go_fd)
    granted, dead = [], []
    for task in tasks:
        result = bus.claims.try_claim(task, args.agent, 60_000)
        if result.granted:
            granted.append(task)
        elif result.dead is not None:
            dead.append(task)
    bus.close()
    say(json.dumps({"granted": granted, "dead": dead}))


def hold(args: argparse.Namespace) -> None:
    """Claim one task (optionally while beating), print the claim, block until killed.

    With --heartbeat-interval a Heartbeat thread runs first: the claim is
    made after 3 beats and printed, with the beat count, once a beat has
    committed after it.
    """
    bus = Bus.open(args.db)
    hb = None
    if args.heartbeat_interval is not None:
        hb = Heartbeat(args.db, args.agent, args.heartbeat_interval, status="working",
                       task=args.task).start()
        wait_for_beats(hb, 3)
    result = bus.claims.try_claim(args.task, args.agent, args.lease_ms)
    if not result.granted:
        raise AssertionError(f"claim refused: {result}")
    if hb is not None:
        # The second beat counted from here began after the claim committed.
        wait_for_beats(hb, hb.beats + 2)
    say(json.dumps({"claim": result.claim.to_json_dict(), "beats": hb.beats if hb else None}))
    block_until_killed()


def beat(args: argparse.Namespace) -> None:
    """Run a Heartbeat; print {"beats"} once it has beaten 3 times; block until killed."""
    hb = Heartbeat(args.db, args.agent, args.interval, status=args.status, task=args.task,
                   progress=args.progress).start()
    wait_for_beats(hb, 3)
    say(json.dumps({"beats": hb.beats}))
    block_until_killed()


def busy_beat(args: argparse.Namespace) -> None:
    """Beat from a thread while the main thread spins on the CPU for `seconds`.

    Prints "beating" after the first beat, then {"beats", "spins"} when the
    busy loop is over, then stops the Heartbeat and exits.
    """
    with Heartbeat(args.db, args.agent, args.interval, status="working") as hb:
        wait_for_beats(hb, 1)
        say("beating")
        end = time.monotonic() + args.seconds
        spins = 0
        while time.monotonic() < end:  # pure-Python work: holds the GIL between switches
            sum(n * n for n in range(200))
            spins += 1
        say(json.dumps({"beats": hb.beats, "spins": spins}))


# --- command line -------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="procs_coordination")
    roles = parser.add_subparsers(dest="role", required=True)

    p = roles.add_parser("race")
    p.add_argument("db")
    p.add_argument("--agent", required=True)
    p.add_argument("--tasks", type=int, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--max-rounds", type=int, default=1_000_000)
    p.add_argument("--lease-min", type=int, required=True)
    p.add_argument("--lease-max", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--go-fd", type=int)
    p.set_defaults(func=race)

    p = roles.add_parser("claim-all")
    p.add_argument("db")
    p.add_argument("--agent", required=True)
    p.add_argument("--tasks", required=True, help="comma-separated task ids")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--go-fd", type=int)
    p.set_defaults(func=claim_all)

    p = roles.add_parser("hold")
    p.add_argument("db")
    p.add_argument("--agent", required=True)
    p.add_argument("--task", required=True)
    p.add_argument("--lease-ms", type=int, required=True)
    p.add_argument("--heartbeat-interval", type=float)
    p.set_defaults(func=hold)

    p = roles.add_parser("beat")
    p.add_argument("db")
    p.add_argument("--agent", required=True)
    p.add_argument("--interval", type=float, required=True)
    p.add_argument("--status", default="idle")
    p.add_argument("--task")
    p.add_argument("--progress", type=float)
    p.set_defaults(func=beat)

    p = roles.add_parser("busy-beat")
    p.add_argument("db")
    p.add_argument("--agent", required=True)
    p.add_argument("--interval", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.set_defaults(func=busy_beat)

    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.func(args)
    except BaseException:
        sys.stderr.write(f"procs_coordination {args.role}: unexpected exception\n")
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0


# --- parent side ----------------------------------------------------------------

PROGRAM = Path(__file__).resolve()


class Child(children.Child):
    """A child running `program` (default: this file)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], stderr_path: Path,
                 pass_fds: tuple[int, ...] = (), program: Path = PROGRAM) -> None:
        super().__init__(name, program, argv, env, stderr_path, pass_fds)


Barrier = children.Barrier


class Children(children.Children):
    """Children running this file unless `start` names another program."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        super().__init__(env, logs, PROGRAM)


if __name__ == "__main__":
    sys.exit(main())
