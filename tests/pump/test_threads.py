"""The thread registry (bus/pump/threads.py): every operation, properties, real processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus import ValidationFailed
from bus.storage.db import write_transaction
from bus.storage.errors import ThreadAmbiguous
from bus.storage.errors import ThreadClosed
from bus.storage.errors import ThreadConflict
from bus.storage.errors import ThreadNotFound
from bus.pump import threads
from bus.pump.threads import Thread
from bus.pump.threads import ThreadRegistry
from tests.support.procs_coordination import Barrier
from tests.support.procs_coordination import Children
from tests.support.procs_threads import PROGRAM

T0 = 1_700_000_000_000
ORG = "org"
EXTERNAL = "6f9619ff-8b86-4d01-b42d-00c04fc964ff"
STARTUP_TIMEOUT = 60.0
CHILD_TIMEOUT = 120.0

# Listener names as organism.yaml allows them: '.' included.
names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,20}", fullmatch=True)


@pytest.fixture
def conn(bus: Bus):
    return bus.conn


@pytest.fixture
def children(tmp_path: Path, python_env: dict[str, str]):
    started = Children(python_env, tmp_path / "stderr")
    yield started
    started.cleanup()


def chain(conn, *path: str) -> list[Thread]:
    """A fresh conversation from the organism's root down `path`; every thread, root first."""
    made = [threads.initialize_root(conn, ORG)]
    for name in path:
        made.append(threads.extend_chain(conn, made[-1].uuid, name))
    return made


def row_count(conn) -> int:
    return conn.execute("SELECT count(*) FROM threads").get


# --- initialize_root and find_root -------------------------------------------------


def test_initialize_root_creates_one_open_root(conn):
    assert threads.find_root(conn, ORG) is None
    root = threads.initialize_root(conn, ORG, now=T0)
    assert (root.path, root.parent_uuid, root.status, root.created_at_ms) == (
        (ORG,), None, "open", T0)
    assert root.is_root and root.name == ORG
    assert threads.initialize_root(conn, ORG, now=T0 + 5) == root
    assert threads.find_root(conn, ORG) == root
    assert row_count(conn) == 1


def test_initialize_root_per_organism(conn):
    first, second = threads.initialize_root(conn, "a"), threads.initialize_root(conn, "b.c")
    assert first.uuid != second.uuid
    assert threads.find_root(conn, "b.c").path == ("b.c",)


def test_initialize_root_after_close_starts_a_new_root_and_keeps_the_old(conn):
    old = threads.initialize_root(conn, ORG)
    threads.close_thread(conn, old.uuid, now=T0)
    new = threads.initialize_root(conn, ORG)
    assert new.uuid != old.uuid
    assert threads.get_thread(conn, old.uuid).status == "closed"


@pytest.mark.parametrize("organism", ["", "a b", "a/b", 7, "x" * 129])
def test_initialize_root_rejects_bad_names(conn, organism):
    with pytest.raises(ValidationFailed) as info:
        threads.initialize_root(conn, organism)
    assert info.value.field == "organism"
    assert row_count(conn) == 0


# --- get_or_create and lookup ----------------------------------------------------------


def test_get_or_create_creates_the_missing_rows_then_finds_them(conn):
    made = threads.get_or_create(conn, [ORG, "console", "calc.add"], now=T0)
    assert made.path == (ORG, "console", "calc.add")
    assert row_count(conn) == 3
    assert threads.get_or_create(conn, (ORG, "console", "calc.add")) == made
    assert threads.get_or_create(conn, [ORG, "console"]).uuid == made.parent_uuid
    assert row_count(conn) == 3


