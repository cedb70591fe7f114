"""`messages.append`, the log's write path: without a time it writes one INSERT per 64
rows, with the results that writing the rows one by one (at a given time) gives.

Group commit and `publish_many` write many rows in one statement; every row
must still get what writing it alone would give: a new seq, or the seq of
the row already holding its id and `duplicate=True` (an id repeated inside
the batch is a duplicate of its first occurrence).
"""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.storage.db import write_transaction
from bus.log.messages import append
from bus.log.messages import prepare_row
from tests.support.properties import scaled_settings

# A small pool of ids so batches repeat ids, among themselves and with the file.
ID_POOL = [str(uuid.UUID(int=n + 1)) for n in range(12)]


def rows_with_ids(ids: list[str | None], fresh_from: int = 10**6):
    """Rows with these ids; None stands for an id used nowhere else."""
    return [prepare_row("w1", "tick", {"n": n}, to=f"w{n % 3}",
                        id=row_id or str(uuid.UUID(int=fresh_from + n)))
            for n, row_id in enumerate(ids)]


def write(bus: Bus, rows, one_by_one: bool, in_transaction: bool = True) -> list[tuple[int, bool]]:
    if not in_transaction:  # each statement of 64 rows is a transaction of its own
        return append(bus.conn, rows, bus.payloads)
    with write_transaction(bus.conn) as conn:
        if one_by_one:  # a time given: each row is an INSERT of its own
            return append(conn, rows, bus.payloads, 1_000)
        return append(conn, rows, bus.payloads)


def contents(bus: Bus) -> list[tuple]:
    # Not ts_ms: one by one takes the time it is given, a batch SQLite's.
    return bus.conn.execute("SELECT seq, id, to_agent, payload FROM messages ORDER BY seq").fetchall()


id_lists = st.lists(st.one_of(st.none(), st.sampled_from(ID_POOL)), max_size=150)


@scaled_settings(max_examples=40, deadline=None)
@given(before=id_lists, batch=id_lists)
def test_append_batch_gives_what_one_by_one_gives(tmp_path_factory, before, batch):
    directory = tmp_path_factory.mktemp("rows")
    outcomes = []
    for name, one_by_one, in_transaction in (("single", True, True), ("multi", False, True),
                                             ("autocommit", False, False)):
        with Bus.open(directory / f"{name}.db") as bus:
            if before:
                write(bus, rows_with_ids(before), one_by_one=True)
            rows = rows_with_ids(batch, fresh_from=2 * 10**6)
            outcomes.append((write(bus, rows, one_by_one, in_transaction) if rows else [],
                             contents(bus)))
    assert outcomes[0] == outcomes[1] == outcomes[2]


def test_a_batch_of_new_rows_takes_consecutive_seqs_across_chunks(tmp_path):
    with Bus.open(tmp_path / "bus.db") as bus:
        bus.publish("w1", "first")
        results = write(bus, rows_with_ids([None] * 150), one_by_one=False)
        assert results == [(seq, False) for seq in range(2, 152)]
        assert [row[0] for row in contents(bus)] == list(range(1, 152))


def test_repeated_ids_in_one_batch_are_duplicates_of_the_first(tmp_path):
    with Bus.open(tmp_path / "bus.db") as bus:
        old = bus.publish("w1", "old", id=ID_POOL[0])
        results = write(bus, rows_with_ids([ID_POOL[1], ID_POOL[0], None, ID_POOL[1]]),
                        one_by_one=False)
        assert results == [(2, False), (old.seq, True), (3, False), (2, True)]


def test_publish_many_reports_duplicates_per_item(tmp_path):
    with Bus.open(tmp_path / "bus.db") as bus:
        bus.publish("w1", "tick", id=ID_POOL[2])
        results = bus.publish_many([{"from_agent": "w1", "type": "tick", "id": row_id}
                                    for row_id in (ID_POOL[3], ID_POOL[2], ID_POOL[3])])
        assert [(r.seq, r.id, r.duplicate) for r in results] == [
            (2, ID_POOL[3], False), (1, ID_POOL[2], True), (2, ID_POOL[3], True)]
        assert bus.conn.execute("SELECT count(*) FROM messages").get == 2
