"""Full-text search over payloads (bus/log/search.py): found by their words, kept in step
with publishes and compaction, filters, refusals, and `bus search` through CliRunner."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.cli import main
from bus.storage.errors import SearchDisabled
from bus.storage.errors import ValidationFailed
from bus.log.messages import now_ms
from tests.support.cli_helpers import last_error
from tests.support.properties import scaled_settings

# Words the unicode61 tokenizer keeps whole: letters only, and not FTS5's operators.
WORDS = st.text("abcdefghijklmnopqrstuvwxyzéøß", min_size=3, max_size=12).filter(
    lambda word: word.upper() not in ("AND", "OR", "NOT", "NEAR"))
PAYLOADS = st.lists(st.lists(WORDS, min_size=1, max_size=6), min_size=1, max_size=8)


def found(bus: Bus, query: str, **filters) -> list[int]:
    return [hit.message.seq for hit in bus.search(query, **filters)]


@scaled_settings(max_examples=25, deadline=None)
@given(PAYLOADS, st.booleans())
def test_payloads_are_found_by_their_words_until_compaction_removes_them(payloads, as_dict):
    with tempfile.TemporaryDirectory() as directory, Bus.open(Path(directory) / "b.db") as bus:
        bus.enable_search()
        seqs = []
        for words in payloads:
            text = " ".join(words)
            payload = {"note": text} if as_dict else text
            seqs.append(bus.publish("writer", "note", payload).seq)
        for seq, words in zip(seqs, payloads):
            for word in words:
                assert seq in found(bus, f'"{word}"', limit=10_000)
        newest = bus.publish("writer", "end").seq  # no payload; compaction keeps the newest
        bus.ack("reader", newest)
        assert bus.compact(0, now=now_ms() + 60_000).messages == len(seqs)
        for words in payloads:
            for word in words:
                assert found(bus, f'"{word}"') == []
        # Gone from the index itself, not only hidden by the join with `messages`.
        assert bus.conn.execute("SELECT count(*) FROM message_search").get == 0


def test_enabling_indexes_the_log_so_far_and_is_idempotent(bus: Bus) -> None:
    bus.publish("a", "note", "the frontend deploy failed")
    bus.publish_many([{"from_agent": "b", "type": "note", "payload": "backend deployed"}])
    assert bus.enable_search() == 2
    assert bus.enable_search() == 2
    bus.publish("c", "note", {"text": "deploying again"})
    assert sorted(found(bus, "deploy*")) == [1, 2, 3]
    assert found(bus, "frontend AND failed") == [1]
    assert found(bus, '"frontend deploy"') == [1]
    assert found(bus, "backend NOT frontend") == [2]


def test_the_best_match_comes_first(bus: Bus) -> None:
    bus.enable_search()
    bus.publish("a", "note", "one mention of kafka in a long sentence about many other things")
    bus.publish("a", "note", "kafka kafka kafka")
    assert found(bus, "kafka") == [2, 1]


def test_filters_narrow_the_hits(bus: Bus) -> None:
    bus.enable_search()
    bus.publish("ci", "build", "frontend build passed", to="deploy")
    second = bus.publish("ci", "alert", "frontend build failed")
    bus.publish("ops", "build", "frontend build queued")
    assert found(bus, "frontend", type="build") == [1, 3]
    assert found(bus, "frontend", from_agent="ci") == [1, 2]
    assert found(bus, "frontend", to="deploy") == [1]
    ts = bus.conn.execute("SELECT ts_ms FROM messages WHERE seq = ?", (second.seq,)).get
    bus.conn.execute("UPDATE messages SET ts_ms = ts_ms - 1000 WHERE seq = 1")
    assert 1 not in found(bus, "frontend", since_ms=ts)
    assert found(bus, "frontend", limit=1) and len(found(bus, "frontend", limit=1)) == 1


def test_channel_messages_and_envelopes_are_indexed_too(bus: Bus) -> None:
    bus.enable_search()
    ch = bus.channels
    ch.create_channel("ci", "group", "ci-agent")
    ch.join_channel("ci", "deploy-agent")
    sent = ch.send_message("ci", "ci-agent", "text", "canary rollout started")
    assert found(bus, "canary", to="#ci") == [sent.seq]


def test_search_refusals_name_the_field(bus: Bus) -> None:
    with pytest.raises(SearchDisabled, match="bus search --enable"):
        bus.search("anything")
    bus.enable_search()
    for query, field in (('"unbalanced', "query"), ("", "query"), ("x" * 1001, "query")):
        with pytest.raises(ValidationFailed) as caught:
            bus.search(query)
        assert caught.value.field == field
    with pytest.raises(ValidationFailed, match="limit"):
        bus.search("x", limit=0)
    with pytest.raises(ValidationFailed, match="since_ms"):
        bus.search("x", since_ms="yesterday")


def test_disabling_drops_the_index_and_publishes_stop_paying(bus: Bus) -> None:
    bus.enable_search()
    bus.disable_search()
    bus.publish("a", "note", "not indexed")
    names = {name for (name,) in bus.conn.execute(
        "SELECT name FROM sqlite_master WHERE name LIKE 'message_search%'")}
    assert names == set()
    assert bus.enable_search() == 1  # rebuilt from the log
    assert found(bus, "indexed") == [1]


# --- bus search ---------------------------------------------------------------------------


def run(args: list[str], db: Path):
    return CliRunner().invoke(main, ["--db", str(db), *args],
                              env={"BUS_DB": None, "BUS_DURABILITY": None},
                              catch_exceptions=False)


def test_cli_search_enables_then_finds(bus: Bus, db_path: Path) -> None:
    bus.publish("ci-agent", "note", "the frontend deploy failed")
    bus.publish("ops", "note", "backend is fine")
    disabled = run(["search", "deploy"], db_path)
    assert disabled.exit_code == 1
    assert disabled.stderr.startswith("Error: search: full-text search is not enabled")
    enabled = run(["search", "--enable", "--json"], db_path)
    assert json.loads(enabled.stdout) == {"search": "enabled", "indexed": 2}
    hits = run(["search", "deploy*", "--from", "ci-agent", "--json"], db_path)
    assert hits.exit_code == 0
    (hit,) = [json.loads(line) for line in hits.stdout.splitlines()]
    assert (hit["seq"], hit["payload"]) == (1, "the frontend deploy failed")
    assert isinstance(hit["rank"], float)
    human = run(["search", "deploy*"], db_path)
    assert human.stdout.startswith("#1  ") and human.stdout.endswith(
        'ci-agent -> *  note  "the frontend deploy failed"\n')
    assert run(["search", "nothing-like-this"], db_path).stdout == ""


def test_cli_search_bad_input(bus: Bus, db_path: Path) -> None:
    assert run(["search", "--enable"], db_path).stdout == "search enabled: 0 messages indexed\n"
    bad = run(["search", '"open'], db_path)
    assert bad.exit_code == 2
    assert last_error(bad.stderr).startswith("Error: Invalid value for '[QUERY]': unterminated")
    since = run(["search", "x", "--since", "yesterday"], db_path)
    assert since.exit_code == 2 and "neither epoch milliseconds nor an ISO 8601" in since.stderr
    assert run(["search"], db_path).exit_code == 2
    assert run(["search", "x", "--enable", "--disable"], db_path).exit_code == 2
    assert run(["search", "x", "--since", "2026-11-22T18:00:00Z"], db_path).exit_code == 0
    assert run(["search", "--disable"], db_path).stdout == "search disabled\n"
