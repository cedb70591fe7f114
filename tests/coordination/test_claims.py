"""Leased task claims: claim, try_claim, renew, release, dead claims and reap.

Most tests inject the clock (`now=`, epoch milliseconds) so that expiry is
exact and nothing sleeps. The tests at the end use real processes on one
file (tests/support/procs_coordination.py): a race of 8 processes for 100 tasks with
short leases, 8 processes claiming tasks that are due to die, and holders
killed with SIGKILL. They synchronise through pipes only; every wait has a
deadline and children left over are killed.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

import pytest

from bus import Bus
from bus import ValidationFailed
from bus.coordination import heartbeats
from bus.api import LEASE_MS_MAX
from bus.api import TASK_ID_MAX
from bus.coordination.claims import Claim
from bus.coordination.claims import ClaimResult
from bus.coordination.claims import DeadClaim
from bus.coordination.heartbeats import Thresholds
from tests.support.procs_coordination import Barrier
from tests.support.procs_coordination import Children

T0 = 1_700_000_000_000  # an injected clock: 2023-11-14, epoch milliseconds
STARTUP_TIMEOUT = 60.0  # for a child to import bus, open the file and report
SHORT_TIMEOUT = 60.0
RACERS = 8  # child processes claiming at once


@pytest.fixture
def children(tmp_path: Path, python_env: dict[str, str]):
    started = Children(python_env, tmp_path / "stderr")
    yield started
    started.cleanup()


def all_messages(bus: Bus) -> list:
    found, after = [], 0
    while batch := bus.list_messages(after, 10_000):
        found.extend(batch)
        after = batch[-1].seq
    return found


def of_type(bus: Bus, type_: str) -> list:
    return [m for m in all_messages(bus) if m.type == type_]


def snapshot(bus: Bus) -> tuple:
    """Everything a claim call could change."""
    rows = bus.conn.execute("SELECT * FROM heartbeats ORDER BY agent_id").fetchall()
    fences = bus.conn.execute("SELECT * FROM task_fences ORDER BY task_id").fetchall()
    return bus.claims.list(), bus.claims.dead(), all_messages(bus), rows, fences


def only_claim(bus: Bus) -> Claim:
    [claim] = bus.claims.list()
    return claim


# --- claim and try_claim ----------------------------------------------------------


def test_claim_new_task_is_granted_with_one_attempt(bus):
    result = bus.claims.try_claim("t-1", "alice", 5_000, max_attempts=4, now=T0)
    expected = Claim("t-1", "alice", T0, T0 + 5_000, 5_000, 1, 4, fence=1)
    assert result == ClaimResult(True, claim=expected)
    assert bus.claims.list() == [expected]
    assert bus.claims.dead() == []
    assert bus.message_count() == 0


def test_claim_returns_a_bool_and_uses_the_default_lease(bus):
    assert bus.claims.claim("t-1", "alice", now=T0) is True
    assert bus.claims.claim("t-1", "bob", now=T0 + 1) is False
    assert only_claim(bus) == Claim("t-1", "alice", T0, T0 + 60_000, 60_000, 1, 5, fence=1)


def test_claim_without_now_uses_the_clock(bus):
    before = time.time_ns() // 1_000_000
    result = bus.claims.try_claim("t-1", "alice", 1_000)
    after = time.time_ns() // 1_000_000
    assert result.granted
    assert before <= result.claim.claimed_at_ms <= after
    assert result.claim.lease_until_ms == result.claim.claimed_at_ms + 1_000


def test_claim_by_other_agent_refused_while_lease_unexpired(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    held = only_claim(bus)
    for now in (T0, T0 + 1, T0 + 4_999):
        result = bus.claims.try_claim("t-1", "bob", 5_000, now=now)
        assert result == ClaimResult(False, claim=held)
        assert result.claim.agent == "alice"
        assert result.claim.lease_until_ms == T0 + 5_000
    assert bus.claims.list() == [held]
    assert bus.message_count() == 0


def test_claim_by_holder_extends_lease_keeping_start_and_attempts(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    result = bus.claims.try_claim("t-1", "alice", 8_000, now=T0 + 4_999)
    assert result.granted
    assert result.claim == Claim("t-1", "alice", T0, T0 + 4_999 + 8_000, 8_000, 1, 5,
                                   fence=1)  # an extension keeps the fence
    assert bus.claims.list() == [result.claim]
    # the extended lease is the one that counts now
    assert not bus.claims.claim("t-1", "bob", now=T0 + 12_998)
    assert bus.claims.claim("t-1", "bob", now=T0 + 12_999)


def test_claim_after_expiry_by_other_agent_counts_an_attempt(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    # lease_until <= now: expired
    result = bus.claims.try_claim("t-1", "bob", 7_000, now=T0 + 5_000)
    assert result == ClaimResult(True, claim=Claim("t-1", "bob", T0 + 5_000, T0 + 12_000,
                                                   7_000, 2, 5, fence=2))
    assert bus.claims.list() == [result.claim]
    assert not bus.claims.claim("t-1", "alice", now=T0 + 11_999)  # alice lost it
    [message] = bus.list_messages()
    assert (message.from_agent, message.type, message.correlation_id, message.ts_ms) == (
        "bus", "task_reclaimed", "t-1", T0 + 5_000)
    assert message.payload == {"task": "t-1", "previous_holder": "alice", "new_holder": "bob",
                               "attempt": 2, "fence": 2}


def test_claim_after_expiry_by_same_agent_counts_an_attempt(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    result = bus.claims.try_claim("t-1", "alice", 5_000, now=T0 + 9_000)
    assert result.claim == Claim("t-1", "alice", T0 + 9_000, T0 + 14_000, 5_000, 2, 5,
                                 fence=2)  # a new lease, if by the same agent


def test_claim_of_one_task_leaves_others_alone(bus):
    assert bus.claims.claim("t-1", "alice", 5_000, now=T0)
    assert bus.claims.claim("t-2", "bob", 5_000, now=T0)
    assert [(c.task_id, c.agent) for c in bus.claims.list()] == [("t-1", "alice"), ("t-2", "bob")]


def test_claim_attempts_limit_sends_task_to_dead_list(bus):
    for n, agent in enumerate(["a-1", "a-2", "a-3"]):
        result = bus.claims.try_claim("t-1", agent, 1_000, max_attempts=3, now=T0 + n * 1_000)
        assert result.granted, result
        assert (result.claim.agent, result.claim.attempts) == (agent, n + 1)
    assert of_type(bus, "task_dead") == []

    fourth = bus.claims.try_claim("t-1", "a-4", 1_000, max_attempts=3, now=T0 + 3_000)
    assert not fourth.granted
    assert fourth.claim is None
    dead = fourth.dead
    assert isinstance(dead, DeadClaim)
    assert (dead.task_id, dead.last_holder, dead.attempts, dead.died_at_ms) == (
        "t-1", "a-3", 3, T0 + 3_000)
    assert "3" in dead.reason and "max_attempts" in dead.reason
    assert bus.claims.dead() == [dead]
    assert bus.claims.list() == []

    [message] = of_type(bus, "task_dead")
    assert (message.from_agent, message.to_agent, message.correlation_id) == ("bus", None, "t-1")
    assert message.ts_ms == T0 + 3_000
    assert message.payload == dead.to_json_dict()
    assert bus.last_messages(1) == [message]
    assert [m.type for m in bus.poll("anyone")] == [  # broadcasts; each takeover announced
        "task_reclaimed", "task_reclaimed", "task_dead"]

    # later claims, by anyone and at any time, stay refused and announce nothing more
    for agent, now in [("a-5", T0 + 3_000), ("a-3", T0 + 3_001), ("a-1", T0 + 999_000)]:
        later = bus.claims.try_claim("t-1", agent, 1_000, max_attempts=10, now=now)
        assert later == ClaimResult(False, dead=dead), (agent, now)
    assert bus.claims.claim("t-1", "a-6") is False
    assert bus.claims.dead() == [dead]
    assert bus.claims.list() == []
    assert len(of_type(bus, "task_dead")) == 1
    assert bus.message_count() == 3


def test_claim_last_attempt_is_not_dead_before_it_expires(bus):
    bus.claims.claim("t-1", "a-1", 1_000, max_attempts=2, now=T0)
    bus.claims.claim("t-1", "a-2", 1_000, max_attempts=2, now=T0 + 1_000)
    held = only_claim(bus)
    assert held.attempts == held.max_attempts == 2
    assert bus.claims.try_claim("t-1", "a-3", now=T0 + 1_999) == ClaimResult(False, claim=held)
    extended = bus.claims.try_claim("t-1", "a-2", 1_000, now=T0 + 1_999)  # the holder may extend
    assert extended.granted and extended.claim.attempts == 2
    assert bus.claims.renew("t-1", "a-2", now=T0 + 2_998)
    assert bus.claims.dead() == []
    assert bus.claims.try_claim("t-1", "a-3", now=T0 + 3_998).dead.last_holder == "a-2"


def test_claim_with_max_attempts_one_dies_at_the_first_expiry(bus):
    assert bus.claims.claim("t-1", "a-1", 1_000, max_attempts=1, now=T0)
    result = bus.claims.try_claim("t-1", "a-1", 1_000, max_attempts=1, now=T0 + 1_000)
    assert not result.granted
    assert (result.dead.last_holder, result.dead.attempts) == ("a-1", 1)


def test_dead_claims_lists_oldest_first(bus):
    for task, died_at in [("t-b", T0 + 5_000), ("t-a", T0 + 9_000)]:
        bus.claims.claim(task, "a-1", 1_000, max_attempts=1, now=T0)
        assert bus.claims.try_claim(task, "a-2", now=died_at).dead is not None
    assert [(d.task_id, d.died_at_ms) for d in bus.claims.dead()] == [
        ("t-b", T0 + 5_000), ("t-a", T0 + 9_000)]


def test_claim_after_release_of_a_dead_task_holder_is_still_refused(bus):
    bus.claims.claim("t-1", "a-1", 1_000, max_attempts=1, now=T0)
    dead = bus.claims.try_claim("t-1", "a-2", now=T0 + 1_000).dead
    assert not bus.claims.release("t-1", "a-1")
    assert not bus.claims.renew("t-1", "a-1", now=T0 + 1_000)
    assert bus.claims.try_claim("t-1", "a-1", now=T0 + 2_000) == ClaimResult(False, dead=dead)


# --- renew ---------------------------------------------------------------------------


def test_renew_by_holder_extends_from_now_with_the_claims_lease(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    assert bus.claims.renew("t-1", "alice", now=T0 + 4_999) is True
    assert only_claim(bus) == Claim("t-1", "alice", T0, T0 + 9_999, 5_000, 1, 5, fence=1)
    assert not bus.claims.claim("t-1", "bob", now=T0 + 9_998)
    assert bus.claims.claim("t-1", "bob", now=T0 + 9_999)


def test_renew_with_lease_ms_extends_by_that_much(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    assert bus.claims.renew("t-1", "alice", 20_000, now=T0 + 1_000)
    claim = only_claim(bus)
    assert (claim.claimed_at_ms, claim.lease_until_ms, claim.attempts) == (T0, T0 + 21_000, 1)


def test_renew_without_now_uses_the_clock(bus):
    bus.claims.claim("t-1", "alice", 60_000)
    before = time.time_ns() // 1_000_000
    assert bus.claims.renew("t-1", "alice", 30_000)
    after = time.time_ns() // 1_000_000
    assert before + 30_000 <= only_claim(bus).lease_until_ms <= after + 30_000


def test_renew_by_non_holder_changes_nothing(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    before = snapshot(bus)
    assert bus.claims.renew("t-1", "bob", now=T0 + 1) is False
    assert bus.claims.renew("t-1", "bob", 50_000, now=T0 + 1) is False
    assert snapshot(bus) == before


@pytest.mark.parametrize("late", [0, 1, 3_600_000])
def test_renew_after_expiry_changes_nothing(bus, late):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    before = snapshot(bus)
    assert bus.claims.renew("t-1", "alice", now=T0 + 5_000 + late) is False
    assert bus.claims.renew("t-1", "alice", 50_000, now=T0 + 5_000 + late) is False
    assert snapshot(bus) == before
    # the failed renew revived nothing: the next take is one more attempt
    taken = bus.claims.try_claim("t-1", "bob", now=T0 + 5_000 + late)
    assert taken.granted and taken.claim.attempts == 2


def test_renew_by_old_holder_after_takeover_fails(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    bus.claims.claim("t-1", "bob", 5_000, now=T0 + 5_000)
    before = snapshot(bus)
    assert not bus.claims.renew("t-1", "alice", now=T0 + 5_001)
    assert snapshot(bus) == before


def test_renew_of_unknown_task_is_false(bus):
    assert bus.claims.renew("nobody-claimed-this", "alice", now=T0) is False
    assert bus.claims.list() == []


# --- release ---------------------------------------------------------------------------


def test_release_by_holder_deletes_claim_and_resets_attempts(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    bus.claims.claim("t-1", "bob", 5_000, now=T0 + 5_000)
    assert only_claim(bus).attempts == 2
    assert bus.claims.release("t-1", "bob") is True
    assert bus.claims.list() == []
    result = bus.claims.try_claim("t-1", "carol", 5_000, now=T0 + 5_001)
    assert result.claim == Claim("t-1", "carol", T0 + 5_001, T0 + 10_001, 5_000, 1, 5,
                                 fence=3)  # the fence survives the release
    # bob's takeover is announced; carol took a released task, which is no takeover
    assert [m.type for m in bus.list_messages()] == ["task_reclaimed"]


def test_release_by_non_holder_changes_nothing(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    before = snapshot(bus)
    assert bus.claims.release("t-1", "bob") is False
    assert snapshot(bus) == before


def test_release_by_old_holder_after_takeover_fails(bus):
    bus.claims.claim("t-1", "alice", 5_000, now=T0)
    bus.claims.claim("t-1", "bob", 5_000, now=T0 + 6_000)
    before = snapshot(bus)
    assert bus.claims.release("t-1", "alice") is False
    assert snapshot(bus) == before
    assert bus.claims.release("t-1", "bob") is True


def test_release_of_unknown_task_is_false(bus):
    assert bus.claims.release("t-1", "alice") is False


def test_release_twice_is_false_the_second_time(bus):
    bus.claims.claim("t-1", "alice", now=T0)
    assert bus.claims.release("t-1", "alice") is True
    assert bus.claims.release("t-1", "alice") is False


# --- validation ----------------------------------------------------------------------


def call(bus: Bus, method: str, *, task="t-1", agent="alice", lease_ms=5_000,
         max_attempts=5, now=T0 + 1) -> object:
    """Call one claim method with these arguments (those it does not take are left out)."""
    if method == "claim":
        return bus.claims.claim(task, agent, lease_ms, max_attempts=max_attempts, now=now)
    if method == "try_claim":
        return bus.claims.try_claim(task, agent, lease_ms, max_attempts=max_attempts, now=now)
    if method == "renew":
        return bus.claims.renew(task, agent, lease_ms, now=now)
    assert method == "release"
    return bus.claims.release(task, agent)


@pytest.fixture
def claimed_bus(bus):
    """A bus holding alice's live claim on t-1 and an expired, last-attempt claim on t-last."""
    bus.claims.claim("t-1", "alice", 60_000, now=T0)
    bus.claims.claim("t-last", "alice", 1_000, max_attempts=1, now=T0 - 10_000)
    bus.heartbeats.beat("alice")
    return bus


