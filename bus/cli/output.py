"""How the `bus` command prints: human lines and tables, or JSON (one object per line)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Sequence

import click
import orjson

from bus.log.messages import Message
from bus.views.render import table_lines

PAYLOAD_PREVIEW = 200  # characters of payload JSON on a human-readable line


def echo_json(obj: Any) -> None:
    click.echo(orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS).decode())


def shown_path(path: str | Path) -> str:
    """A path relative to the current directory when it is below it (shorter to read)."""
    path = Path(path)
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def echo_messages(found: Iterable[Any], as_json: bool,
                  format: Callable[[Any], str] | None = None) -> None:
    """A message stream: one JSON object per line, or one `format`ted line each."""
    for message in found:
        if as_json:
            echo_json(message.to_json_dict())
        else:
            click.echo((format or format_message)(message))


def format_message(message: Message) -> str:
    """One line per message: #seq time from -> to type [refs] payload."""
    to = message.to_agent if message.to_agent is not None else "*"
    parts = [f"#{message.seq}", message.to_json_dict()["ts"], f"{message.from_agent} -> {to}",
             message.type]
    if message.correlation_id:
        parts.append(f"corr={message.correlation_id}")
    if message.in_reply_to:
        parts.append(f"reply-to={message.in_reply_to}")
    if message.payload_error:
        parts.append(f"!{message.payload_error}")
    elif message.payload_preview is not None:  # a blob: only its first bytes were read
        parts.append(_cut(message.payload_preview, message.payload_size))
    elif message.payload is not None:
        parts.append(shortened(orjson.dumps(message.payload).decode()))
    return "  ".join(parts)


def shortened(text: str) -> str:
    """Keep a line readable: long payloads are cut (--json prints them whole)."""
    if len(text) <= PAYLOAD_PREVIEW:
        return text
    return _cut(text, len(text.encode()))


def _cut(text: str, size: int) -> str:
    return f"{text[:PAYLOAD_PREVIEW]}... ({size} bytes, see --json)"


def echo_rows(columns: list[str], rows: list[tuple[Any, ...]], as_json: bool) -> None:
    """Rows as an aligned table, or one JSON object per row and line."""
    if as_json:
        for row in _row_objects(columns, rows):
            echo_json(row)
        return
    if not columns:
        click.echo("(no rows)")
        return
    for line in table_lines(columns, [[_cell(v) for v in row] for row in rows]):
        click.echo(line)


def echo_query_rows(columns: list[str], rows: list[tuple[Any, ...]], shape: str) -> None:
    """A query's rows in `shape`: table, nl (JSON per line), json (one array) or csv."""
    if shape == "json":
        echo_json(_row_objects(columns, rows))
    elif shape == "csv":
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        if columns:
            writer.writerow(columns)
        writer.writerows([["" if v is None else _json_value(v) for v in row] for row in rows])
        click.echo(text.getvalue(), nl=False)
    else:
        echo_rows(columns, rows, shape == "nl")


def _row_objects(columns: list[str], rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    keys = _unique_names(columns)
    return [{k: _json_value(v) for k, v in zip(keys, row)} for row in rows]


def echo_listing(found: Sequence[Any], as_json: bool, empty: str, columns: list[str],
                 row: Callable[[Any], tuple[Any, ...]]) -> None:
    """Items with `to_json_dict()`: one JSON object per line, else a table (or `empty`)."""
    if as_json:
        for item in found:
            echo_json(item.to_json_dict())
    elif not found:
        click.echo(empty)
    else:
        echo_rows(columns, [row(item) for item in found], False)


def _unique_names(columns: list[str]) -> list[str]:
    """Column names as JSON keys: a repeated name gets a suffix (a, a_2) instead of vanishing."""
    seen: dict[str, int] = {}
    keys = []
    for name in columns:
        seen[name] = seen.get(name, 0) + 1
        keys.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return keys


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return "x'" + value.hex() + "'"
    return str(value)


def _json_value(value: Any) -> Any:
    return "x'" + value.hex() + "'" if isinstance(value, bytes) else value
