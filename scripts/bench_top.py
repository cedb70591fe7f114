"""How soon `bus top`'s message stream shows a publish, against `bus tail --follow`
(the same commit wake-up, printing one line) in the same run.

Both run in one tmux server (as a person's terminal), on the same file; each
round publishes one message with a type of its own, then reads both panes
until each shows it. The figures are seconds from the publish returning to
the line being on the screen, as tmux sees it (capture-pane every few ms,
which adds its own few ms to both). Target: top within 1 s; the ratio to
tail says what top's reading and drawing add to the wake-up itself.

    python scripts/bench_top.py [--rounds 20] [--size 160x48]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bus import Bus

TARGET_S = 1.0
TIMEOUT_S = 30.0
POLL_S = 0.005
PAUSE_S = 0.5  # between rounds, so each publish is a wake-up of its own


class Panes:
    """A tmux server of its own with one window per command."""

    def __init__(self) -> None:
        self.base = ["tmux", "-L", f"bench-top-{os.getpid()}", "-f", "/dev/null"]

    def start(self, name: str, command: str, size: str) -> None:
        width, height = size.split("x")
        verb = "new-window" if name != "top" else "new-session"
        args = ["-d", "-n", name] + (["-s", "bench", "-x", width, "-y", height]
                                     if verb == "new-session" else ["-t", "bench"])
        subprocess.run([*self.base, verb, *args, command], check=True)

    def screen(self, name: str) -> str:
        return subprocess.run([*self.base, "capture-pane", "-p", "-t", f"bench:{name}"],
                              capture_output=True, text=True, check=True).stdout

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True)


def wait_for(panes: Panes, names: list[str], text: str, since: float) -> dict[str, float]:
    """Seconds from `since` until each pane shows `text`."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + TIMEOUT_S
    while len(seen) < len(names):
        assert time.monotonic() < deadline, f"never saw {text!r} in {set(names) - set(seen)}"
        for name in names:
            if name not in seen and text in panes.screen(name):
                seen[name] = time.perf_counter() - since
        time.sleep(POLL_S)
    return seen


def run(rounds: int, size: str) -> dict[str, list[float]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-top-"))
    db = workdir / "bus.db"
    Bus.open(db).close()
    bus_cmd = f"{sys.executable} -m bus.cli --db {db}"
    panes = Panes()
    delays: dict[str, list[float]] = {"top": [], "tail": []}
    try:
        panes.start("top", f"{bus_cmd} top", size)
        panes.start("tail", f"{bus_cmd} tail --follow", size)
        with Bus.open(db) as bus:
            bus.publish("bench", "warm-up")
            wait_for(panes, ["top", "tail"], "warm-up", time.perf_counter())
            for i in range(rounds):
                time.sleep(PAUSE_S)
                bus.publish("bench", f"p{i}-probe")
                for name, s in wait_for(panes, ["top", "tail"], f"p{i}-probe",
                                        time.perf_counter()).items():
                    delays[name].append(s)
    finally:
        panes.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return delays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--size", default="160x48", help="the terminal, WIDTHxHEIGHT")
    args = parser.parse_args()
    delays = run(args.rounds, args.size)
    for name, found in delays.items():
        print(f"{name:5} median {statistics.median(found):.3f} s  max {max(found):.3f} s"
              f"  within {TARGET_S:g} s: {sum(s <= TARGET_S for s in found)}/{len(found)}")
    ratio = statistics.median(delays["top"]) / statistics.median(delays["tail"])
    print(f"top / tail (median): {ratio:.2f}x  (load: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
