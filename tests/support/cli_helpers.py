"""Helpers shared by the CLI tests: run `bus` in-process, read JSON lines, format times."""

from __future__ import annotations

import json
from datetime import datetime
from datetime import timedelta
from datetime import timezone
from pathlib import Path

from click.testing import CliRunner

from bus.cli import main


def run(args: list[str], db: Path | str | None = None, *, input: str | bytes | None = None,
        env: dict[str, str | None] | None = None):
    """Invoke the CLI in-process; BUS_DB / BUS_DURABILITY from the caller's shell are hidden."""
    full_env: dict[str, str | None] = {"BUS_DB": None, "BUS_DURABILITY": None}
    full_env.update(env or {})
    argv = (["--db", str(db)] if db is not None else []) + args
    return CliRunner().invoke(main, argv, input=input, env=full_env, catch_exceptions=False)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


def iso(ts_ms: int) -> str:
    """ISO 8601 UTC with milliseconds, computed independently of bus.log.messages.iso_utc."""
    moment = datetime.fromtimestamp(ts_ms // 1000, tz=timezone.utc) + timedelta(
        milliseconds=ts_ms % 1000)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def bad_value(flag: str, reason: str) -> str:
    """The error a refused option value ends stderr with (exit 2, after the usage lines)."""
    return f"Error: Invalid value for '{flag}': {reason}\n"


def last_error(stderr: str) -> str:
    """stderr from its last `Error: ` on (a usage error prints the usage lines first)."""
    return stderr[stderr.rindex("Error: "):]