def check_refused(bus: Bus, field: str, method: str, **arguments: object) -> None:
    before = snapshot(bus)
    with pytest.raises(ValidationFailed) as info:
        call(bus, method, **arguments)
    assert info.value.field == field, info.value
    assert snapshot(bus) == before, "a refused call wrote something"


ALL_METHODS = ["claim", "try_claim", "renew", "release"]


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("task", ["", "x" * (TASK_ID_MAX + 1), None, 5, b"t-1"])
def test_claim_methods_reject_bad_task_id(claimed_bus, method, task):
    check_refused(claimed_bus, "task_id", method, task=task)


@pytest.mark.parametrize("method", ALL_METHODS)
@pytest.mark.parametrize("agent", ["", "has space", "a/b", "x" * 129, None, 7, "ünï"])
def test_claim_methods_reject_bad_agent(claimed_bus, method, agent):
    check_refused(claimed_bus, "agent", method, agent=agent)


@pytest.mark.parametrize("method", ["claim", "try_claim", "renew"])
@pytest.mark.parametrize("lease_ms", [0, -1, 1.5, 1000.0, "1000", True, LEASE_MS_MAX + 1])
def test_claim_methods_reject_bad_lease_ms(claimed_bus, method, lease_ms):
    check_refused(claimed_bus, "lease_ms", method, lease_ms=lease_ms)


