"""Pub/sub topics and subscription patterns, and matching one against the other.

A topic is dot-separated segments (`build.frontend.complete`). A pattern is
the same, where a segment may be `*` (exactly one segment) and the last
segment may be `#` (zero or more segments): `build.*.complete`, `deploy.#`.

`matches` is the plain algorithm, kept as the reference; `TopicIndex`
answers the same question for many subscriptions at once without checking
each one, in tiers: exact patterns by dictionary lookup,
`*` patterns by segment count (a trie per count), `#` patterns by prefix (a
prefix trie).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable

from bus.storage.errors import ValidationFailed

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
    """Whether `topic` matches `pattern`: the plain reference algorithm."""
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


class _Node:
    """A trie node: children by segment (a literal or '*') and who ends here."""

    __slots__ = ("children", "subscribers")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.subscribers: set[str] = set()

    def insert(self, segments: Segments, subscriber: str) -> None:
        node = self
        for segment in segments:
            node = node.children.get(segment) or node.children.setdefault(segment, _Node())
        node.subscribers.add(subscriber)

    def step(self, segment: str) -> list[_Node]:
        """The children a topic segment leads to: its literal and '*'."""
        found = []
        for key in (segment, SINGLE):
            child = self.children.get(key)
            if child is not None:
                found.append(child)
        return found


class TopicIndex:
    """Which subscribers a topic reaches, for many (pattern, subscriber) pairs.

    Three tiers: exact patterns in
    a dictionary; `*` patterns in one trie per segment count, so a topic
    only meets patterns of its own length; `#` patterns in a prefix trie
    whose nodes hold the patterns that end there. A topic walks its literal
    and `*` branches only, never the whole subscription list.

    >>> index = TopicIndex([("build.*.success", "deploy"), ("deploy.#", "monitor")])
    >>> index.match("build.frontend.success")
    {'deploy'}
    """

    def __init__(self, subscriptions: Iterable[tuple[str, str]] = ()) -> None:
        self._exact: dict[str, set[str]] = defaultdict(set)
        self._single: dict[int, _Node] = defaultdict(_Node)  # by segment count
        self._multi = _Node()  # the segments before '#'; subscribers where '#' starts
        for pattern, subscriber in subscriptions:
            self.add(pattern, subscriber)

    def add(self, pattern: str, subscriber: str) -> None:
        segments = tuple(pattern.split("."))
        if segments[-1] == MULTI:
            self._multi.insert(segments[:-1], subscriber)
        elif SINGLE in segments:
            self._single[len(segments)].insert(segments, subscriber)
        else:
            self._exact[pattern].add(subscriber)

    def match(self, topic: str) -> set[str]:
        """Every subscriber with at least one pattern matching `topic`."""
        found = set(self._exact.get(topic, ()))
        segments = topic.split(".")
        single = self._single.get(len(segments))
        level = [single] if single is not None else []
        multi = [self._multi]
        for segment in segments:
            for node in multi:  # '#' matches the rest, zero segments or more
                found |= node.subscribers
            multi = [child for node in multi for child in node.step(segment)]
            level = [child for node in level for child in node.step(segment)]
        for node in multi + level:
            found |= node.subscribers
        return found
