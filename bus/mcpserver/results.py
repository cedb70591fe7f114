"""Tool results as a model reads them: each field once, no empty ones.

Some clients show the model the structured result as JSON and drop the text
beside it (Claude Code sends `JSON.stringify(structuredContent)`), so the
structured result itself must be compact. The library's records are written
for people and for the export, which want every field every time; a tool's
result leaves out, in the records it carries:

- a field that is null (`correlation_id`, `to` of a broadcast, `reply` of an
  exchange that timed out): absent means null;
- inside a record, an empty list, object or string (`waiting_on: []`); the
  result's own lists stay, so `messages: []` says that nothing waits;
- the epoch-milliseconds twin of a time the record also gives as ISO text
  (`ts_ms` beside `ts`, `expires_at_ms` beside `expires`): the text is kept.

What agents sent (`payload`, a channel message's `content`) is kept as sent.
docs/mcp.md documents the shape.
"""

from __future__ import annotations

from typing import Any

# Fields holding what an agent sent: kept whole (an empty object or a null inside is data).
DATA_FIELDS = frozenset({"payload", "content"})


def compact(result: dict[str, Any]) -> dict[str, Any]:
    """`result` with its records compacted and its null fields left out (its lists kept)."""
    return {key: value if key in DATA_FIELDS else _compact(value)
            for key, value in _without_twins(result).items() if value is not None}


def _compact(value: Any) -> Any:
    if isinstance(value, dict):
        return _record(value)
    if isinstance(value, list):
        return [_compact(item) for item in value]
    return value


def _record(record: dict[str, Any]) -> dict[str, Any]:
    kept = {}
    for key, value in _without_twins(record).items():
        if key not in DATA_FIELDS:
            value = _compact(value)
            if value == "" or value == [] or value == {}:
                continue
        if value is not None:
            kept[key] = value
    return kept


def _without_twins(record: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in record.items() if not _twin(key, record)}


def _twin(key: str, record: dict[str, Any]) -> bool:
    """Whether `key` is a time in epoch ms that `record` also gives as ISO text."""
    if not key.endswith("_ms"):
        return False
    stem = key[:-3]
    return isinstance(record.get(stem), str) or (
        stem.endswith("_at") and isinstance(record.get(stem[:-3]), str))
