"""Size limits are checked before anything is written, blobs included; previews stay small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bus import Bus
from bus import ValidationFailed
from bus.api import MAX_PAYLOAD_BYTES
from bus.storage.errors import UnknownChannel
from tests.support.cli_helpers import last_error
from tests.support.cli_helpers import run

LIMIT = 10_000


def blob_files(db_path: Path) -> list[str]:
    blobs = db_path.parent / "blobs"
    return sorted(p.name for p in blobs.iterdir()) if blobs.exists() else []


def test_publish_over_the_limit_is_refused_and_writes_nothing(db_path: Path) -> None:
    with Bus.open(db_path, max_payload_bytes=LIMIT) as bus:
        with pytest.raises(ValidationFailed) as caught:
            bus.publish("a", "t", {"text": "x" * LIMIT})
        assert caught.value.field == "payload"
        assert f"the limit is {LIMIT} bytes" in caught.value.reason
        assert caught.value.details == {"value_length": LIMIT + 11}
        with pytest.raises(ValidationFailed) as caught:
            bus.publish_many([{"from_agent": "a", "type": "t", "payload": {"text": "y" * 6000}},
                              {"from_agent": "a", "type": "t", "payload": {"text": "z" * LIMIT}}])
        assert caught.value.field == "messages[1].payload"
        assert bus.last_seq() == 0
    assert blob_files(db_path) == []


def test_publish_at_the_limit_is_accepted(db_path: Path) -> None:
    with Bus.open(db_path, max_payload_bytes=LIMIT) as bus:
        payload = {"text": "x" * (LIMIT - 11)}  # {"text":"..."} is 11 bytes around the text
        assert bus.publish("a", "t", payload).seq == 1
        assert bus.poll("b")[0].payload == payload


def test_default_limit_is_16_mib(db_path: Path) -> None:
    assert MAX_PAYLOAD_BYTES == 16 * 1024 * 1024
    with Bus.open(db_path) as bus:
        assert bus.max_payload_bytes == MAX_PAYLOAD_BYTES
    with pytest.raises(ValidationFailed, match="max_payload_bytes"):
        Bus.open(db_path, max_payload_bytes=0)


def test_cli_publish_over_the_limit_exits_2(db_path: Path, tmp_path: Path) -> None:
    run(["init"], db_path)
    big = tmp_path / "big.json"
    big.write_text('{"text": "' + "x" * LIMIT + '"}')
    result = run(["--max-payload-bytes", str(LIMIT), "publish", "--from", "a", "--type", "t",
                  "--payload-file", str(big)], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr).startswith(
        f"Error: Invalid value for '--payload-file': is {LIMIT + 11} bytes of JSON; the limit"
        f" is {LIMIT} bytes")
    env = run(["publish", "--from", "a", "--type", "t", "--payload", "-"], db_path,
              input=big.read_text(), env={"BUS_MAX_PAYLOAD_BYTES": str(LIMIT)})
    assert env.exit_code == 2 and "the limit is 10000 bytes" in env.output
    assert "Invalid value for '--payload'" in env.stderr
    assert json.loads(run(["status", "--json"], db_path).stdout)["log"]["last_seq"] == 0
    assert blob_files(db_path) == []


def test_cli_refuses_input_far_over_the_limit_before_reading_it_all(db_path: Path,
                                                                    tmp_path: Path) -> None:
    run(["init"], db_path)
    huge = tmp_path / "huge.json"
    huge.write_text('{"text": "' + "x" * (3 * LIMIT) + '"}')
    result = run(["--max-payload-bytes", str(LIMIT), "publish", "--from", "a", "--type", "t",
                  "--payload-file", str(huge)], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr).startswith(
        f"Error: Invalid value for '--payload-file': is over {2 * LIMIT} bytes as given")


# --- channel sends that are refused leave no blob ----------------------------------------


@pytest.fixture
def channel_bus(db_path: Path):
    with Bus.open(db_path) as bus:
        bus.channels.create_channel("small", "group", "owner", max_message_size=5000)
        bus.channels.create_channel("room", "group", "owner")
        yield bus


@pytest.mark.parametrize("channel, sender, error, field", [
    ("nowhere", "owner", UnknownChannel, "channel"),
    ("room", "stranger", ValidationFailed, "sender"),
    ("small", "owner", ValidationFailed, "content"),
])
def test_refused_channel_send_leaves_no_blob(channel_bus: Bus, db_path: Path, channel: str,
                                             sender: str, error: type, field: str) -> None:
    before = channel_bus.last_seq()
    with pytest.raises(error) as caught:
        channel_bus.channels.send_message(channel, sender, "text", {"text": "b" * 6000})
    assert caught.value.field == field
    assert blob_files(db_path) == []
    assert channel_bus.last_seq() == before


def test_channel_send_over_the_bus_limit_is_refused_first(db_path: Path) -> None:
    with Bus.open(db_path, max_payload_bytes=LIMIT) as bus:
        bus.channels.create_channel("room", "group", "owner", max_message_size=10 * LIMIT)
        with pytest.raises(ValidationFailed) as caught:
            bus.channels.send_message("room", "owner", "text", {"text": "c" * LIMIT})
        assert caught.value.field == "content"
    assert blob_files(db_path) == []


def test_accepted_channel_send_keeps_its_blob(channel_bus: Bus, db_path: Path) -> None:
    sent = channel_bus.channels.send_message("room", "owner", "text", {"text": "d" * 6000})
    assert len(blob_files(db_path)) == 1
    assert sent.content == {"text": "d" * 6000}


# --- previews -----------------------------------------------------------------------------


def test_tail_and_poll_preview_a_blob_without_loading_it(db_path: Path) -> None:
    """The blob's last byte is changed: loading it whole would fail its hash (blob_corrupt)."""
    with Bus.open(db_path) as bus:
        bus.publish("a", "big", {"text": "e" * 1_000_000})
    (blob,) = (db_path.parent / "blobs").iterdir()
    data = blob.read_bytes()
    blob.write_bytes(data[:-3] + b'f"}')  # the last e becomes f
    for args in (["tail", "-n", "1"], ["poll", "--agent", "b"]):
        line = run(args, db_path).output
        assert line.endswith('{"text":"' + "e" * 191 + '... (1000011 bytes, see --json)\n')
    with Bus.open(db_path) as bus:
        assert bus.poll("b")[0].payload_error == "blob_corrupt"  # what a full load says
        assert bus.poll("b", preview=20)[0].payload_preview == '{"text":"eeeeeeeeeee'


def test_a_parts_message_over_the_threshold_goes_to_the_blob_store_as_a_publish(
        db_path: Path) -> None:
    """The coordination's announcements are written through the log's one write path:
    a `task_done` whose payload passes the blob threshold is a blob, as a publish's is."""
    title = "t" * 900
    with Bus.open(db_path, blob_threshold=512) as bus:
        bus.tasks.add("t1", title)
        bus.claims.try_claim("t1", "w1")
        bus.tasks.complete("t1", "w1")
        published = bus.publish("w1", "note", {"title": title})
        refs = dict(bus.conn.execute("SELECT type, payload_ref FROM messages"
                                     " WHERE payload IS NULL AND payload_ref IS NOT NULL"))
        assert set(refs) == {"task_done", "note"}
        done = [m for m in bus.list_messages(0) if m.type == "task_done"]
        assert done[0].payload["title"] == title and done[0].payload_error is None
        assert bus.list_messages(published.seq - 1, 1)[0].payload == {"title": title}
    assert len(blob_files(db_path)) == 2