@pytest.mark.parametrize("method", ["claim", "try_claim"])
def test_claim_rejects_none_lease_ms(claimed_bus, method):
    check_refused(claimed_bus, "lease_ms", method, task="t-new", lease_ms=None)


@pytest.mark.parametrize("method", ["claim", "try_claim"])
@pytest.mark.parametrize("max_attempts", [0, -1, True, 2.0, None])
def test_claim_rejects_bad_max_attempts(claimed_bus, method, max_attempts):
    check_refused(claimed_bus, "max_attempts", method, task="t-new", max_attempts=max_attempts)


BAD_NOWS = [time.time(), int(time.time()), 1_700_000_000, float(T0), True, "1700000000000",
            99_999_999_999]


@pytest.mark.parametrize("method", ["claim", "try_claim", "renew"])
@pytest.mark.parametrize("now", BAD_NOWS)
def test_claim_methods_reject_now_not_in_epoch_ms(claimed_bus, method, now):
    check_refused(claimed_bus, "now", method, now=now)
    # t-last is due to die on its next claim: a refused call must not bury it
    check_refused(claimed_bus, "now", method, task="t-last", now=now)


@pytest.mark.parametrize("now", BAD_NOWS)
def test_reap_rejects_now_not_in_epoch_ms(claimed_bus, now):
    before = snapshot(claimed_bus)
    with pytest.raises(ValidationFailed) as info:
        claimed_bus.claims.reap(now=now)
    assert info.value.field == "now"
    assert snapshot(claimed_bus) == before


