"""Child-process programs for tests/replication/test_replica_litestream.py and the benchmark.

`python tests/support/procs_replica.py consume DB AGENT`: poll and ack forever,
printing "<seq>" after each ack committed (the parent kills it with -9).
`python tests/support/procs_replica.py publish DB SENDER`: publish forever, printing
"<seq> <ts_ms>" after each publish returned.
"""

from __future__ import annotations

import sys
import time

from bus import Bus


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def consume(db: str, agent: str) -> None:
    bus = Bus.open(db)
    while True:
        batch = bus.poll(agent, limit=50, wait=1.0)
        if batch:
            say(str(bus.ack(agent, batch[-1].seq)))


def publish(db: str, sender: str) -> None:
    bus = Bus.open(db)
    n = 0
    while True:
        result = bus.publish(sender, "load", {"n": n, "pad": "x" * (n % 200)})
        say(f"{result.seq} {int(time.time() * 1000)}")
        n += 1


if __name__ == "__main__":
    {"consume": consume, "publish": publish}[sys.argv[1]](*sys.argv[2:])
