"""The message engine (bus.channels) against hand-written baselines in the same run.

- send on a direct channel, and fan-out to 10 and 100 subscribers of a
  pubsub channel: against raw apsw writing the same rows (the `messages`
  row, the `channel_messages` row, one `deliveries` row per recipient) in
  one BEGIN IMMEDIATE transaction per message, on the same schema;
- receive + acknowledge one message at a time: against raw apsw running the
  same index lookup and updates in two transactions;
- topic matching against 10,000 subscriptions: the tiered TopicIndex
  against the plain loop over every pattern with the seed's algorithm.

    python scripts/bench_channels.py [--rounds 3] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Callable

import apsw

from bus import Bus
from bus.channels.engine import StoreLimits
from bus.channels.topics import TopicIndex
from bus.channels.topics import matches
from bus.storage.db import connect

_INSERT_MESSAGE = (
    "INSERT INTO messages (id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to,"
    " payload, payload_ref) VALUES (?, ?, ?, ?, 'text', NULL, NULL, ?, NULL) RETURNING seq"
)
_INSERT_CHANNEL_MESSAGE = (
    "INSERT INTO channel_messages (seq, channel_id, sender, type, ts_ms, topic, priority)"
    " VALUES (?, ?, ?, 'text', ?, ?, 2)"
)
_INSERT_DELIVERY = (
    "INSERT INTO deliveries (seq, recipient, channel_id, status, visible_at_ms)"
    " VALUES (?, ?, ?, 'pending', ?)"
)
_NEXT_PENDING = (
    "SELECT seq FROM deliveries WHERE recipient = ? AND status = 'pending' AND visible_at_ms <= ?"
    " ORDER BY seq LIMIT 1"
)
_HAND_OUT = (
    "UPDATE deliveries SET status = 'delivered', attempts = attempts + 1, delivered_at_ms = ?,"
    " deadline_ms = ? WHERE seq = ? AND recipient = ?"
)
_COMPLETE = (
    "UPDATE deliveries SET status = 'completed', acked_at_ms = ?, deadline_ms = NULL"
    " WHERE seq = ? AND recipient = ?"
)
SEGMENTS = ["build", "deploy", "test", "web", "api", "db", "ok", "fail", "eu", "us"]


def _setup(path: Path, kind: str, subscribers: int) -> Bus:
    bus = Bus.open(path)
    ch = bus.channels
    if kind == "direct":
        ch.create_channel("c", "direct", "sender")
        ch.join_channel("c", "r0")
    else:
        ch.create_channel("c", "pubsub", "sender")
        for n in range(subscribers):
            ch.subscribe("c", f"r{n}", "build.#")
    return bus


def _raw_send(path: Path, count: int, recipients: list[str]) -> float:
    conn = connect(str(path), "normal")
    start = time.perf_counter()
    for n in range(count):
        conn.execute("BEGIN IMMEDIATE")
        now = int(time.time() * 1000)
        seq = conn.execute(_INSERT_MESSAGE, (str(uuid.uuid4()), now, "sender", "#c",
                                             f'"event {n}"')).get
        conn.execute(_INSERT_CHANNEL_MESSAGE, (seq, 1, "sender", now, "build.web.ok"))
        conn.executemany(_INSERT_DELIVERY, [(seq, r, 1, now) for r in recipients])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def _bus_send(bus: Bus, count: int, kind: str) -> float:
    ch = bus.channels
    start = time.perf_counter()
    for n in range(count):
        if kind == "direct":
            ch.send_message("c", "sender", "text", f"event {n}")
        else:
            ch.publish("c", "sender", "build.web.ok", f"event {n}")
    return time.perf_counter() - start


def send_row(workdir: Path, rounds: int, count: int, subscribers: int, kind: str) -> dict:
    """Messages/s and deliveries/s, agentbus vs raw apsw, best of `rounds`."""
    recipients = [f"r{n}" for n in range(subscribers)]
    best_raw = best_bus = float("inf")
    for _ in range(rounds):
        raw_path = workdir / f"raw-{uuid.uuid4().hex}.db"
        _setup(raw_path, kind, subscribers).close()
        best_raw = min(best_raw, _raw_send(raw_path, count, recipients))
        bus = _setup(workdir / f"bus-{uuid.uuid4().hex}.db", kind, subscribers)
        try:
            best_bus = min(best_bus, _bus_send(bus, count, kind))
        finally:
            bus.close()
    name = "send, direct channel" if kind == "direct" else f"fan-out to {subscribers}"
    return {"case": name, "messages": count, "deliveries": count * subscribers,
            "raw_per_s": round(count * subscribers / best_raw),
            "agentbus_per_s": round(count * subscribers / best_bus),
            "ratio": round(best_raw / best_bus, 3), "unit": "deliveries/s"}


def receive_ack_row(workdir: Path, rounds: int, count: int) -> dict:
    best_raw = best_bus = float("inf")
    for _ in range(rounds):
        raw = _setup(workdir / f"raw-{uuid.uuid4().hex}.db", "direct", 1)
        _bus_send(raw, count, "direct")
        raw.close()
        conn = connect(raw.path, "normal")
        best_raw = min(best_raw, _raw_receive_ack(conn, count))
        conn.close()
        bus = _setup(workdir / f"bus-{uuid.uuid4().hex}.db", "direct", 1)
        _bus_send(bus, count, "direct")
        try:
            best_bus = min(best_bus, _bus_receive_ack(bus, count))
        finally:
            bus.close()
    return {"case": "receive+acknowledge", "messages": count, "raw_per_s": round(count / best_raw),
            "agentbus_per_s": round(count / best_bus), "ratio": round(best_raw / best_bus, 3),
            "unit": "messages/s"}


def _raw_receive_ack(conn: apsw.Connection, count: int) -> float:
    start = time.perf_counter()
    for _ in range(count):
        conn.execute("BEGIN IMMEDIATE")
        now = int(time.time() * 1000)
        seq = conn.execute(_NEXT_PENDING, ("r0", now)).get
        conn.execute(_HAND_OUT, (now, now + 30_000, seq, "r0"))
        conn.execute("COMMIT")
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_COMPLETE, (int(time.time() * 1000), seq, "r0"))
        conn.execute("COMMIT")
    return time.perf_counter() - start


def _bus_receive_ack(bus: Bus, count: int) -> float:
    ch = bus.channels
    start = time.perf_counter()
    for _ in range(count):
        [message] = ch.receive_messages("r0", {"limit": 1})
        ch.acknowledge_message(message, "r0", "completed")
    return time.perf_counter() - start


def backlog_row(workdir: Path, backlog: int, probes: int = 1000) -> dict:
    """receive+acknowledge with `backlog` messages waiting behind the probes."""
    rates = {}
    for waiting in (100, backlog):
        bus = _setup(workdir / f"backlog-{waiting}.db", "direct", 1)
        bus.channels.limits = StoreLimits(max_active=waiting + probes)
        try:
            with bus.channels.batch():  # the prefill is one commit
                _bus_send(bus, waiting + probes, "direct")
            rates[waiting] = probes / _bus_receive_ack(bus, probes)
        finally:
            bus.close()
    return {"case": f"receive+ack, {backlog:,} vs 100 waiting", "messages": probes,
            "raw_per_s": round(rates[100]), "agentbus_per_s": round(rates[backlog]),
            "ratio": round(rates[backlog] / rates[100], 3), "unit": "messages/s (1.0 = flat)"}


def random_pattern(rng: random.Random) -> str:
    length = rng.randint(1, 4)
    segments = [rng.choice(SEGMENTS + ["*"]) if rng.random() < 0.8 else "*"
                for _ in range(length)]
    if rng.random() < 0.2:
        segments.append("#")
    return ".".join(segments)


def matching_row(subscriptions: int = 10_000, topics: int = 2000, seed: int = 3) -> dict:
    rng = random.Random(seed)
    subs = [(random_pattern(rng), f"agent-{n}") for n in range(subscriptions)]
    probe = [".".join(rng.choice(SEGMENTS) for _ in range(rng.randint(1, 4)))
             for _ in range(topics)]
    index = TopicIndex(subs)
    baseline_probe = probe[: max(20, topics // 20)]  # the plain loop is slow: fewer topics

    def plain(topic: str) -> set[str]:
        return {agent for pattern, agent in subs if matches(topic, pattern)}

    for topic in baseline_probe:  # the two must agree before their speed means anything
        assert index.match(topic) == plain(topic), topic
    plain_rate = _rate(plain, baseline_probe)
    index_rate = _rate(index.match, probe)
    return {"case": f"match against {subscriptions:,} subscriptions", "messages": topics,
            "raw_per_s": round(plain_rate), "agentbus_per_s": round(index_rate),
            "ratio": round(index_rate / plain_rate, 1), "unit": "matches/s"}


def _rate(match: Callable[[str], set[str]], probe: list[str]) -> float:
    start = time.perf_counter()
    for topic in probe:
        match(topic)
    return len(probe) / (time.perf_counter() - start)


def channel_rows(workdir: Path, rounds: int = 3, scale: float = 1.0) -> list[dict]:
    n = max(100, int(2000 * scale))
    return [
        send_row(workdir, rounds, n, 1, "direct"),
        send_row(workdir, rounds, n, 10, "pubsub"),
        send_row(workdir, rounds, max(50, n // 4), 100, "pubsub"),
        receive_ack_row(workdir, rounds, n),
        backlog_row(workdir, max(1000, int(100_000 * scale))),
        matching_row(),
    ]


def print_rows(rows: list[dict]) -> None:
    print(f"{'channels':34} {'n':>6} {'baseline':>11} {'agentbus':>11} {'ratio':>7}  unit")
    for r in rows:
        print(f"{r['case']:34} {r['messages']:>6} {r['raw_per_s']:>11} {r['agentbus_per_s']:>11}"
              f" {r['ratio']:>7}  {r['unit']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="agentbus-bench-channels-"))
    try:
        print_rows(channel_rows(workdir, args.rounds, args.scale))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