def test_get_or_create_refuses_a_path_two_conversations_share(conn):
    console = threads.get_or_create(conn, [ORG, "console"])
    threads.extend_chain(conn, console.uuid, "greeter")
    threads.extend_chain(conn, console.uuid, "greeter")
    threads.extend_chain(conn, console.uuid, "greeter")
    with pytest.raises(ThreadAmbiguous) as info:
        threads.get_or_create(conn, [ORG, "console", "greeter", "calc"])
    assert (info.value.path, info.value.count) == ((ORG, "console", "greeter"), 3)
    assert "address the thread by its UUID" in str(info.value)
    assert row_count(conn) == 5  # nothing added


def test_get_or_create_skips_closed_threads(conn):
    first = threads.get_or_create(conn, [ORG, "console"])
    threads.close_thread(conn, first.uuid)
    second = threads.get_or_create(conn, [ORG, "console"])
    assert second.uuid != first.uuid and second.status == "open"


@pytest.mark.parametrize("path, field", [
    ("org.console", "path"), ([], "path"), (None, "path"), ([ORG, ""], "path[1]"),
    ([ORG, "a", "b c"], "path[2]"),
])
def test_get_or_create_rejects_bad_paths(conn, path, field):
    with pytest.raises(ValidationFailed) as info:
        threads.get_or_create(conn, path)
    assert info.value.field == field
    assert row_count(conn) == 0


def test_lookup_returns_the_chain_or_none(conn):
    made = chain(conn, "console", "greeter", "calc.add")
    assert threads.lookup(conn, made[-1].uuid) == (ORG, "console", "greeter", "calc.add")
    assert threads.lookup(conn, made[0].uuid) == (ORG,)
    assert threads.lookup(conn, EXTERNAL) is None
    assert threads.get_thread(conn, EXTERNAL) is None


def test_lookup_accepts_upper_case_uuids(conn):
    made = chain(conn, "console")
    assert threads.lookup(conn, made[-1].uuid.upper()) == (ORG, "console")


def test_lookup_rejects_what_is_not_a_uuid(conn):
    with pytest.raises(ValidationFailed) as info:
        threads.lookup(conn, "org.console")
    assert info.value.field == "thread"


# --- extend_chain ----------------------------------------------------------------------


def test_extend_chain_makes_a_new_thread_every_call(conn):
    root = threads.initialize_root(conn, ORG)
    first = threads.extend_chain(conn, root.uuid, "calc.add", now=T0)
    second = threads.extend_chain(conn, root.uuid, "calc.add", now=T0)
    assert first.uuid != second.uuid
    assert first.path == second.path == (ORG, "calc.add")
    assert first.parent_uuid == second.parent_uuid == root.uuid
    assert (first.status, first.created_at_ms, first.closed_at_ms) == ("open", T0, None)


def test_extend_chain_of_unknown_thread_raises(conn):
    with pytest.raises(ThreadNotFound) as info:
        threads.extend_chain(conn, EXTERNAL, "greeter")
    assert info.value.uuid == EXTERNAL
    assert row_count(conn) == 0


def test_extend_chain_of_closed_thread_raises(conn):
    made = chain(conn, "console", "greeter")
    threads.prune_for_response(conn, made[-1].uuid, now=T0)
    with pytest.raises(ThreadClosed) as info:
        threads.extend_chain(conn, made[-1].uuid, "calc")
    assert (info.value.uuid, info.value.closed_at_ms) == (made[-1].uuid, T0)
    assert row_count(conn) == 3


def test_extend_chain_rejects_bad_name(conn):
    root = threads.initialize_root(conn, ORG)
    with pytest.raises(ValidationFailed) as info:
        threads.extend_chain(conn, root.uuid, "calc/add")
    assert info.value.field == "name"
    assert "'/'" in info.value.reason


# --- prune_for_response ------------------------------------------------------------------


