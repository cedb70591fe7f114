"""Gitignore-style globs for file reservations: parse one, match a path, decide overlap.

A pattern reads as a line of .gitignore does, relative to the repository root
(https://git-scm.com/docs/gitignore#_pattern_format):

- a slash at the start or in the middle anchors it at the root (`src/*.py`,
  `/setup.cfg`); without one (`*.md`, `build/`) it matches at any depth;
- a trailing slash matches directories only: `docs/` is what lies under a directory docs;
- a pattern that matches a directory matches everything under it (`src/auth`
  covers src/auth/login.py);
- `*` matches within one segment, `?` one character, `[a-z]` / `[!a-z]` (or
  `[^a-z]`) one character of a class; none of them matches `/` (as git's wildmatch);
- `**` as a whole segment: `**/x` at any depth, `x/**` everything under x,
  `a/**/b` zero or more directories between;
- `\\` makes the next character literal.

Refused, with the reason: negation (`!`) and comments (`#`), which reserve
nothing; blank patterns and surrounding spaces; `.` and `..` segments and
empty ones (`a//b`); a `/`, `\\` or `[` inside a class, and reversed ranges.

Two patterns overlap when some path matches both. `overlap` decides it exactly:
each pattern is an automaton over path segments whose edges test a segment
with a glob, itself an automaton over characters; the product of the two is
searched for its cheapest path, a segment step being possible when the two
globs have a common non-empty word (the same search one level down, over
character classes as interval sets). The search returns a witness path, or
None. The witness is the example a reservation conflict shows, so it reads as
a file name: each star matches a character where it can (`docs/*.md` gives
docs/a.md, not the hidden docs/.md), and classes give letters and digits first.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import re
from dataclasses import dataclass
from dataclasses import field
from typing import Callable
from typing import Iterable
from typing import Iterator
from typing import Union

from bus.storage.errors import ValidationFailed

MAX_CODEPOINT = 0x10FFFF
SLASH = ord("/")
PATTERN_MAX = 1024
# The characters an example path is made of where a class allows them, in this order of
# preference: a witness should read as a file name (docs/a.md), not a control character.
_FILE_NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_-"
_READABLE = [ord(c) for c in _FILE_NAME_CHARS] + [
    code for code in range(0x21, 0x7F) if chr(code) not in _FILE_NAME_CHARS + "/"]
# What a star matching nothing adds to a witness's cost: more than any path's length, so
# the search gives each star a character wherever some path allows it (`*.md` gives
# a.md, not the hidden file .md) and lets a star match nothing only where none does.
_EMPTY_STAR_COST = 1 << 20


@dataclass(frozen=True)
class CharClass:
    """The characters one position accepts, as sorted disjoint closed intervals of
    code points; never `/`."""

    intervals: tuple[tuple[int, int], ...]

    def first_common(self, other: CharClass) -> str | None:
        """A character both accept (a readable one if they can, see _READABLE), or None."""
        common = [(max(lo_a, lo_b), min(hi_a, hi_b))
                  for lo_a, hi_a in self.intervals for lo_b, hi_b in other.intervals
                  if max(lo_a, lo_b) <= min(hi_a, hi_b)]
        if not common:
            return None
        readable = (code for code in _READABLE if any(lo <= code <= hi for lo, hi in common))
        return chr(next(readable, common[0][0]))

    def regex(self) -> str:
        return "[" + "".join(_interval_regex(lo, hi) for lo, hi in self.intervals) + "]"


class _Star:
    """`*` inside a segment: any run of characters but `/`."""

    def __repr__(self) -> str:
        return "STAR"


class _Globstar:
    """`**` as a whole segment: zero or more whole segments."""

    def __repr__(self) -> str:
        return "GLOBSTAR"


STAR = _Star()
GLOBSTAR = _Globstar()
Token = Union[CharClass, _Star]
Segment = tuple  # of Token: one path segment's glob
Item = Union[Segment, _Globstar]


@dataclass(frozen=True)
class Glob:
    """A parsed pattern. `items` match a whole path (the pattern's "or anything under
    it" is made explicit); `prefix` is its leading literal segments, which every path
    it matches starts with (the index keys on it)."""

    text: str
    items: tuple[Item, ...] = field(repr=False)
    prefix: tuple[str, ...] = field(repr=False)

    @functools.cached_property
    def _regex(self) -> re.Pattern[str]:
        return re.compile(_items_regex(self.items))

    def matches(self, path: str) -> bool:
        """Whether the (normalized, see `normalize_path`) file path matches."""
        return self._regex.fullmatch(path + "/") is not None

    def overlap(self, other: Glob) -> str | None:
        """A path both match, or None when none does."""
        return _overlap(self.items, other.items)


def parse_glob(text: object, field_name: str = "pattern") -> Glob:
    """Parse a pattern; ValidationFailed (naming `field_name`) says what is wrong."""
    if not isinstance(text, str):
        raise ValidationFailed(field_name, f"must be a string, got {type(text).__name__}")
    try:
        return _parse_cached(text)
    except ValueError as exc:
        raise ValidationFailed(field_name, f"{text!r}: {exc}") from None


def normalize_path(path: object, field_name: str = "path") -> str:
    """A repository path as globs match it: `/`-separated, relative, no `.`/`..`,
    no trailing slash (`./src//a.py` is `src/a.py`)."""
    if not isinstance(path, str) or not path.strip():
        raise ValidationFailed(field_name, f"must be a file path relative to the repository"
                                           f" root, got {path!r}")
    if path.startswith("/"):
        raise ValidationFailed(field_name, f"{path!r} is absolute; give it relative to the"
                                           " repository root (src/a.py)")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts or not parts:
        raise ValidationFailed(field_name, f"{path!r} leaves the repository root; give a path"
                                           " under it (src/a.py)")
    return "/".join(parts)


# --- parsing ---------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def _parse_cached(text: str) -> Glob:
    _check_whole(text)
    segments = text.split("/")
    is_dir = segments[-1] == ""
    if is_dir:
        segments[-1] = "**"
    if segments[0] == "":
        segments = segments[1:]  # a leading slash anchors at the root
    elif len(segments) == 1 or (is_dir and len(segments) == 2):
        segments = ["**", *segments]  # no slash before the end: at any depth
    for segment in segments:
        if segment in ("", ".", ".."):
            raise ValueError("empty, `.` and `..` segments match no path git lists;"
                             " write the path from the repository root (src/a.py)")
    collapsed = [s for i, s in enumerate(segments)
                 if not (s == "**" and i and segments[i - 1] == "**")]  # `**/**` is `**`
    items = _items(collapsed, is_dir)
    return Glob(text, items, _literal_prefix(items))


def _check_whole(text: str) -> None:
    if not text.strip():
        raise ValueError("is blank; give a path or glob such as src/auth/**")
    if len(text) > PATTERN_MAX:
        raise ValueError(f"is {len(text)} characters; at most {PATTERN_MAX}")
    if text != text.strip():
        raise ValueError("has spaces at its start or end; remove them")
    if text[0] in "!#":
        raise ValueError(f"starts with {text[0]!r} (a negation or comment in .gitignore,"
                         f" which reserves nothing); escape it (\\{text[0]}) to mean the"
                         " character")
    if text == "/":
        raise ValueError("matches nothing; `**` is the whole repository")


def _items(segments: list[str], is_dir: bool) -> tuple[Item, ...]:
    """Whole-path items: a pattern ending in `**` (or `/`) needs one segment more at
    least; any other also matches what lies under what it matches."""
    if segments == ["**"] and is_dir:  # `**/`: anything inside some directory
        return (_ANY_SEGMENT, _ANY_SEGMENT, GLOBSTAR)
    parsed = tuple(GLOBSTAR if s == "**" else _segment(s) for s in segments)
    if parsed[-1] is GLOBSTAR:
        return (*parsed[:-1], _ANY_SEGMENT, GLOBSTAR)
    return (*parsed, GLOBSTAR)


def _segment(text: str) -> Segment:
    tokens: list[Token] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            if i + 1 == len(text):
                raise ValueError("ends a segment with a lone \\; escape a character (\\*)")
            tokens.append(_literal(text[i + 1]))
            i += 2
        elif char == "*":
            if not tokens or tokens[-1] is not STAR:  # `a**b` is `a*b`
                tokens.append(STAR)
            i += 1
        elif char == "?":
            tokens.append(ANY_CHAR)
            i += 1
        elif char == "[":
            token, i = _bracket(text, i + 1)
            tokens.append(token)
        else:
            tokens.append(_literal(char))
            i += 1
    return tuple(tokens)


def _bracket(text: str, start: int) -> tuple[CharClass, int]:
    """The class opened at text[start - 1]; returns it and the index after its `]`."""
    i = start
    negated = i < len(text) and text[i] in "!^"
    i += negated
    ranges: list[tuple[int, int]] = []
    first = True
    while i < len(text) and (text[i] != "]" or first):
        char = text[i]
        if char in "\\[":
            raise ValueError(f"has {char!r} inside [...]; move it out and escape it")
        if i + 2 < len(text) and text[i + 1] == "-" and text[i + 2] != "]":
            lo, hi = ord(char), ord(text[i + 2])
            if lo > hi or text[i + 2] in "\\[":
                raise ValueError(f"has the range {text[i:i + 3]!r}; write it low-high (a-z)")
            ranges.append((lo, hi))
            i += 3
        else:
            ranges.append((ord(char), ord(char)))
            i += 1
        first = False
    if i >= len(text):
        raise ValueError("opens a [ class that is never closed; escape it (\\[) to mean '['")
    if any(lo <= SLASH <= hi for lo, hi in ranges):
        raise ValueError("has a class that holds '/'; a class matches one character of a"
                         " segment, never '/'")
    merged = _merge(ranges)
    return CharClass(_complement(merged) if negated else merged), i + 1


def _literal(char: str) -> CharClass:
    return CharClass(((ord(char), ord(char)),))


def _merge(ranges: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return tuple(merged)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """Every code point but those in `ranges` and `/`."""
    found, low = [], 0
    for lo, hi in _merge([*ranges, (SLASH, SLASH)]):
        if low < lo:
            found.append((low, lo - 1))
        low = hi + 1
    if low <= MAX_CODEPOINT:
        found.append((low, MAX_CODEPOINT))
    return tuple(found)


ANY_CHAR = CharClass(_complement(()))
_ANY_SEGMENT: Segment = (STAR,)


def _literal_prefix(items: tuple[Item, ...]) -> tuple[str, ...]:
    prefix = []
    for item in items:
        if item is GLOBSTAR or not all(_single(t) for t in item):
            break
        prefix.append("".join(chr(t.intervals[0][0]) for t in item))
    return tuple(prefix)


def _single(token: Token) -> bool:
    return isinstance(token, CharClass) and len(token.intervals) == 1 \
        and token.intervals[0][0] == token.intervals[0][1]


# --- matching ----------------------------------------------------------------------------


def _items_regex(items: tuple[Item, ...]) -> str:
    """A regex for `path + "/"`: each segment item eats one non-empty segment and its slash."""
    parts = []
    for item in items:
        if item is GLOBSTAR:
            parts.append("(?:[^/]+/)*")
        else:
            parts.append("(?=[^/])" + "".join(
                "[^/]*" if t is STAR else _token_regex(t) for t in item) + "/")
    return "".join(parts)


def _token_regex(token: CharClass) -> str:
    if _single(token):
        return re.escape(chr(token.intervals[0][0]))
    return token.regex()


def _interval_regex(lo: int, hi: int) -> str:
    def escaped(code: int) -> str:
        return f"\\U{code:08x}"
    return escaped(lo) if lo == hi else f"{escaped(lo)}-{escaped(hi)}"


# --- overlap -----------------------------------------------------------------------------


def _overlap(a: tuple[Item, ...], b: tuple[Item, ...]) -> str | None:
    """A path both item lists match whole: the shortest, found in their product."""
    segments = _cheapest_path((0, 0), (len(a), len(b)),
                              lambda state: _segment_moves(a, b, state))
    return None if segments is None else "/".join(segments)


Moves = Callable[[tuple], Iterator[tuple[tuple, "str | None", int]]]


def _cheapest_path(start: tuple, goal: tuple, moves: Moves) -> list[str] | None:
    """The labels along a cheapest path from `start` to `goal` (Dijkstra's search over
    moves of a cost each; a move labelled None adds nothing), or None when `goal`
    cannot be reached. Of equally cheap paths, the one whose moves come first wins."""
    parents: dict[tuple, tuple[tuple, str | None] | None] = {start: None}
    best = {start: 0}
    queue = [(0, 0, start)]
    order = itertools.count(1)  # ties go first in, first out, as a breadth-first search
    while queue:
        cost, _, state = heapq.heappop(queue)
        if state == goal:
            return _walk_back(parents, state)
        if cost > best[state]:
            continue  # reached again more cheaply since this entry was queued
        for nxt, label, step in moves(state):
            if cost + step < best.get(nxt, cost + step + 1):
                best[nxt] = cost + step
                parents[nxt] = (state, label)
                heapq.heappush(queue, (cost + step, next(order), nxt))
    return None


def _segment_moves(a: tuple[Item, ...], b: tuple[Item, ...],
                   state: tuple[int, int]) -> Iterator[tuple[tuple[int, int], str | None, int]]:
    i, j = state
    if i < len(a) and a[i] is GLOBSTAR:
        yield (i + 1, j), None, 1  # the globstar matches no segment
    if j < len(b) and b[j] is GLOBSTAR:
        yield (i, j + 1), None, 1
    if i < len(a) and j < len(b):
        glob_a, next_i = (_ANY_SEGMENT, i) if a[i] is GLOBSTAR else (a[i], i + 1)
        glob_b, next_j = (_ANY_SEGMENT, j) if b[j] is GLOBSTAR else (b[j], j + 1)
        word = common_word(glob_a, glob_b)
        if word is not None:
            yield (next_i, next_j), word, 1


def _walk_back(parents: dict, state: tuple) -> list[str]:
    found = []
    while parents[state] is not None:
        state, step = parents[state]
        if step is not None:
            found.append(step)
    return found[::-1]


@functools.lru_cache(maxsize=65536)
def common_word(a: Segment, b: Segment) -> str | None:
    """A non-empty segment (no `/`) both globs match, or None; each star matches at least
    one character where some word allows it."""
    # A state: the positions in a and b, whether a character was taken, and whether the
    # star at each position has taken one (leaving a star that took none costs more).
    chars = _cheapest_path((0, 0, False, False, False), (len(a), len(b), True, False, False),
                           lambda state: _char_moves(a, b, state))
    return None if chars is None else "".join(chars)


def _char_moves(a: Segment, b: Segment, state: tuple[int, int, bool, bool, bool]
                ) -> Iterator[tuple[tuple[int, int, bool, bool, bool], str | None, int]]:
    i, j, nonempty, took_a, took_b = state
    if i < len(a) and a[i] is STAR:  # leave the star
        yield (i + 1, j, nonempty, False, took_b), None, 0 if took_a else _EMPTY_STAR_COST
    if j < len(b) and b[j] is STAR:
        yield (i, j + 1, nonempty, took_a, False), None, 0 if took_b else _EMPTY_STAR_COST
    if i < len(a) and j < len(b):
        star_a, star_b = a[i] is STAR, b[j] is STAR  # a star stays where it is
        class_a, next_i = (ANY_CHAR, i) if star_a else (a[i], i + 1)
        class_b, next_j = (ANY_CHAR, j) if star_b else (b[j], j + 1)
        char = class_a.first_common(class_b)
        if char is not None:
            yield (next_i, next_j, True, star_a, star_b), char, 1


# --- the index ---------------------------------------------------------------------------


class GlobIndex:
    """Values filed under patterns by their literal leading segments, so a path is tested
    only against the patterns whose prefix it starts with (a trie of segments).

    `src/auth/**` is filed under src -> auth, `*.md` (any depth) at the root: a
    path visits the nodes along its own segments, a few dictionary steps,
    instead of every pattern. Patterns are filed by their text (`literal_prefix`
    needs no parse) and parsed only when a path reaches them, so building the
    index for a one-off check (the git hook) costs little more than reading it.
    Patterns must be valid (parse_glob accepted them when they were stored).
    """

    def __init__(self) -> None:
        self._root = _Node()
        self.size = 0

    def add(self, pattern: str, value: object) -> None:
        node = self._root
        for segment in literal_prefix(pattern):
            node = node.children.setdefault(segment, _Node())
        node.entries.append((pattern, value))
        self.size += 1

    def matching(self, path: str) -> Iterator[tuple[str, object]]:
        """The (pattern, value) entries whose pattern matches the normalized `path`."""
        node: _Node | None = self._root
        segments = iter(path.split("/"))
        while node is not None:
            for pattern, value in node.entries:
                if _parse_cached(pattern).matches(path):
                    yield pattern, value
            node = node.children.get(next(segments, None))  # type: ignore[arg-type]

    def overlapping(self, glob: Glob) -> Iterator[tuple[str, object, str]]:
        """The (pattern, value, witness path) entries whose pattern overlaps `glob`.

        Only entries whose prefix is a prefix of `glob`'s, or extends it, can.
        """
        node: _Node | None = self._root
        candidates: list[tuple[str, object]] = []
        for segment in glob.prefix:
            candidates += node.entries
            node = node.children.get(segment)
            if node is None:
                break
        if node is not None:
            candidates += [entry for below in node.walk() for entry in below.entries]
        for pattern, value in candidates:
            witness = glob.overlap(_parse_cached(pattern))
            if witness is not None:
                yield pattern, value, witness


def literal_prefix(pattern: str) -> tuple[str, ...]:
    """Leading segments every path the (valid) pattern matches starts with, read from its
    text alone: a prefix of `parse_glob(pattern).prefix` (segments with an escape stop it
    early, which only costs the index a few more candidates)."""
    body = pattern.rstrip("/")
    if pattern.startswith("/"):
        segments = body[1:].split("/")
    elif "/" not in body:
        return ()  # no slash before the end: at any depth
    else:
        segments = body.split("/")
    prefix = []
    for segment in segments:
        if not segment or any(c in segment for c in "*?[\\"):
            break
        prefix.append(segment)
    return tuple(prefix)


class _Node:
    __slots__ = ("children", "entries")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.entries: list[tuple[str, object]] = []

    def walk(self) -> Iterator[_Node]:
        yield self
        for child in self.children.values():
            yield from child.walk()
