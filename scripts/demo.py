"""A short scripted session on a fresh bus file: publish, poll, ack, claims, heartbeats.

Run with `make demo`. The bus file is kept in demo/ so you can look at it
afterwards with `bus --db demo/bus.db tail` or `bus --db demo/bus.db sql ...`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from bus import Bus
from bus.cli import format_message
from bus.heartbeats import Heartbeat

DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"


def main() -> None:
    shutil.rmtree(DEMO_DIR, ignore_errors=True)
    db_path = DEMO_DIR / "bus.db"
    with Bus.open(db_path) as bus:
        print(f"== a fresh bus at {db_path}")
        assign(bus)
        work(bus, "worker-1")
        work(bus, "worker-2")
        redeliver(bus)
        coordinate(bus, db_path)
        print("\n== the whole log (what `bus tail` shows)")
        for message in bus.list_messages(0, 100):
            print("  " + format_message(message))
        print("\n== cursors (what `bus status` shows)")
        for cursor in bus.list_cursors():
            print(f"  {cursor.agent}: acked up to seq {cursor.last_acked_seq}, {cursor.pending} waiting")
    print(f"\nInspect it yourself: bus --db {db_path} status")


def assign(bus: Bus) -> None:
    print("\n== planner assigns two tasks and broadcasts a notice")
    results = bus.publish_many([
        {"from_agent": "planner", "type": "task_assign", "to": "worker-1",
         "payload": {"task": "parse-logs"}, "correlation_id": "parse-logs"},
        {"from_agent": "planner", "type": "task_assign", "to": "worker-2",
         "payload": {"task": "write-report"}, "correlation_id": "write-report"},
        {"from_agent": "planner", "type": "agent_started", "payload": {"note": "sprint 1"}},
    ])
    for r in results:
        print(f"  published seq {r.seq} ({r.durable})")
    retry = bus.publish("planner", "task_assign", {"task": "parse-logs"}, to="worker-1",
                        id=results[0].id)
    print(f"  retrying seq {results[0].seq} with its id: duplicate={retry.duplicate}, seq={retry.seq}")


def work(bus: Bus, agent: str) -> None:
    print(f"\n== {agent} polls, handles, acks, and reports back")
    for message in bus.poll(agent):
        print(f"  {agent} got #{message.seq} {message.type} {message.payload}")
        if message.type == "task_assign":
            bus.publish(agent, "task_done", {"task": message.payload["task"]}, to="planner",
                        correlation_id=message.correlation_id, in_reply_to=message.id)
        bus.ack(agent, message.seq)
    print(f"  {agent} cursor is at seq {bus.cursor(agent)}; next poll returns {len(bus.poll(agent))}")


def redeliver(bus: Bus) -> None:
    print("\n== planner polls but crashes before acking: the messages come back")
    first = [m.seq for m in bus.poll("planner")]
    again = [m.seq for m in bus.poll("planner")]
    print(f"  first poll {first}, second poll {again} (at-least-once)")
    bus.ack("planner", again[-1])
    print(f"  after ack: {len(bus.poll('planner'))} waiting")


def coordinate(bus: Bus, db_path: Path) -> None:
    print("\n== two workers race for one task; the lease decides")
    with Heartbeat(db_path, "worker-1", interval=0.05, status="working", task="deploy"):
        print(f"  worker-1 claims deploy: {bus.claim('deploy', 'worker-1', lease_ms=2000)}")
        refused = bus.try_claim("deploy", "worker-2")
        print(f"  worker-2 claims deploy: {refused.granted} (held by {refused.claim.agent})")
        report = {"log": "x" * 10_000}  # large: goes to the blob store
        sent = bus.publish("worker-1", "task_done", report, to="planner", correlation_id="deploy")
        print(f"  worker-1 publishes a 10 kB report as seq {sent.seq};"
              f" released: {bus.release('deploy', 'worker-1')}")
    got = bus.poll("planner")[-1]
    print(f"  planner reads it back: {len(got.payload['log'])} characters via {got.payload_ref[:15]}...")
    bus.ack("planner", got.seq)
    print("\n== liveness (what `bus alive` shows)")
    for item in bus.liveness():
        print(f"  {item.agent}: {item.state}, silent {item.age_s:.2f} s, {item.status} on {item.task}")


if __name__ == "__main__":
    main()
