"""Group commit: concurrent publishes of one Bus share transactions, each keeps its result."""

from __future__ import annotations

import threading

import pytest

from bus import Bus
from bus.storage.db import write_transaction
from bus.storage.errors import BusBusy
from bus.log.group_commit import GroupCommit

from tests.support.waiting import wait_until

DEADLINE_S = 30.0


class HeldWrite:
    """A write function whose first call blocks until released: followers queue meanwhile."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls: list[list[list[int]]] = []
        self.fail_on = fail_on

    def __call__(self, batches):
        self.calls.append([list(items) for items in batches])
        if len(self.calls) == 1:
            self.entered.set()
            self.release.wait(DEADLINE_S)
        if self.fail_on is not None and any(self.fail_on in items for items in batches):
            raise BusBusy("held by another writer")
        return [[item * 10 for item in items] for items in batches]


def submit_in_threads(group: GroupCommit, requests: list[list[int]]):
    results: dict[int, object] = {}

    def run(index: int) -> None:
        try:
            results[index] = group.submit(requests[index])
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(requests))]
    return threads, results


def test_group_commit_followers_share_the_next_transaction():
    write = HeldWrite()
    group = GroupCommit(write)
    threads, results = submit_in_threads(group, [[1], [2, 3], [4], [5]])
    threads[0].start()
    assert write.entered.wait(DEADLINE_S)
    for thread in threads[1:]:
        thread.start()
    wait_until(lambda: group.queued == 3, "three followers to queue")
    write.release.set()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert write.calls[0] == [[1]]
    assert sorted(map(sorted, write.calls[1])) == [[2, 3], [4], [5]]  # one transaction
    assert len(write.calls) == 2 and group.commits == 2
    assert results == {0: [10], 1: [20, 30], 2: [40], 3: [50]}


def test_group_commit_a_failed_transaction_fails_each_request_in_it_and_no_other():
    write = HeldWrite(fail_on=4)
    group = GroupCommit(write)
    threads, results = submit_in_threads(group, [[1], [2], [4]])
    threads[0].start()
    assert write.entered.wait(DEADLINE_S)
    threads[1].start()
    threads[2].start()
    wait_until(lambda: group.queued == 2, "two followers to queue")
    write.release.set()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert results[0] == [10]
    assert isinstance(results[1], BusBusy) and isinstance(results[2], BusBusy)
    assert group.submit([7]) == [70]  # the group is not stuck after a failure


def test_group_commit_alone_writes_at_once():
    group = GroupCommit(lambda batches: [[x + 1 for x in items] for items in batches])
    assert [group.submit([n]) for n in range(3)] == [[1], [2], [3]]
    assert group.commits == 3 and group.queued == 0


def test_bus_threads_publish_unique_increasing_seqs(bus: Bus):
    threads_n, per_thread = 16, 60
    seen: dict[int, list[int]] = {}

    def publish(thread: int) -> None:
        seen[thread] = [bus.publish(f"t{thread}", "tick", {"n": n}).seq for n in range(per_thread)]

    threads = [threading.Thread(target=publish, args=(i,)) for i in range(threads_n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    every = sorted(seq for seqs in seen.values() for seq in seqs)
    assert every == list(range(1, threads_n * per_thread + 1))
    assert all(seqs == sorted(seqs) for seqs in seen.values())  # each caller's in order
    by_seq = {m.seq: m for m in bus.list_messages(limit=10_000)}
    for thread, seqs in seen.items():
        assert [by_seq[s].payload["n"] for s in seqs] == list(range(per_thread))
        assert {by_seq[s].from_agent for s in seqs} == {f"t{thread}"}


def test_bus_publish_inside_a_transaction_joins_it(bus: Bus):
    """The caller's own transaction decides: a rollback takes its publishes with it."""
    with pytest.raises(RuntimeError):
        with write_transaction(bus.conn):
            bus.publish("a", "inside")
            raise RuntimeError("changed my mind")
    assert bus.message_count() == 0
    with write_transaction(bus.conn):
        first = bus.publish("a", "inside")
    assert (first.seq, bus.message_count()) == (1, 1)


def test_bus_publish_inside_a_transaction_while_another_thread_publishes(bus: Bus):
    """A thread holding the write lock never waits on another thread's leader."""
    other_done = threading.Event()
    with write_transaction(bus.conn):
        bus.publish("a", "mine")
        worker = threading.Thread(target=lambda: (bus.publish("b", "theirs"), other_done.set()))
        worker.start()  # it waits for the write lock this transaction holds
        bus.publish("a", "mine again")
    worker.join(DEADLINE_S)
    assert other_done.is_set()
    assert [m.type for m in bus.list_messages()] == ["mine", "mine again", "theirs"]


def test_bus_duplicate_ids_from_two_threads_in_one_batch(bus: Bus):
    id_ = "01890a5d-ac96-774b-bcce-b302099a8057"
    results = []
    threads = [threading.Thread(target=lambda: results.append(bus.publish("a", "t", id=id_)))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE_S)
    assert len({r.seq for r in results}) == 1
    assert sorted(r.duplicate for r in results) == [False] + [True] * 7
    assert bus.message_count() == 1