def test_prune_for_response_closes_and_returns_the_caller(conn):
    root, console, greeter, calc = chain(conn, "console", "greeter", "calc.add")
    pruned = threads.prune_for_response(conn, calc.uuid, now=T0)
    assert pruned.target == "greeter"
    assert pruned.thread == greeter
    assert (pruned.closed.uuid, pruned.closed.status, pruned.closed.closed_at_ms) == (
        calc.uuid, "closed", T0)
    assert threads.get_thread(conn, calc.uuid) == pruned.closed  # kept for history
    assert threads.prune_for_response(conn, greeter.uuid).target == "console"


def test_prune_for_response_to_the_root_has_no_target(conn):
    root, console = chain(conn, "console")
    pruned = threads.prune_for_response(conn, console.uuid)
    assert (pruned.target, pruned.thread.uuid) == (None, root.uuid)


def test_prune_for_response_twice_raises(conn):
    made = chain(conn, "console", "greeter")
    threads.prune_for_response(conn, made[-1].uuid)
    with pytest.raises(ThreadClosed):
        threads.prune_for_response(conn, made[-1].uuid)


def test_prune_for_response_of_a_root_raises_and_changes_nothing(conn):
    root = threads.initialize_root(conn, ORG)
    with pytest.raises(ValidationFailed) as info:
        threads.prune_for_response(conn, root.uuid)
    assert info.value.field == "thread"
    assert threads.get_thread(conn, root.uuid).status == "open"


def test_prune_for_response_of_unknown_thread_raises(conn):
    with pytest.raises(ThreadNotFound):
        threads.prune_for_response(conn, EXTERNAL)


def test_prune_for_response_into_a_closed_caller_says_so(conn):
    """A broadcast's late answer: the caller answered its own caller already."""
    root, console, greeter = chain(conn, "console", "greeter")
    slow = threads.extend_chain(conn, greeter.uuid, "bing")
    threads.prune_for_response(conn, greeter.uuid)
    pruned = threads.prune_for_response(conn, slow.uuid)
    assert (pruned.target, pruned.thread.uuid, pruned.thread.status) == (
        "greeter", greeter.uuid, "closed")


# --- two conversations on one path -----------------------------------------------------------


@pytest.mark.parametrize("listener", ["calculator", "calc.add"])
def test_two_conversations_on_one_path_get_their_own_answers(conn, listener):
    first = chain(conn, "console", "greeter", listener)
    second = chain(conn, "console", "greeter", listener)
    assert {t.uuid for t in first[1:]}.isdisjoint(t.uuid for t in second[1:])
    assert first[-1].path == second[-1].path
    # Answered in the opposite order from the calls: each bubbles to its own caller.
    for made in (second, first):
        pruned = threads.prune_for_response(conn, made[3].uuid)
        assert (pruned.target, pruned.thread.uuid) == ("greeter", made[2].uuid)
        pruned = threads.prune_for_response(conn, made[2].uuid)
        assert (pruned.target, pruned.thread.uuid) == ("console", made[1].uuid)


# --- register_thread -----------------------------------------------------------------------


def test_register_thread_records_the_external_uuid(conn):
    made = threads.register_thread(conn, EXTERNAL.upper(), "console", "greeter", ORG, now=T0)
    assert (made.uuid, made.path, made.created_at_ms) == (
        EXTERNAL, (ORG, "console", "greeter"), T0)
    pruned = threads.prune_for_response(conn, EXTERNAL)
    assert (pruned.target, pruned.thread.uuid) == ("console", made.parent_uuid)
    assert threads.get_thread(conn, made.parent_uuid).parent_uuid == threads.find_root(
        conn, ORG).uuid


def test_register_thread_again_for_the_same_path_is_a_no_op(conn):
    made = threads.register_thread(conn, EXTERNAL, "console", "greeter", ORG)
    assert threads.register_thread(conn, EXTERNAL, "console", "greeter", ORG) == made
    assert row_count(conn) == 3


def test_register_thread_gives_each_conversation_its_own_initiator_thread(conn):
    first = threads.register_thread(conn, EXTERNAL, "console", "greeter", ORG)
    other = "0e0e0e0e-0000-4000-8000-000000000001"
    second = threads.register_thread(conn, other, "console", "greeter", ORG)
    assert first.parent_uuid != second.parent_uuid
    assert threads.prune_for_response(conn, other).thread.uuid == second.parent_uuid


