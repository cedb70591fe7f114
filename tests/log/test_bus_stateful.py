"""Hypothesis state machine: publish/poll/ack against a small reference model.

The model is a list of (seq, id, to, payload) and a dict of cursors. Reopening
the bus between steps stands in for a consumer that restarts at any point.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine
from hypothesis.stateful import initialize
from hypothesis.stateful import invariant
from hypothesis.stateful import precondition
from hypothesis.stateful import rule

from bus import Bus
from bus import ValidationFailed
from tests.support.properties import scaled_settings

AGENTS = st.sampled_from(["a", "b", "c"])
RECIPIENTS = st.one_of(st.none(), AGENTS)
# A small pool of ids makes retried publishes (duplicates) common.
IDS = st.one_of(st.none(), st.sampled_from([str(uuid.UUID(int=n)) for n in range(1, 6)]))
INT64 = st.integers(-(2**63), 2**63 - 1)
PAYLOADS = st.one_of(st.none(), INT64, st.text(max_size=10),
                     st.dictionaries(st.text(max_size=3), INT64, max_size=2))


class BusModel(RuleBasedStateMachine):
    @initialize()
    def open_bus(self):
        self.dir = Path(tempfile.mkdtemp(prefix="agentbus-stateful-"))
        self.bus = Bus.open(self.dir / "bus.db")
        self.log: list[tuple[int, str, str, str | None, object]] = []  # seq id from to payload
        self.cursors: dict[str, int] = {}
        self.cursor_history: dict[str, list[int]] = {}

    def teardown(self):
        self.bus.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @staticmethod
    def is_for(agent: str, sender: str, to: str | None, include_own: bool = False) -> bool:
        """Addressed to `agent` or broadcast, by another agent (by itself too with include_own)."""
        return (to == agent or to is None) and (include_own or sender != agent)

    def expected_for(self, agent: str, include_own: bool) -> list[tuple[int, object]]:
        after = self.cursors.get(agent, 0)
        return [(seq, payload) for seq, _id, sender, to, payload in self.log
                if seq > after and self.is_for(agent, sender, to, include_own)]

    def past_own(self, agent: str, seq: int) -> int:
        """`seq`, or the last of the agent's own messages after it before its next message."""
        end = seq
        for later, _id, sender, to, _payload in self.log:
            if later <= seq:
                continue
            if self.is_for(agent, sender, to):
                break
            if sender == agent and to in (None, agent):
                end = later
        return end

    @rule(sender=AGENTS, to=RECIPIENTS, message_id=IDS, payload=PAYLOADS)
    def publish(self, sender, to, message_id, payload):
        result = self.bus.publish(sender, "t", payload, to=to, id=message_id)
        known = {id_: seq for seq, id_, _s, _to, _p in self.log}
        if message_id in known:
            assert (result.duplicate, result.seq) == (True, known[message_id])
        else:
            assert not result.duplicate
            assert result.seq > (self.log[-1][0] if self.log else 0)
            self.log.append((result.seq, result.id, sender, to, payload))

    @rule(batch=st.lists(st.tuples(AGENTS, RECIPIENTS, PAYLOADS), min_size=1, max_size=5))
    def publish_many(self, batch):
        results = self.bus.publish_many(
            [{"from_agent": s, "type": "t", "to": to, "payload": p} for s, to, p in batch])
        for result, (sender, to, payload) in zip(results, batch):
            self.log.append((result.seq, result.id, sender, to, payload))

    @rule(agent=AGENTS, limit=st.integers(1, 8), include_own=st.booleans())
    def poll(self, agent, limit, include_own):
        got = [(m.seq, m.payload) for m in self.bus.poll(agent, limit, include_own=include_own)]
        assert got == self.expected_for(agent, include_own)[:limit]

    @precondition(lambda self: self.log)
    @rule(agent=AGENTS, data=st.data(), include_own=st.booleans())
    def ack(self, agent, data, include_own):
        seq = data.draw(st.sampled_from([s for s, *_ in self.log]))
        position = self.bus.ack(agent, seq, include_own=include_own)
        target = seq if include_own else self.past_own(agent, seq)
        self.cursors[agent] = max(self.cursors.get(agent, 0), target)
        assert position == self.cursors[agent]

    @rule(agent=AGENTS)
    def ack_past_the_end_is_refused(self, agent):
        beyond = (self.log[-1][0] if self.log else 0) + 1
        try:
            self.bus.ack(agent, beyond)
        except ValidationFailed:
            pass
        else:
            raise AssertionError(f"ack of never-assigned seq {beyond} was accepted")

    @rule()
    def reopen(self):
        self.bus.close()
        self.bus = Bus.open(self.dir / "bus.db", create=False)

    @invariant()
    def cursors_match_model_and_never_go_back(self):
        if not hasattr(self, "bus"):
            return
        for agent in ("a", "b", "c"):
            position = self.bus.cursor(agent)
            assert position == self.cursors.get(agent, 0)
            history = self.cursor_history.setdefault(agent, [0])
            assert position >= history[-1]
            history.append(position)


BusModel.TestCase.settings = scaled_settings(max_examples=50, stateful_step_count=30)
test_bus_matches_reference_model = BusModel.TestCase
