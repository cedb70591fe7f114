"""The task graph: `task ready` over a large graph, and `claim-next` against claim + release.

1. ready: 100,000 tasks, about 3 dependencies each, 10% ready (and a few of
   those held by live leases). `bus.tasks.ready()` (every ready task, as Task
   objects) against the baseline: one plain SELECT of exactly those rows by
   primary key, joined from a table of their seqs, as raw tuples.
   Target: ready at most 3x the baseline.
2. claim-next: `bus.tasks.claim_next` + `bus.claims.release`, and `bus.tasks.claim_next` +
   `bus.tasks.complete` (an agent's real cycle: take, finish, take the next),
   against `bus.claims.claim` + `bus.claims.release` of a named task, on the same graph.
   Target: at least 0.5x the baseline's rate.

Everything is measured in this one run, alternating the cases, the best of
--rounds kept for each: these machines are shared and noisy, so only the
ratios mean anything.

    python scripts/bench_tasks.py [--tasks 100000] [--cycles 2000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

from bus import Bus
from bus.coordination import tasks
from bus.storage.db import write_transaction

READY_TARGET = 3.0  # ready's time / the baseline's, at most
CLAIM_TARGET = 0.5  # claim-next's rate / claim + release's, at least
DONE_SHARE = 0.03  # of the tasks: done foundations that ready tasks depend on
READY_SHARE = 0.10
HELD = 16  # ready tasks under a live lease, as with 16 agents at work
_BASELINE_SQL = (
    "SELECT t.seq, t.task_id, t.title, t.priority, t.state, t.waiting_on, t.created_at_ms,"
    " t.finished_at_ms, t.finished_by FROM temp.ready_seqs r JOIN tasks t ON t.seq = r.seq"
    " ORDER BY r.rank"
)


def build_graph(bus: Bus, count: int, seed: int = 7) -> None:
    """`count` tasks: 3% done, 10% waiting only on done ones (ready), the rest on open ones.

    Built with bus/coordination/tasks.py's own functions in one transaction (a setup, not
    what is measured), so the counters are what `add_task` would leave.
    """
    rng = random.Random(seed)
    done_count, ready_count = int(count * DONE_SHARE), int(count * READY_SHARE)
    at = 1_700_000_000_000
    conn = bus.conn
    with write_transaction(conn):
        made: list[tasks.Task] = []
        for n in range(count):
            task = tasks.insert(conn, f"task-{n:06d}", f"Task number {n}", rng.randint(0, 4), at)
            if n < done_count:
                pool = range(0)
            elif n < done_count + ready_count:
                pool = range(done_count)
            else:
                pool = range(done_count, n)
            for index in rng.sample(pool, min(3, len(pool))):  # a range: no copy
                tasks.add_dependency(conn, task, made[index])
            if n < done_count:
                task, _ = tasks.finish(conn, task, tasks.DONE, "setup", at)
            made.append(task)
    for claimed in range(HELD):
        bus.tasks.claim_next(f"agent-{claimed}", 3_600_000)


def best_of(rounds: int, cases: dict[str, Callable[[], float]]) -> dict[str, float]:
    """Each case's smallest time over `rounds`, the cases alternating within each round."""
    best = {name: float("inf") for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            best[name] = min(best[name], case())
    return best


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def ready_cases(bus: Bus) -> dict[str, Callable[[], float]]:
    ready = bus.tasks.ready()
    conn = bus.conn
    conn.execute("CREATE TEMP TABLE ready_seqs (rank INTEGER PRIMARY KEY, seq INTEGER)")
    conn.executemany("INSERT INTO temp.ready_seqs (seq) VALUES (?)", [(t.seq,) for t in ready])
    baseline = conn.execute(_BASELINE_SQL).fetchall()
    assert [row[0] for row in baseline] == [t.seq for t in ready]
    return {"baseline: SELECT the ready rows by primary key":
            lambda: timed(lambda: conn.execute(_BASELINE_SQL).fetchall()),
            "bus.tasks.ready()": lambda: timed(bus.tasks.ready)}


def claim_cases(bus: Bus, cycles: int) -> dict[str, Callable[[], float]]:
    names = iter(t.task_id for t in bus.tasks.ready())

    def claim_release() -> float:
        task = next(names)
        return timed(lambda: [bus.claims.claim(task, "bench") and bus.claims.release(task, "bench")
                              for _ in range(cycles)])

    def next_release() -> float:
        def cycle() -> None:
            claimed = bus.tasks.claim_next("bench")
            bus.claims.release(claimed.task.task_id, "bench")
        return timed(lambda: [cycle() for _ in range(cycles)])

    def next_done() -> float:
        def cycle() -> None:
            claimed = bus.tasks.claim_next("bench")
            bus.tasks.complete(claimed.task.task_id, "bench")
        return timed(lambda: [cycle() for _ in range(cycles)])

    return {"baseline: claim + release": claim_release,
            "claim_next + release": next_release,
            "claim_next + complete_task": next_done}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-tasks-"))
    try:
        with Bus.open(workdir / "bus.db") as bus:
            started = time.perf_counter()
            build_graph(bus, args.tasks)
            counts = bus.tasks.counts()
            print(f"graph: {args.tasks} tasks, {counts.ready} ready, {counts.held} held,"
                  f" {counts.blocked} blocked, {counts.done} done"
                  f" (built in {time.perf_counter() - started:.1f} s)")
            ready = best_of(args.rounds, ready_cases(bus))
            report(ready, "baseline: SELECT the ready rows by primary key", "time", READY_TARGET)
            rates = {name: args.cycles / seconds
                     for name, seconds in best_of(args.rounds, claim_cases(bus, args.cycles)).items()}
            report(rates, "baseline: claim + release", "rate", CLAIM_TARGET)
    finally:
        shutil.rmtree(workdir)


def report(figures: dict[str, float], baseline: str, kind: str, target: float) -> None:
    base = figures[baseline]
    for name, value in figures.items():
        shown = f"{value * 1000:9.2f} ms" if kind == "time" else f"{value:9.0f} /s"
        if name == baseline:
            print(f"  {name:52s} {shown}")
            continue
        ratio = value / base
        ok = ratio <= target if kind == "time" else ratio >= target
        bound = "at most" if kind == "time" else "at least"
        print(f"  {name:52s} {shown}  {ratio:5.2f}x the baseline's {kind}"
              f" ({bound} {target}x: {'ok' if ok else 'MISSED'})")


if __name__ == "__main__":
    main()