def test_claim_accepts_the_limits(bus):
    longest_task = "x" * TASK_ID_MAX
    longest_agent = "a" * 128
    assert bus.claims.claim(longest_task, longest_agent, LEASE_MS_MAX, max_attempts=1, now=T0)
    claim = only_claim(bus)
    assert (claim.task_id, claim.agent, claim.lease_until_ms) == (
        longest_task, longest_agent, T0 + LEASE_MS_MAX)
    assert bus.claims.renew(longest_task, longest_agent, LEASE_MS_MAX, now=T0 + 1)
    assert bus.claims.claim("t-short", "a.b_c:d-1", 1, now=100_000_000_000)
    assert bus.claims.release(longest_task, longest_agent)


# --- reap ----------------------------------------------------------------------------


def beat_at(bus: Bus, agent: str, ts_ms: int) -> None:
    """A heartbeat stamped `ts_ms` (the library's own beat, with its clock injected)."""
    heartbeats.beat(bus.conn, agent, "working", None, None, now=ts_ms)


def test_reap_releases_claims_of_dead_agents_only(bus):
    ts = bus.heartbeats.beat("ghost", "working", task="t-ghost")
    now = ts + 301_000
    beat_at(bus, "live", ts + 290_000)  # 11 s before `now`: alive
    assert bus.claims.claim("t-ghost", "ghost", 600_000, now=ts)
    assert bus.claims.claim("t-ghost-2", "ghost", 600_000, now=ts + 1)
    assert bus.claims.claim("t-ghost-done", "ghost", 1_000, now=ts)  # already expired at `now`
    assert bus.claims.claim("t-live", "live", 600_000, now=ts)
    assert bus.claims.claim("t-silent", "never-beat", 600_000, now=ts)  # no heartbeat at all
    before = {c.task_id: c for c in bus.claims.list()}

    reaped = bus.claims.reap(now=now)

    assert reaped == [before["t-ghost"], before["t-ghost-2"]]
    after = {c.task_id: c for c in bus.claims.list()}
    for task in ("t-ghost", "t-ghost-2"):
        assert after[task] == Claim(task, "ghost", before[task].claimed_at_ms, now,
                                    600_000, 1, 5, fence=1)
    for task in ("t-ghost-done", "t-live", "t-silent"):
        assert after[task] == before[task]

    released = of_type(bus, "task_released")
    assert [m.correlation_id for m in released] == ["t-ghost", "t-ghost-2"]
    assert all((m.from_agent, m.to_agent, m.ts_ms) == ("bus", None, now) for m in released)
    assert released[0].payload == {"task": "t-ghost", "agent": "ghost", "reason": "agent dead",
                                   "fence": 1, "silent_s": 301.0}
    assert bus.message_count() == 2
    assert [m.type for m in bus.poll("heir")] == ["task_released"] * 2

    # claimable at once, and the take counts an attempt; the ghost cannot renew
    assert not bus.claims.renew("t-ghost", "ghost", now=now)
    taken = bus.claims.try_claim("t-ghost", "heir", now=now)
    assert taken.granted and (taken.claim.agent, taken.claim.attempts, taken.fence) == (
        "heir", 2, 2)
    assert not bus.claims.claim("t-live", "heir", now=now)
    assert not bus.claims.claim("t-silent", "heir", now=now)


