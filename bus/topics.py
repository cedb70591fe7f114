"""Pub/sub topics and subscription patterns (seed 004, "Topic Matching").

A topic is dot-separated segments (`build.frontend.complete`). A pattern is
the same, where a segment may be `*` (exactly one segment) and the last
segment may be `#` (zero or more segments): `build.*.complete`, `deploy.#`.

`matches` is the seed's algorithm, kept as the plain reference; `TopicIndex`
answers the same question for many subscriptions at once without checking
each one, tiered as the seed describes: exact patterns by dictionary lookup,
`*` patterns grouped by segment count and literal prefix, `#` patterns by
literal prefix.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable

from bus.errors import ValidationFailed

TOPIC_MAX = 256
_SEGMENT = re.compile(r"[A-Za-z0-9_-]+")
SINGLE = "*"
MULTI = "#"

Segments = tuple[str, ...]


def validate_topic(value: object, field: str = "topic") -> str:
    """A concrete topic: 1-256 characters, segments of letters, digits, _ and -."""
    text = _checked_text(value, field)
    for segment in text.split("."):
        if not _SEGMENT.fullmatch(segment):
            raise ValidationFailed(field, f"segment {segment!r} of {text!r} is not allowed; a topic"
                                          " is dot-separated segments of letters, digits, _ and -"
                                          " (wildcards * and # only in subscription patterns)")
    return text


def validate_pattern(value: object, field: str = "topic_pattern") -> str:
    """A subscription pattern: topic segments, `*` for one segment, a final `#` for any rest."""
    text = _checked_text(value, field)
    segments = text.split(".")
    for index, segment in enumerate(segments):
        if segment == SINGLE or _SEGMENT.fullmatch(segment):
            continue
        if segment == MULTI and index == len(segments) - 1:
            continue
        where = "only as the last segment" if segment == MULTI else "as a whole segment"
        raise ValidationFailed(field, f"segment {segment!r} of {text!r} is not allowed; use letters,"
                                      f" digits, _ and -, '*' for one segment, '#' {where}")
    return text


def _checked_text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ValidationFailed(field, f"must be a string, got {type(value).__name__}")
    if not value or len(value) > TOPIC_MAX:
        raise ValidationFailed(field, f"must be 1-{TOPIC_MAX} characters, got {len(value)}")
    return value


def matches(topic: str, pattern: str) -> bool:
    """Whether `topic` matches `pattern`: the seed's reference algorithm."""
    topic_segments = topic.split(".")
    pattern_segments = pattern.split(".")
    if pattern_segments[-1] == MULTI:
        prefix = pattern_segments[:-1]
        if len(topic_segments) < len(prefix):
            return False
        return all(p in (SINGLE, t) for p, t in zip(prefix, topic_segments))
    if len(topic_segments) != len(pattern_segments):
        return False
    return all(p in (SINGLE, t) for p, t in zip(pattern_segments, topic_segments))


def _literal_prefix(segments: Segments) -> Segments:
    """The segments before the first wildcard."""
    for index, segment in enumerate(segments):
        if segment in (SINGLE, MULTI):
            return segments[:index]
    return segments


def _fits(pattern: Segments, topic: Segments) -> bool:
    return all(p == SINGLE or p == t for p, t in zip(pattern, topic))


class TopicIndex:
    """Which subscribers a topic reaches, for many (pattern, subscriber) pairs.

    >>> index = TopicIndex([("build.*.success", "deploy"), ("deploy.#", "monitor")])
    >>> index.match("build.frontend.success")
    {'deploy'}
    """

    def __init__(self, subscriptions: Iterable[tuple[str, str]] = ()) -> None:
        self._exact: dict[str, set[str]] = defaultdict(set)
        # (segment count, literal prefix) -> [(pattern segments, subscriber)]
        self._single: dict[tuple[int, Segments], list[tuple[Segments, str]]] = defaultdict(list)
        # literal prefix -> [(segments before '#', subscriber)]
        self._multi: dict[Segments, list[tuple[Segments, str]]] = defaultdict(list)
        self._longest_prefix = 0
        for pattern, subscriber in subscriptions:
            self.add(pattern, subscriber)

    def add(self, pattern: str, subscriber: str) -> None:
        segments = tuple(pattern.split("."))
        if segments[-1] == MULTI:
            segments = segments[:-1]
            prefix = _literal_prefix(segments)
            self._multi[prefix].append((segments, subscriber))
        elif SINGLE in segments:
            prefix = _literal_prefix(segments)
            self._single[(len(segments), prefix)].append((segments, subscriber))
        else:
            self._exact[pattern].add(subscriber)
            return
        self._longest_prefix = max(self._longest_prefix, len(prefix))

    def match(self, topic: str) -> set[str]:
        """Every subscriber with at least one pattern matching `topic`."""
        found = set(self._exact.get(topic, ()))
        segments = tuple(topic.split("."))
        count = len(segments)
        for length in range(min(count, self._longest_prefix) + 1):
            prefix = segments[:length]
            for pattern, subscriber in self._single.get((count, prefix), ()):
                if subscriber not in found and _fits(pattern, segments):
                    found.add(subscriber)
            for pattern, subscriber in self._multi.get(prefix, ()):
                if subscriber not in found and len(pattern) <= count and _fits(pattern, segments):
                    found.add(subscriber)
        return found