def test_register_thread_for_another_path_raises_conflict(conn):
    threads.register_thread(conn, EXTERNAL, "console", "greeter", ORG)
    with pytest.raises(ThreadConflict) as info:
        threads.register_thread(conn, EXTERNAL, "console", "calc.add", ORG)
    assert info.value.existing == (ORG, "console", "greeter")
    assert info.value.wanted == (ORG, "console", "calc.add")
    assert "use a fresh UUID" in str(info.value)
    assert row_count(conn) == 3


@pytest.mark.parametrize("args, field", [
    (("not-a-uuid", "console", "greeter", ORG), "thread_id"),
    ((EXTERNAL, "con sole", "greeter", ORG), "initiator"),
    ((EXTERNAL, "console", "", ORG), "target"),
    ((EXTERNAL, "console", "greeter", "my org"), "organism"),
])
def test_register_thread_rejects_bad_arguments(conn, args, field):
    with pytest.raises(ValidationFailed) as info:
        threads.register_thread(conn, *args)
    assert info.value.field == field
    assert row_count(conn) == 0


# --- close, list, count --------------------------------------------------------------------


def test_close_thread_is_idempotent_and_keeps_the_row(conn):
    made = chain(conn, "console")[-1]
    closed = threads.close_thread(conn, made.uuid, now=T0)
    assert (closed.status, closed.closed_at_ms) == ("closed", T0)
    assert threads.close_thread(conn, made.uuid, now=T0 + 1) == closed
    with pytest.raises(ThreadNotFound):
        threads.close_thread(conn, EXTERNAL)


def test_list_threads_newest_limit_oldest_first_with_status_filter(conn):
    made = chain(conn, "console", "greeter", "calc.add")
    threads.prune_for_response(conn, made[3].uuid)
    assert [t.uuid for t in threads.list_threads(conn)] == [t.uuid for t in made]
    assert [t.uuid for t in threads.list_threads(conn, limit=2)] == [made[2].uuid, made[3].uuid]
    assert [t.uuid for t in threads.list_threads(conn, "closed")] == [made[3].uuid]
    assert [t.path for t in threads.list_threads(conn, "open")] == [t.path for t in made[:3]]
    assert (threads.thread_count(conn), threads.thread_count(conn, "open"),
            threads.thread_count(conn, "closed")) == (4, 3, 1)


@pytest.mark.parametrize("kwargs, field", [
    ({"status": "gone"}, "status"), ({"limit": 0}, "limit"), ({"limit": 10_001}, "limit"),
])
def test_list_threads_rejects_bad_arguments(conn, kwargs, field):
    with pytest.raises(ValidationFailed) as info:
        threads.list_threads(conn, **kwargs)
    assert info.value.field == field


def test_thread_json_form(conn):
    made = threads.get_or_create(conn, [ORG, "calc.add"], now=T0)
    closed = threads.close_thread(conn, made.uuid, now=T0 + 1500)
    assert closed.to_json_dict() == {
        "uuid": made.uuid, "path": [ORG, "calc.add"], "parent": made.parent_uuid,
        "status": "closed", "created_at_ms": T0, "created": "2023-11-14T22:13:20.000Z",
        "closed_at_ms": T0 + 1500, "closed": "2023-11-14T22:13:21.500Z"}


# --- inside a caller's transaction ------------------------------------------------------------


def test_operations_compose_into_the_callers_transaction(bus, conn):
    root, console, greeter = chain(conn, "console", "greeter")
    with pytest.raises(RuntimeError):
        with write_transaction(conn):
            threads.extend_chain(conn, greeter.uuid, "calc.add")
            threads.prune_for_response(conn, greeter.uuid)
            bus.publish("greeter", "reply", {"n": 1})  # same connection: same transaction
            raise RuntimeError("the pump's claim was lost: roll everything back")
    assert row_count(conn) == 3
    assert threads.get_thread(conn, greeter.uuid).status == "open"
    assert bus.message_count() == 0