def test_reap_threshold_is_inclusive(bus):
    ts = bus.heartbeats.beat("ghost")
    bus.claims.claim("t-1", "ghost", 600_000, now=ts)
    before = snapshot(bus)
    assert bus.claims.reap(now=ts + 299_999) == []
    assert snapshot(bus) == before
    assert [c.task_id for c in bus.claims.reap(now=ts + 300_000)] == ["t-1"]
    assert of_type(bus, "task_released")[0].payload["silent_s"] == 300.0


def test_reap_with_custom_thresholds(bus):
    ts = bus.heartbeats.beat("ghost")
    bus.claims.claim("t-1", "ghost", 600_000, now=ts)
    quick = Thresholds(warn=1.0, stale=2.0, dead=4.0)
    assert bus.claims.reap(now=ts + 3_999, thresholds=quick) == []
    assert [c.task_id for c in bus.claims.reap(now=ts + 4_000, thresholds=quick)] == ["t-1"]


def test_reap_twice_releases_once(bus):
    ts = bus.heartbeats.beat("ghost")
    bus.claims.claim("t-1", "ghost", 600_000, now=ts)
    assert len(bus.claims.reap(now=ts + 400_000)) == 1
    before = snapshot(bus)
    assert bus.claims.reap(now=ts + 400_000) == []
    assert bus.claims.reap(now=ts + 500_000) == []
    assert snapshot(bus) == before


def test_reap_spares_an_agent_that_beat_recently(bus):
    bus.claims.claim("t-1", "worker", 600_000, now=T0)
    beat_at(bus, "worker", T0 + 100_000)
    before = snapshot(bus)
    assert bus.claims.reap(now=T0 + 301_000) == []
    assert snapshot(bus) == before


