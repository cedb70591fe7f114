"""The floor of scripts/bench_pump.py writes what an inline pump writes, no less.

The floor (scripts/pump_floor.py) is the bench's answer to "what could any
pump do here": the statements alone of a request answered inline. It is a
fair floor only while it does the same writes: these tests compare the rows
it leaves with those a running pump leaves for the same requests.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from pathlib import Path

import apsw

from bus import Bus
from bus.pump import Pump
from bus.pump import client
from bus.pump.organism import load_organism

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import pump_floor  # noqa: E402

REQUESTS = 5
REQUEST = "<add><a>1.5</a><b>2</b></add>"
ORGANISM = """\
name: bench
listeners:
  - name: calculator
    root_tag: add
    payload: tests.support.pump_tools:Add
    handler: tests.support.pump_tools:add_inline
    inline: true
"""


def written(conn: apsw.Connection) -> Counter:
    """How many rows of each kind the tables a unit writes hold, by what a reader tells
    apart; `replies` counts replies on their request's thread."""
    rows: Counter = Counter()
    for query in (
        "SELECT 'message', from_agent, to_agent, type, in_reply_to IS NULL, count(*)"
        " FROM messages GROUP BY 2, 3, 4, 5",
        "SELECT 'thread', name, depth, status, count(*) FROM threads GROUP BY 2, 3, 4",
        "SELECT 'inbox', count(*) FROM pump_inbox",
        "SELECT 'work', count(*) FROM pump_work",
        "SELECT 'replies', count(*) FROM messages r JOIN messages q ON q.id = r.in_reply_to"
        " AND q.correlation_id = r.correlation_id",
    ):
        for *key, count in conn.execute(query):
            rows[tuple(key)] += count
    return rows


def pump_rows(tmp_path: Path) -> Counter:
    """The rows a running inline pump adds for REQUESTS requests, once it has booted."""
    organism = tmp_path / "organism.yaml"
    organism.write_text(ORGANISM)
    with Bus.open(tmp_path / "pump.db") as bus:
        answered = threading.Semaphore(0)
        pump = Pump(bus, load_organism(organism), oob=False,
                    on_unit=lambda done, outcome: answered.release())
        runner = threading.Thread(target=pump.run, daemon=True)
        runner.start()
        try:
            client.send(bus, "bench", REQUEST)  # routed after the boot: the pump is up
            assert answered.acquire(timeout=30), "the pump did not answer"
            before = written(bus.conn)
            for _ in range(REQUESTS):
                client.send(bus, "bench", REQUEST)
            for _ in range(REQUESTS):
                assert answered.acquire(timeout=30), "the pump did not answer"
        finally:
            pump.stop()
            runner.join()
        assert pump.stats.outcomes == {"replied": REQUESTS + 1}
        return written(bus.conn) - before


def floor_rows(tmp_path: Path, batch: int) -> Counter:
    """The rows the floor adds for REQUESTS requests."""
    conn, root_id = pump_floor.open_floor(tmp_path / f"floor-{batch}.db")
    before = written(conn)
    for _ in range(REQUESTS):
        pump_floor.send(conn, root_id)
    answered = 0
    while answered < REQUESTS:
        answered += pump_floor.answer(conn, batch)
    return written(conn) - before


def test_the_floor_writes_the_rows_an_inline_pump_writes(tmp_path):
    expected = pump_rows(tmp_path)
    assert expected[("replies",)] == REQUESTS and expected[("work",)] == 0  # inline
    for batch in (1, 64):
        assert floor_rows(tmp_path, batch) == expected


def test_the_floor_throughput_answers_every_request(tmp_path):
    per_s = pump_floor.floor_replies(tmp_path / "f.db", 50, 8, time.perf_counter)
    assert per_s > 0
    with Bus.open(tmp_path / "f.db") as bus:
        rows = written(bus.conn)
    assert rows[("replies",)] == 50 and rows[("inbox",)] == 0