def test_operations_commit_with_the_callers_transaction(conn):
    root, console, greeter = chain(conn, "console", "greeter")
    with write_transaction(conn):
        pruned = threads.prune_for_response(conn, greeter.uuid)
        threads.close_thread(conn, pruned.thread.uuid)
    assert threads.thread_count(conn, "closed") == 2


def test_registry_wraps_the_functions_for_one_organism(bus):
    registry = ThreadRegistry(bus, ORG)
    root = registry.initialize_root()
    console = registry.get_or_create([ORG, "console"])
    call = registry.extend_chain(console.uuid, "calc.add")
    assert registry.lookup(call.uuid) == (ORG, "console", "calc.add")
    assert registry.get(call.uuid) == call
    assert registry.prune_for_response(call.uuid).thread == console
    made = registry.register_thread(EXTERNAL, "cli", "greeter")
    assert made.path == (ORG, "cli", "greeter")
    assert registry.close(console.uuid).status == "closed"
    assert console.parent_uuid == root.uuid


def test_lookup_by_uuid_uses_the_unique_index(conn):
    plan = conn.execute("EXPLAIN QUERY PLAN " + threads._BY_UUID_SQL, (EXTERNAL,)).fetchall()
    assert any("USING INDEX" in row[-1] for row in plan), plan
    plan = conn.execute("EXPLAIN QUERY PLAN " + threads._OPEN_CHILDREN_SQL, (1, "x")).fetchall()
    assert any("idx_threads_parent" in row[-1] for row in plan), plan


# --- properties -----------------------------------------------------------------------------


@given(path=st.lists(names, min_size=1, max_size=8))
def test_extend_then_prune_walks_back_to_each_parent(bus, path):
    conn = bus.conn
    made = chain(conn, *path)
    for depth in range(1, len(made)):
        assert threads.lookup(conn, made[depth].uuid) == (ORG, *path[:depth])
    for depth in range(len(made) - 1, 0, -1):
        pruned = threads.prune_for_response(conn, made[depth].uuid)
        assert pruned.thread.uuid == made[depth - 1].uuid
        assert pruned.target == (None if depth == 1 else path[depth - 2])


@given(path=st.lists(names, min_size=1, max_size=5), count=st.integers(2, 4), data=st.data())
def test_conversations_on_one_path_never_cross(bus, path, count, data):
    conn = bus.conn
    conversations = [chain(conn, *path) for _ in range(count)]
    uuids = [t.uuid for made in conversations for t in made[1:]]
    assert len(set(uuids)) == len(uuids)
    # Answer in an arbitrary interleaving; each answer reaches its own conversation.
    depth = {n: len(path) for n in range(count)}
    while any(depth.values()):
        n = data.draw(st.sampled_from(sorted(k for k, d in depth.items() if d)))
        made = conversations[n]
        pruned = threads.prune_for_response(conn, made[depth[n]].uuid)
        assert pruned.thread.uuid == made[depth[n] - 1].uuid
        depth[n] -= 1


# --- real processes -----------------------------------------------------------------------


PROCESSES = 4
CONVERSATIONS = 25
PATH = ("console", "greeter", "calc.add")