@pytest.mark.parametrize("dead_s", [4.0, 1.001, 4.1, 0.3, 300.0, 299.999])
def test_reap_agrees_with_liveness_on_who_is_dead(bus, dead_s):
    """Reap ends the leases of exactly the agents that liveness calls dead."""
    thresholds = Thresholds(warn=dead_s / 2, stale=dead_s / 2, dead=dead_s)
    boundary = round(dead_s * 1000)
    for silent_ms in (boundary - 1, boundary, boundary + 1):
        agent = f"agent-{silent_ms}"
        beat_at(bus, agent, T0 - silent_ms)
        bus.claims.claim(f"t-{silent_ms}", agent, 3_600_000, now=T0 - silent_ms)
    dead = {item.agent for item in bus.heartbeats.liveness(now=T0, thresholds=thresholds)
            if item.state == "dead"}
    assert dead == {f"agent-{boundary}", f"agent-{boundary + 1}"}
    reaped = {claim.agent for claim in bus.claims.reap(now=T0, thresholds=thresholds)}
    assert reaped == dead


def test_reap_with_nothing_to_do_writes_nothing(bus):
    assert bus.claims.reap() == []
    assert bus.message_count() == 0


# --- real processes: holders killed with SIGKILL ------------------------------------------


def test_claim_of_killed_holder_passes_to_another_after_the_lease(db_path, children):
    Bus.open(db_path).close()
    holder = children.start("holder", "hold", str(db_path), "--agent", "holder",
                            "--task", "t-1", "--lease-ms", "2000")
    reported = json.loads(holder.read_line(STARTUP_TIMEOUT))["claim"]
    holder.kill(SHORT_TIMEOUT)
    lease_until = reported["lease_until_ms"]
    assert lease_until == reported["claimed_at_ms"] + 2_000

    with Bus.open(db_path) as bus:
        held = only_claim(bus)
        assert held.to_json_dict() == reported
        refused = bus.claims.try_claim("t-1", "heir", 2_000, now=lease_until - 1)
        assert refused == ClaimResult(False, claim=held)  # the dead process still holds it
        taken = bus.claims.try_claim("t-1", "heir", 2_000, now=lease_until)
        assert taken.granted
        assert taken.claim == Claim("t-1", "heir", lease_until, lease_until + 2_000, 2_000, 2, 5,
                                     fence=2)
        assert bus.claims.list() == [taken.claim]


def test_reap_frees_the_claim_of_a_killed_holder_that_was_beating(db_path, children):
    Bus.open(db_path).close()
    holder = children.start("holder", "hold", str(db_path), "--agent", "holder",
                            "--task", "t-1", "--lease-ms", "3600000",
                            "--heartbeat-interval", "0.05")
    report = json.loads(holder.read_line(STARTUP_TIMEOUT))
    holder.kill(SHORT_TIMEOUT)
    assert report["beats"] >= 3

    with Bus.open(db_path) as bus:
        [beat] = bus.heartbeats.liveness()
        assert (beat.agent, beat.status, beat.task) == ("holder", "working", "t-1")
        last_beat = beat.ts_ms
        held = only_claim(bus)
        assert held.to_json_dict() == report["claim"]
        assert held.claimed_at_ms <= last_beat  # the beats went on while it held the claim

        before = snapshot(bus)
        assert bus.claims.reap(now=last_beat + 299_999) == []  # silent, but not yet dead
        assert snapshot(bus) == before
        assert not bus.claims.claim("t-1", "heir", now=last_beat + 299_999)

        now = last_beat + 300_000
        assert bus.claims.reap(now=now) == [held]
        [message] = of_type(bus, "task_released")
        assert (message.from_agent, message.to_agent, message.correlation_id) == (
            "bus", None, "t-1")
        assert message.payload == {"task": "t-1", "agent": "holder", "reason": "agent dead",
                                   "fence": 1, "silent_s": 300.0}
        taken = bus.claims.try_claim("t-1", "heir", 60_000, now=now)
        assert taken.granted
        assert (taken.claim.agent, taken.claim.attempts, taken.claim.claimed_at_ms) == (
            "heir", 2, now)
        assert bus.heartbeats.liveness()[0].ts_ms == last_beat  # nothing beat after the kill


