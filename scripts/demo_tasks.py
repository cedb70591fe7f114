"""The small real tasks the demo's workers run, one per `worker run` process.

Each task computes something, writes it into the worker's worktree (the
current directory), commits it on the worker's branch and exits 0. `--slow`
makes a task take a few seconds, so the demo can kill its worker mid-task.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def primes(limit: int = 20_000) -> str:
    sieve = bytearray([1]) * limit
    sieve[:2] = b"\x00\x00"
    for n in range(2, int(limit ** 0.5) + 1):
        if sieve[n]:
            sieve[n * n::n] = bytearray(len(sieve[n * n::n]))
    return " ".join(str(n) for n, is_prime in enumerate(sieve) if is_prime) + "\n"


def fibonacci(count: int) -> str:
    a, b, out = 0, 1, []
    for _ in range(count):
        out.append(a)
        a, b = b, a + b
    return "\n".join(map(str, out)) + "\n"


def word_count() -> str:
    text = Path("README.md").read_text()
    counts: dict[str, int] = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    top = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:10]
    return "".join(f"{count} {word}\n" for word, count in top)


TASKS = {"primes": ("primes.txt", primes), "fibonacci": ("fibonacci.txt", fibonacci),
         "wordcount": ("wordcount.txt", word_count)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--slow", type=float, default=0.0, help="seconds of extra 'thinking'")
    parser.add_argument("--count", type=int, default=60, help="how many Fibonacci numbers")
    args = parser.parse_args(argv)
    filename, compute = TASKS[args.task]
    time.sleep(args.slow)  # stands in for an LLM call: the worker's heartbeat thread goes on
    Path(filename).write_text(compute(args.count) if args.task == "fibonacci" else compute())
    subprocess.run(["git", "add", filename], check=True)
    subprocess.run(["git", "commit", "-q", "-m", f"{args.task}: write {filename}"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
