"""Checking changed paths against file reservations: the prefix index against a plain loop.

1,000 changed paths are checked against 10,000 exclusive reservations, the
way the pre-commit hook and `worker done` check a change. The baseline, in the
same process, is what one would write first: every path against every
pattern with `fnmatch.fnmatchcase` in a loop. The bus files each glob under its
literal leading directories (bus/coordination/globs.py, GlobIndex), so a path is tested
only against the globs whose prefix it starts with.

Cases, each timed as the best of --repeat runs:
- `held_paths`, cold: the index built and every pattern parsed (caches cleared);
- `held_paths`, warm: the parse cache as a long-lived process has it;
- `bus.reservations.check_paths`: the same through the bus file (the reservations read with
  their holders' liveness in one query, then the index).
The index's answer is checked against our own matcher looped over every
pattern, for the first 100 paths.

    python scripts/bench_reservations.py [--paths 1000] [--reservations 10000]
"""

from __future__ import annotations

import argparse
import fnmatch
import random
import tempfile
import time
from pathlib import Path
from typing import Callable

from bus import Bus
from bus.coordination import globs
from bus.coordination.reservations import Reservation
from bus.coordination.reservations import held_paths

TARGET_RATIO = 10.0
AGENTS = 50
_INSERT_SQL = ("INSERT INTO file_reservations (agent_id, pattern, mode, reason, created_at_ms,"
               " expires_at_ms) VALUES (?, ?, 'exclusive', NULL, ?, ?)")


def make_patterns(count: int, rng: random.Random) -> list[str]:
    """A repository's worth of reservations: mostly directories and files under src/,
    some wildcards, 1% unanchored patterns that can match at any depth."""
    found: set[str] = set()
    while len(found) < count:
        pkg, mod, n = rng.randrange(200), rng.randrange(40), rng.randrange(30)
        kind = rng.random()
        if kind < 0.55:
            found.add(f"src/pkg{pkg}/mod{mod}/**")
        elif kind < 0.90:
            found.add(f"src/pkg{pkg}/mod{mod}/file{n}.py")
        elif kind < 0.99:
            found.add(rng.choice([f"src/pkg{pkg}/*.py", f"tests/pkg{pkg}/test_*.py",
                                  f"docs/pkg{pkg}/**"]))
        else:
            found.add(f"*.gen{n}")
    return sorted(found)


def make_paths(count: int, rng: random.Random) -> list[str]:
    found: set[str] = set()
    while len(found) < count:
        pkg, mod, n = rng.randrange(200), rng.randrange(40), rng.randrange(30)
        found.add(rng.choice([f"src/pkg{pkg}/mod{mod}/file{n}.py", f"src/pkg{pkg}/mod{mod}.py",
                              f"tests/pkg{pkg}/test_mod{mod}.py", f"docs/pkg{pkg}/mod{mod}.md"]))
    return sorted(found)


def best_of(repeat: int, run: Callable[[], object], before: Callable[[], None] = lambda: None
            ) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        before()
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return min(times), result


def fnmatch_loop(paths: list[str], patterns: list[str]) -> int:
    hits = 0
    for path in paths:
        for pattern in patterns:
            if fnmatch.fnmatchcase(path, pattern):
                hits += 1
    return hits


def own_matcher_loop(paths: list[str], reservations: list[Reservation]) -> int:
    return sum(1 for path in paths for r in reservations if r.glob.matches(path))


def clear_caches() -> None:
    globs._parse_cached.cache_clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=1000)
    parser.add_argument("--reservations", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = random.Random(29)
    patterns, paths = make_patterns(args.reservations, rng), make_paths(args.paths, rng)
    now = int(time.time() * 1000)
    reservations = [Reservation(n, f"agent-{n % AGENTS}", p, "exclusive", None, now,
                                now + 3600_000) for n, p in enumerate(patterns)]

    baseline, fn_hits = best_of(1, lambda: fnmatch_loop(paths, patterns))
    cold, held = best_of(args.repeat, lambda: held_paths(reservations, "me", paths),
                         clear_caches)
    warm, _ = best_of(args.repeat, lambda: held_paths(reservations, "me", paths))
    sample = paths[:100]  # the index finds what a loop over every pattern finds
    assert len(held_paths(reservations, "me", sample)) == own_matcher_loop(sample, reservations)

    with tempfile.TemporaryDirectory() as scratch:
        with Bus.open(Path(scratch) / "bench.db") as bus:
            with bus.conn:
                bus.conn.executemany(_INSERT_SQL, [(r.agent, r.pattern, now, now + 3600_000)
                                                   for r in reservations])
            via_bus, found = best_of(args.repeat, lambda: bus.reservations.check_paths("me", paths))
            assert len(found) == len(held)

    print(f"{len(paths)} changed paths against {len(patterns)} exclusive reservations"
          f" ({len(held)} path-holder pairs held; fnmatch, whose * crosses /, finds {fn_hits})")
    rows = [("fnmatch loop, every path x every pattern (baseline)", baseline),
            ("held_paths with the prefix index, cold caches", cold),
            ("held_paths with the prefix index, warm parse cache", warm),
            ("bus.reservations.check_paths (SQL read + index)", via_bus)]
    for name, seconds in rows:
        print(f"  {name:<52} {seconds * 1000:9.1f} ms   x{baseline / seconds:8.1f}")
    worst = baseline / max(cold, via_bus)
    verdict = "meets" if worst >= TARGET_RATIO else "MISSES"
    print(f"slowest indexed case is {worst:.1f}x faster than the fnmatch loop; {verdict} the"
          f" target of {TARGET_RATIO:g}x")


if __name__ == "__main__":
    main()