def test_claim_by_processes_at_once_buries_each_task_once(db_path, children):
    tasks = [f"doomed-{n:02d}" for n in range(40)]
    with Bus.open(db_path) as bus:
        for task in tasks:  # one attempt allowed, and it expired long ago
            assert bus.claims.claim(task, "first", 1_000, max_attempts=1, now=T0)
    barrier = Barrier()
    try:
        claimers = [
            children.start(f"claimer-{n}", "claim-all", str(db_path), "--agent", f"claimer-{n}",
                           "--tasks", ",".join(tasks), "--seed", str(n),
                           "--go-fd", str(barrier.read_fd), pass_fds=(barrier.read_fd,))
            for n in range(RACERS)
        ]
        barrier.release(claimers, STARTUP_TIMEOUT)
    finally:
        barrier.close()
    for claimer in claimers:
        report = json.loads(claimer.read_line(SHORT_TIMEOUT))
        claimer.wait_ok(SHORT_TIMEOUT)
        assert report["granted"] == [], claimer.describe()
        assert sorted(report["dead"]) == tasks

    with Bus.open(db_path) as bus:
        assert bus.claims.list() == []
        buried = bus.claims.dead()
        assert sorted(d.task_id for d in buried) == tasks
        assert all((d.last_holder, d.attempts) == ("first", 1) for d in buried)
        announced = of_type(bus, "task_dead")
        assert sorted(m.correlation_id for m in announced) == tasks  # once each
        assert bus.message_count() == len(tasks)


# --- real processes: 8 racing for 100 tasks -------------------------------------------------

RACE_TASKS = 100
RACE_SECONDS = 3.0
RACE_LEASE_MS = (30, 80)


def test_claim_race_between_processes_never_has_two_holders(tmp_path, db_path, children):
    Bus.open(db_path).close()
    barrier = Barrier()
    try:
        racers = [
            children.start(f"racer-{n}", "race", str(db_path), "--agent", f"racer-{n}",
                           "--tasks", str(RACE_TASKS), "--seconds", str(RACE_SECONDS),
                           "--lease-min", str(RACE_LEASE_MS[0]),
                           "--lease-max", str(RACE_LEASE_MS[1]),
                           "--seed", str(1000 + n), "--out", str(tmp_path / f"racer-{n}.jsonl"),
                           "--go-fd", str(barrier.read_fd), pass_fds=(barrier.read_fd,))
            for n in range(RACERS)
        ]
        barrier.release(racers, STARTUP_TIMEOUT)
    finally:
        barrier.close()
    deadline = time.monotonic() + RACE_SECONDS + SHORT_TIMEOUT
    summaries = {}
    for racer in racers:
        racer.wait_ok(deadline - time.monotonic())
        summaries[racer.name] = json.loads(racer.read_line(SHORT_TIMEOUT))

    per_racer = [
        [json.loads(line) for line in (tmp_path / f"racer-{n}.jsonl").read_text().splitlines()]
        for n in range(RACERS)
    ]
    for n, records in enumerate(per_racer):
        assert len(records) == summaries[f"racer-{n}"]["grants"]
    holdings = holdings_from_grants(per_racer)
    by_task = defaultdict(list)
    for holding in holdings:
        by_task[holding["task"]].append(holding)
    for task_holdings in by_task.values():
        task_holdings.sort(key=lambda h: (h["start"], h["end"]))

    check_one_holder_at_a_time(by_task)
    check_attempts_follow_the_holdings(by_task)
    check_fences_number_the_holdings(by_task)
    with Bus.open(db_path) as bus:
        check_final_claims_match_the_last_holdings(by_task, bus.claims.list())
        assert bus.claims.dead() == []

    grants = [record for records in per_racer for record in records]
    takeovers = sum(h["attempts"] > 1 for h in holdings)
    released = sum(bool(r.get("release_ok")) for r in grants)
    release_refused = sum(r.get("release_ok") is False for r in grants)
    extensions = sum(not r["new_holding"] for r in grants)
    shared = sum(len({h["agent"] for h in hs}) > 1 for hs in by_task.values())
    print(f"\n{len(grants)} grants in {len(holdings)} holdings of {len(by_task)} tasks;"
          f" {takeovers} takeovers after expiry, {released} releases"
          f" ({release_refused} refused), {extensions} extensions,"
          f" {sum(s['refused'] for s in summaries.values())} claims refused")
    # both ways a holding ends were exercised, many times over
    assert takeovers >= 50, summaries
    assert released >= 50, summaries
    assert extensions >= 10, summaries
    assert shared >= RACE_TASKS // 2, summaries
    assert sum(s["refused"] for s in summaries.values()) >= 100, summaries


