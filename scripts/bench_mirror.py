"""The cost of going beyond one host: the NATS mirror's pace and lag, Litestream's cost.

Each figure is a ratio against a baseline taken in the same run:
- mirror throughput: `JetStreamMirror` publishing a log of --count messages
  to a local nats-server (-js), against the bus's own publish rate (one
  message per call, one process) for the same messages (target >= 0.5);
- mirror lag p50: a paced publisher (one message every 5 ms) while the
  mirror runs; the time from a message's commit (its ts_ms) to its arrival
  at a NATS subscriber of bus.> (target <= 50 ms);
- replication's cost: the publish rate into a bus that `litestream
  replicate` is replicating (to a file:// replica, sync 1s), against the same
  into a bus without it, in alternating turns of 250 (target >= 0.90).

    python scripts/bench_mirror.py [--count 5000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import nats
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bus import Bus  # noqa: E402
from bus.mirror.jetstream import JetStreamMirror  # noqa: E402
from bus.replica.config import replica_config  # noqa: E402
from bus.replica.config import write_config  # noqa: E402
from bus.replica.position import replica_position  # noqa: E402
from bus.replica.process import replicate_argv  # noqa: E402
from scripts.bench_publish import publish_one_per_txn  # noqa: E402
from tests.support.nats_servers import NatsServer  # noqa: E402

THROUGHPUT_TARGET = 0.5
LAG_P50_TARGET_MS = 50.0
REPLICATION_TARGET = 0.90
PACE_S = 0.005
LAG_MESSAGES = 400


def publish_rate(db: Path, count: int) -> float:
    """Messages per second, one publish call (one transaction) each, as bench_publish.py."""
    with Bus.open(db, create=True) as bus:
        return publish_one_per_txn(bus, count)


def mirror_rate(db: Path, url: str, count: int) -> float:
    async def run() -> float:
        with Bus.open(db) as bus:
            async with JetStreamMirror(bus, url, "BENCH") as mirror:
                start = time.perf_counter()
                progress = await mirror.run(until_caught_up=True)
                assert progress.published == count, progress
                return count / (time.perf_counter() - start)
    return asyncio.run(run())


def mirror_lag_ms(db: Path, url: str) -> list[float]:
    """Commit-to-subscriber delay of paced messages while the mirror runs."""
    lags: list[float] = []
    ready, done = threading.Event(), threading.Event()

    async def run() -> None:
        nc = await nats.connect(url)

        async def arrived(msg) -> None:
            body = orjson.loads(msg.data)
            if body["type"] == "paced":
                lags.append(time.time() * 1000 - body["ts_ms"])
        await nc.subscribe("bus.>", cb=arrived)
        with Bus.open(db) as bus:
            async with JetStreamMirror(bus, url, "LAG") as mirror:
                task = asyncio.create_task(mirror.run())
                ready.set()
                while not done.is_set() or len(lags) < LAG_MESSAGES:
                    await asyncio.sleep(0.05)
                    if done.is_set() and mirror.progress.position >= bus.last_seq():
                        break
                mirror.stop()
                await task
        await nc.close()

    thread = threading.Thread(target=lambda: asyncio.run(run()))
    thread.start()
    if not ready.wait(60):
        raise SystemExit("the mirror did not start (see the traceback above)")
    with Bus.open(db) as bus:
        for n in range(LAG_MESSAGES):
            bus.publish("bench", "paced", {"n": n})
            time.sleep(PACE_S)  # a benchmark's pace, not a test's wait
    done.set()
    thread.join(120)
    return lags


def replication_rates(tmp: Path, count: int, turn: int = 250) -> tuple[float, float]:
    """(publish rate without, with Litestream) over `count` messages each.

    The two buses take turns of `turn` messages, the first of each pair
    alternating, and each side's time is the sum of its turns: a busy moment
    of the machine falls on both alike, which medians of a few long runs did
    not give (they swung 0.75x-1.11x). Litestream runs throughout and watches
    only the replicated bus.
    """
    plain, replicated = tmp / "plain" / "bus.db", tmp / "replicated" / "bus.db"
    Bus.open(plain, create=True).close()
    Bus.open(replicated, create=True).close()
    write_config(replica_config(replicated, (replicated.parent / "replica").as_uri(), "1s"))
    litestream = subprocess.Popen(replicate_argv(replicated), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (replica_position(replicated) or None) or \
                not replica_position(replicated).replica_txid:
            if time.monotonic() > deadline:
                raise SystemExit("litestream made no snapshot in 60 s")
            time.sleep(0.05)
        spent = {plain: 0.0, replicated: 0.0}
        with Bus.open(plain) as plain_bus, Bus.open(replicated) as replicated_bus:
            pair = [(plain, plain_bus), (replicated, replicated_bus)]
            for number in range(max(1, count // turn)):
                for path, bus in pair if number % 2 == 0 else reversed(pair):
                    spent[path] += turn / publish_one_per_txn(bus, turn)
        done = max(1, count // turn) * turn
        return done / spent[plain], done / spent[replicated]
    finally:
        litestream.terminate()
        litestream.wait(30)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=5000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with NatsServer(tmp / "nats") as server:
            bus_rate = publish_rate(tmp / "log" / "bus.db", args.count)
            mirrored = mirror_rate(tmp / "log" / "bus.db", server.url, args.count)
        with NatsServer(tmp / "nats-lag") as server:  # a stream of its own captures bus.>
            Bus.open(tmp / "lag" / "bus.db", create=True).close()
            lags = mirror_lag_ms(tmp / "lag" / "bus.db", server.url)
        plain, replicated = replication_rates(tmp, args.count)
    figures = {
        "bus_publish_per_s": round(bus_rate), "mirror_per_s": round(mirrored),
        "mirror_throughput_ratio": round(mirrored / bus_rate, 2),
        "mirror_lag_p50_ms": round(statistics.median(lags), 2),
        "mirror_lag_p99_ms": round(sorted(lags)[int(len(lags) * 0.99) - 1], 2),
        "publish_plain_per_s": round(plain), "publish_replicated_per_s": round(replicated),
        "replication_ratio": round(replicated / plain, 2),
    }
    if args.json:
        print(orjson.dumps(figures).decode())
        return 0
    print(f"mirror throughput: {figures['mirror_per_s']}/s vs bus publish"
          f" {figures['bus_publish_per_s']}/s = {figures['mirror_throughput_ratio']}x"
          f" (target >= {THROUGHPUT_TARGET})")
    print(f"mirror lag: p50 {figures['mirror_lag_p50_ms']} ms, p99"
          f" {figures['mirror_lag_p99_ms']} ms (target p50 <= {LAG_P50_TARGET_MS} ms)")
    print(f"publish with Litestream: {figures['publish_replicated_per_s']}/s vs without"
          f" {figures['publish_plain_per_s']}/s = {figures['replication_ratio']}x"
          f" (target >= {REPLICATION_TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
