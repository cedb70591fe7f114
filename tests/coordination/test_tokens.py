"""bus/coordination/tokens.py on a real bus file: what a token is, and what checking one costs."""

from __future__ import annotations

import pytest

from bus import Bus
from bus.storage.errors import ValidationFailed
from bus.coordination.tokens import LAST_USED_GRAIN_MS
from bus.coordination.tokens import TokenChecker
from bus.coordination.tokens import parse_duration_ms


def data_version(bus: Bus) -> int:
    """Changes when another connection commits (sqlite.org/pragma.html#pragma_data_version)."""
    return bus.conn.execute("PRAGMA data_version").get


def test_token_checks_write_last_use_at_most_once_per_grain(bus: Bus, db_path) -> None:
    new = bus.tokens.create("w1", now=1_000)
    with Bus.open(db_path) as server:
        checker = TokenChecker(server)
        assert checker.check(new.token, now=10_000).agent == "w1"
        seen = data_version(bus)
        for offset in range(0, LAST_USED_GRAIN_MS, 997):  # a request every second, for a minute
            assert checker.check(new.token, now=10_001 + offset) is not None
        assert data_version(bus) == seen  # not one write
        checker.check(new.token, now=10_000 + LAST_USED_GRAIN_MS)
        assert data_version(bus) != seen
    assert bus.tokens.list()[0].last_used_ms == 10_000 + LAST_USED_GRAIN_MS


def test_token_refused_when_unknown_revoked_or_expired(bus: Bus) -> None:
    checker = TokenChecker(bus)
    lasting = bus.tokens.create("w1", now=0)
    brief = bus.tokens.create("w2", expires_ms=1_000, now=0)
    assert checker.check(brief.token, now=999) is not None
    assert checker.check(brief.token, now=1_000) is None
    assert checker.check(lasting.token[:-1] + "x", now=5) is None
    assert checker.check(None) is None and checker.check("") is None
    assert bus.tokens.any_usable(now=5)
    bus.tokens.revoke(lasting.id, now=10)
    assert checker.check(lasting.token, now=11) is None
    assert not bus.tokens.any_usable(now=2_000)
    with pytest.raises(ValidationFailed) as unknown:
        bus.tokens.revoke("tok-nope")
    assert unknown.value.field == "id"


def test_token_stores_only_the_hash_and_names_a_valid_agent(bus: Bus, db_path) -> None:
    new = bus.tokens.create("w1", read_only=True)
    assert new.token.startswith("abt_") and len(new.token) > 40
    bus.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    assert new.token.encode() not in db_path.read_bytes()
    assert bus.tokens.list()[0].read_only is True
    with pytest.raises(ValidationFailed):
        bus.tokens.create("no spaces allowed")


@pytest.mark.parametrize("text, ms", [("90s", 90_000), ("15m", 900_000), ("12h", 43_200_000),
                                      ("30d", 2_592_000_000)])
def test_token_durations(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "0d", "30", "d", "1w", "-1d", "1.5h"])
def test_token_durations_refused(text: str) -> None:
    with pytest.raises(ValidationFailed):
        parse_duration_ms(text)