def holdings_from_grants(per_racer: list[list[dict]]) -> list[dict]:
    """Group each racer's grants into holdings: a new holding, then its extensions.

    A holding ends when its last grant's lease runs out, or when the racer
    started a release that returned True (the release commits after
    `t_before_release`, so the next holder's start, taken under the write
    lock, cannot be earlier). A release that returned False ends nothing.
    """
    holdings = []
    for records in per_racer:
        current: dict[str, dict] = {}
        for record in records:
            task = record["task"]
            if record["new_holding"] or task not in current:
                assert record["new_holding"], f"extension of nothing: {record}"
                holding = {"task": task, "agent": record["agent"], "start": record["start"],
                           "attempts": record["attempts"], "fence": record["fence"],
                           "grants": []}
                holdings.append(holding)
                current[task] = holding
            holding = current[task]
            assert (record["start"], record["attempts"], record["fence"]) == (
                holding["start"], holding["attempts"], holding["fence"]), (
                f"extension changed the claim: {record}")
            holding["grants"].append(record)
            end = record["lease_until_ms"]
            if record.get("release_ok"):
                end = min(end, record["t_before_release"])
                del current[task]
            holding["end"] = end
            holding["released"] = bool(record.get("release_ok"))
    return holdings


def describe(holding: dict) -> str:
    return (f"{holding['agent']} from {holding['start']} to {holding['end']}"
            f" (attempts {holding['attempts']}, grants {holding['grants']})")


def check_one_holder_at_a_time(by_task: dict[str, list[dict]]) -> None:
    overlaps = []
    for task, holdings in by_task.items():
        held_until, holder = None, None
        for holding in holdings:
            if held_until is not None and holding["start"] < held_until:
                overlaps.append(f"{task}: {describe(holding)} began while {describe(holder)}")
            if held_until is None or holding["end"] > held_until:
                held_until, holder = holding["end"], holding
    assert not overlaps, f"{len(overlaps)} overlapping holdings, e.g.:\n" + "\n".join(overlaps[:5])


def check_attempts_follow_the_holdings(by_task: dict[str, list[dict]]) -> None:
    """A take after a release starts again at 1; a take after an expiry is one more.

    Holdings that start in the same millisecond cannot be put in order, so
    pairs next to such a tie are skipped (they are rare).
    """
    checked = 0
    for task, holdings in by_task.items():
        starts = [h["start"] for h in holdings]
        unique = [starts.count(s) == 1 for s in starts]
        if unique[0]:
            assert holdings[0]["attempts"] == 1, f"{task}: first {describe(holdings[0])}"
        for i in range(1, len(holdings)):
            if not (unique[i] and unique[i - 1]):
                continue
            before, after = holdings[i - 1], holdings[i]
            expected = 1 if before["released"] else before["attempts"] + 1
            assert after["attempts"] == expected, (
                f"{task}: {describe(after)} after {describe(before)}")
            checked += 1
    assert checked >= 100


def check_fences_number_the_holdings(by_task: dict[str, list[dict]]) -> None:
    """Each task's holdings, across all racers, have the fences 1, 2, 3... with no
    repeat and no gap, in the order they began (ties in a millisecond aside)."""
    for task, holdings in by_task.items():
        fences = [h["fence"] for h in holdings]
        assert sorted(fences) == list(range(1, len(holdings) + 1)), f"{task}: {fences}"
        starts = [h["start"] for h in holdings]  # holdings are sorted by start
        for before, after in zip(holdings, holdings[1:]):
            if starts.count(before["start"]) == 1 and starts.count(after["start"]) == 1:
                assert before["fence"] < after["fence"], (
                    f"{task}: {describe(after)} has fence {after['fence']}, not above"
                    f" {describe(before)}'s {before['fence']}")


def check_final_claims_match_the_last_holdings(by_task: dict[str, list[dict]],
                                               claims: list[Claim]) -> None:
    rows = {c.task_id: c for c in claims}
    assert set(rows) <= set(by_task)
    for task, holdings in by_task.items():
        last = holdings[-1]
        if len(holdings) > 1 and holdings[-2]["start"] == last["start"]:
            continue  # two holdings in one millisecond: which was last is unknown
        if last["released"]:
            assert task not in rows, f"{task}: released by {describe(last)}, but {rows[task]}"
        else:
            grant = last["grants"][-1]
            assert rows[task] == Claim(task, last["agent"], last["start"],
                                       grant["lease_until_ms"], grant["lease_ms"],
                                       last["attempts"], 1_000_000_000, last["fence"]), task


def test_claim_operations_refuse_to_run_outside_a_write_transaction(bus: Bus) -> None:
    """The operations run inside the caller's transaction (`bus.write()`): outside one,
    each statement would commit alone, so they refuse and write nothing."""
    from bus.coordination import claims
    from bus.storage.errors import BusError
    with pytest.raises(BusError, match="inside a write transaction"):
        claims.try_claim(bus.conn, "t-1", "alice", now=T0)
    assert bus.claims.list() == []
    with bus.write() as conn:
        assert claims.try_claim(conn, "t-1", "alice", now=T0).granted
        assert claims.release(conn, "t-1", "alice")
    assert bus.claims.list() == []