def test_processes_converse_on_one_path_without_crossing(db_path, children):
    Bus.open(db_path).close()
    barrier = Barrier()
    try:
        started = [
            children.start(f"conv-{n}", "converse", str(db_path), "--organism", ORG,
                           "--path", ",".join(PATH), "--count", str(CONVERSATIONS),
                           "--go-fd", str(barrier.read_fd), pass_fds=(barrier.read_fd,),
                           program=PROGRAM)
            for n in range(PROCESSES)
        ]
        barrier.release(started, STARTUP_TIMEOUT)
    finally:
        barrier.close()
    reports = []
    for child in started:
        reports += [json.loads(child.read_line(CHILD_TIMEOUT)) for _ in range(CONVERSATIONS)]
        child.wait_ok(CHILD_TIMEOUT)

    roots = {report["created"][0] for report in reports}
    assert len(roots) == 1  # every process found the one root
    created = [uuid for report in reports for uuid in report["created"][1:]]
    assert len(set(created)) == len(created) == PROCESSES * CONVERSATIONS * len(PATH)
    for report in reports:
        uuids = report["created"]
        expected = [["greeter", uuids[2]], ["console", uuids[1]], [None, uuids[0]]]
        assert report["answers"] == expected
    with Bus.open(db_path) as bus:
        assert threads.thread_count(bus.conn) == 1 + len(created)
        assert threads.thread_count(bus.conn, "open") == 1
        for uuid in created[:10]:
            assert threads.lookup(bus.conn, uuid)[0] == ORG


def test_clear_deletes_one_organism_s_threads_only(bus: Bus):
    registry = ThreadRegistry(bus, "org")
    first = registry.extend_chain(registry.get_or_create(["org", "console"]).uuid, "greeter")
    registry.close(registry.prune_for_response(first.uuid).thread.uuid)
    registry.initialize_root()
    other = ThreadRegistry(bus, "other").get_or_create(["other", "console"])
    assert registry.clear() == 3
    assert registry.lookup(first.uuid) is None
    assert threads.find_root(bus.conn, "org") is None
    assert threads.get_thread(bus.conn, other.uuid).path == ("other", "console")
    assert registry.clear() == 0
    assert registry.get_or_create(["org", "console"]).path == ("org", "console")


def test_close_if_done_waits_for_open_children(conn):
    root, conversation, call = chain(conn, "console", "greeter")
    with write_transaction(conn):
        assert threads.close_if_done(conn, conversation.uuid, 1) is False
        threads.close_thread(conn, call.uuid, 1)
        assert threads.close_if_done(conn, conversation.uuid, 1) is True
        assert threads.close_if_done(conn, root.uuid, 1) is False  # a root stays open


def test_answer_call_closes_the_call_and_then_the_conversation_it_ended(bus):
    """The pump's answer to a client: each answered call closes; the conversation closes
    with the last call open under it, as answer_to then close_if_done would."""
    conn = bus.conn
    with write_transaction(conn):
        threads.initialize_root(conn, "org", 1)
        conversation = threads.open_conversation(conn, "org", "console", 1)
        fast, slow = (threads.extend_uuid(conn, conversation, name, 1) for name in ("a", "b"))
        assert threads.answer_call(conn, fast, conversation, 2) == threads.Caller(
            conversation, "console", 1)
        assert threads.get_thread(conn, conversation).status == "open"  # b is still open
        assert threads.answer_call(conn, fast, conversation, 3) is None  # answered before
        assert threads.answer_call(conn, slow, conversation, 4).depth == 1
        assert [threads.get_thread(conn, uuid).status for uuid in (fast, slow, conversation)] \
            == ["closed", "closed", "closed"]


def test_answer_call_leaves_a_calling_listener_open(bus):
    """A call made by a listener (depth 2) closes; the listener's own thread stays open
    for its caller to close when it answers."""
    conn = bus.conn
    with write_transaction(conn):
        threads.initialize_root(conn, "org", 1)
        conversation = threads.open_conversation(conn, "org", "console", 1)
        listener = threads.extend_uuid(conn, conversation, "counter", 1)
        call = threads.extend_uuid(conn, listener, "calc.add", 1)
        assert threads.answer_call(conn, call, listener, 2) == threads.Caller(
            listener, "counter", 2)
        assert threads.get_thread(conn, listener).status == "open"
