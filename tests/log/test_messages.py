"""Validation and payload encoding of messages."""

from __future__ import annotations

import math
import re
from datetime import datetime
from datetime import timedelta
from datetime import timezone

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.log.messages import encode_payload
from bus.log.messages import iso_utc
from bus.log.messages import prepare_batch
from bus.log.messages import prepare_row
from bus.log.messages import row_to_message
from bus.log.messages import validate_agent_id

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_encode_payload_round_trips_json_values(value):
    text = encode_payload(value)
    assert (text is None) == (value is None)
    if text is not None:
        assert orjson.loads(text) == value


@pytest.mark.parametrize("value", [float("nan"), [1, float("inf")], {"a": {"b": -math.inf}}])
def test_encode_payload_refuses_nan_and_infinity(value):
    with pytest.raises(ValidationFailed, match="NaN or infinity"):
        encode_payload(value)


@pytest.mark.parametrize("value, problem", [
    ({1, 2}, "not JSON-serialisable"),
    (object(), "not JSON-serialisable"),
    ({1: "non-string key"}, "not JSON-serialisable"),
    (2**70, "not JSON-serialisable"),
])
def test_encode_payload_refuses_non_json(value, problem):
    with pytest.raises(ValidationFailed) as info:
        encode_payload(value)
    assert info.value.field == "payload"
    assert problem in info.value.reason


@pytest.mark.parametrize("agent", ["a", "worker-1", "team.alpha:planner_2", "x" * 128])
def test_validate_agent_id_accepts(agent):
    assert validate_agent_id(agent) == agent


@pytest.mark.parametrize("agent, problem", [
    ("", "must not be empty"),
    ("x" * 129, "129 characters long; the limit is 128"),
    ("a b", "contains ' '; allowed are letters, digits and . _ : -"),
    ("naïve", "contains 'ï'"),
    ("a/b", "contains '/'"),
    (None, "must be a string, got NoneType"),
    (7, "must be a string, got int"),
])
def test_validate_agent_id_names_the_problem(agent, problem):
    with pytest.raises(ValidationFailed) as info:
        validate_agent_id(agent, "to")
    assert info.value.field == "to"
    assert problem in info.value.reason


def test_prepare_row_normalises_caller_uuid_to_lower_case():
    row = prepare_row("a", "t", id="AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE")
    assert row.id == "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"


@pytest.mark.parametrize("kwargs, field", [
    ({"id": "not-a-uuid"}, "id"),
    ({"id": 12}, "id"),
    ({"type": ""}, "type"),
    ({"type": "t" * 129}, "type"),
    ({"correlation_id": ""}, "correlation_id"),
    ({"in_reply_to": "r" * 257}, "in_reply_to"),
    ({"to": "b c"}, "to"),
])
def test_prepare_row_rejects_bad_fields(kwargs, field):
    args = {"from_agent": "a", "type": "t", **kwargs}
    with pytest.raises(ValidationFailed) as info:
        prepare_row(**args)
    assert info.value.field == field


def test_prepare_batch_names_item_and_key():
    with pytest.raises(ValidationFailed) as info:
        prepare_batch([{"from_agent": "a", "type": "t"}, {"from_agent": "a", "type": ""}])
    assert info.value.field == "messages[1].type"
    with pytest.raises(ValidationFailed) as info:
        prepare_batch([{"from_agent": "a", "type": "t", "form": "x"}])
    assert info.value.field == "messages[0].form"
    assert "accepted keys: from_agent, type" in info.value.reason
    with pytest.raises(ValidationFailed, match=r"messages\[0\]\.type: is required"):
        prepare_batch([{"from_agent": "a"}])
    with pytest.raises(ValidationFailed, match="must be a dict"):
        prepare_batch(["not a dict"])


def test_row_to_message_reports_undecodable_payload_instead_of_raising():
    message = row_to_message((1, "id", 0, "a", None, "t", None, None, "{broken", None))
    assert message.payload is None
    assert message.payload_error == "decode_failed"


def test_row_to_message_reports_unresolvable_blob_reference():
    message = row_to_message((1, "id", 0, "a", None, "t", None, None, None, "sha256-00"))
    assert (message.payload, message.payload_error, message.payload_ref) == (
        None, "blob_missing", "sha256-00")


def test_message_json_form_uses_export_field_names():
    message = Message(3, "id-3", 1_700_000_000_123, "a", "b", "t", "c", "r", {"k": 1})
    assert message.to_json_dict() == {
        "seq": 3, "id": "id-3", "ts_ms": 1_700_000_000_123, "ts": "2023-11-14T22:13:20.123Z",
        "from": "a", "to": "b", "type": "t", "correlation_id": "c", "in_reply_to": "r",
        "payload": {"k": 1},
    }


@given(st.integers(0, 253_402_300_799_999))
def test_iso_utc_round_trips_to_the_millisecond(ts_ms):
    text = iso_utc(ts_ms)
    assert text.endswith("Z")
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    assert (parsed - EPOCH) // timedelta(milliseconds=1) == ts_ms


@given(st.lists(st.one_of(st.text(max_size=140), st.from_regex(r"[A-Za-z0-9._:-]{1,130}",
                                                                fullmatch=True)), max_size=50))
def test_validate_agent_id_answers_alike_whether_seen_before_or_not(values):
    """The cache of valid ids never changes an answer: each value twice, same result."""
    rule = re.compile(r"[A-Za-z0-9._:-]{1,128}")
    for value in values + values:
        valid = rule.fullmatch(value) is not None
        try:
            assert validate_agent_id(value) == value and valid
        except ValidationFailed:
            assert not valid
