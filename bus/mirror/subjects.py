"""Subjects and headers of the mirror: how a bus message is named on NATS.

A message goes to `bus.<type>.<recipient>`, each token made safe for a
subject (a NATS token cannot hold `.`, `*`, `>` or whitespace: each other
character outside letters, digits, `_`, `:` and `-` becomes `_`), and `~all`
for a broadcast (no agent id holds `~`). The exact values travel in
headers, with the message id as `Nats-Msg-Id`, so JetStream's deduplication
and the bus's idempotent publish share one key.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit

from bus.storage.errors import ValidationFailed
from bus.log.messages import Message
from bus.mirror.errors import ImportSubjectsInvalid
from bus.mirror.errors import NatsUrlInvalid

PREFIX = "bus"
STREAM_SUBJECTS = [f"{PREFIX}.>"]
BROADCAST = "~all"
MSG_ID = "Nats-Msg-Id"
EXPECTED_LAST_MSG_ID = "Nats-Expected-Last-Msg-Id"
EXPECTED_LAST_SEQUENCE = "Nats-Expected-Last-Sequence"
BUS_SEQ = "Bus-Seq"
BUS_FROM = "Bus-From"
BUS_TO = "Bus-To"
BUS_TYPE = "Bus-Type"
URL_SCHEMES = ("nats", "tls", "ws", "wss")
CURSOR_PREFIX = "mirror:nats:"  # `bus consumers` shows cursors so named as the mirror's
_UNSAFE = re.compile(r"[^A-Za-z0-9_:-]")
_STREAM_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")
_SUBJECT_TOKEN = re.compile(r"[^\s.*>]+|\*|>")


def cursor_name(stream: str) -> str:
    """The bus cursor that holds the mirror's position: `mirror:nats:<stream>`."""
    return f"{CURSOR_PREFIX}{stream}"


def token(text: str) -> str:
    """`text` made safe as one subject token (`task.done` -> `task_done`)."""
    return _UNSAFE.sub("_", text) or "_"


def subject_for(message: Message) -> str:
    """`bus.<type>.<recipient>` for `message`."""
    recipient = BROADCAST if message.to_agent is None else token(message.to_agent)
    return f"{PREFIX}.{token(message.type)}.{recipient}"


def headers_for(message: Message) -> dict[str, str]:
    """The headers that carry the message's exact fields (a subject's tokens are lossy)."""
    headers = {MSG_ID: message.id, BUS_SEQ: str(message.seq), BUS_FROM: message.from_agent,
               BUS_TYPE: message.type}
    if message.to_agent is not None:
        headers[BUS_TO] = message.to_agent
    return headers


def validate_url(url: str) -> str:
    """A NATS server URL (or several, comma-separated); raises NatsUrlInvalid."""
    for one in url.split(","):
        try:
            parts = urlsplit(one.strip())
            parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        except ValueError as exc:
            raise NatsUrlInvalid(url, f"is malformed ({exc})") from None
        if parts.scheme not in URL_SCHEMES:
            raise NatsUrlInvalid(url, "is not a NATS URL")
        if not parts.hostname:
            raise NatsUrlInvalid(url, "names no host")
    return url


def validate_stream_name(name: str) -> str:
    """A JetStream stream name: letters, digits, `_` and `-` (no `.`, `*`, `>`, spaces)."""
    if not isinstance(name, str) or not _STREAM_NAME.fullmatch(name):
        raise ValidationFailed("--stream", f"{name!r} is not a stream name: use letters, digits,"
                               " _ and - (up to 200)", value=name)
    return name


def import_subjects(text: str) -> list[str]:
    """The subjects `--import` names (comma-separated), checked; never inside bus.>."""
    subjects = [s.strip() for s in text.split(",") if s.strip()]
    if not subjects:
        raise ImportSubjectsInvalid(text, "names no subject")
    for subject in subjects:
        tokens = subject.split(".")
        if not all(_SUBJECT_TOKEN.fullmatch(t) for t in tokens) or ">" in tokens[:-1]:
            raise ImportSubjectsInvalid(text, f"has {subject!r}, which is not a NATS subject")
        if tokens[0] in (PREFIX, "*", ">"):
            raise ImportSubjectsInvalid(text, f"has {subject!r}, which overlaps bus.>, where"
                                        " the mirror publishes the log (it would come back)")
    return subjects
