"""Gitignore-style globs (bus/coordination/globs.py): parsing, matching against pathspec's gitignore
semantics, the exact overlap decision against brute force, and the prefix index."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st
from pathspec.patterns.gitignore.spec import GitIgnoreSpecPattern

from bus.storage.errors import ValidationFailed
from bus.coordination.globs import GlobIndex
from bus.coordination.globs import literal_prefix
from bus.coordination.globs import normalize_path
from bus.coordination.globs import parse_glob

# Segments of generated patterns: literals, wildcards, classes, escapes and `**`.
PATTERN_SEGMENTS = ["a", "b", "ab", "*", "?", "a*", "*b", "?b", "[ab]", "[a-c]x", "a[!a]",
                    "[!b]", "**", "\\*", "a?*"]
PATH_SEGMENTS = ["a", "b", "ab", "ba", "aa", "bb", "cx", "ax", "*", "abb"]
# Every path of depth 1 to 3 over PATH_SEGMENTS (1,110 paths): the brute force's universe.
UNIVERSE = ["/".join(p) for n in (1, 2, 3) for p in itertools.product(PATH_SEGMENTS, repeat=n)]


@st.composite
def patterns(draw, segments=PATTERN_SEGMENTS):
    body = "/".join(draw(st.lists(st.sampled_from(segments), min_size=1, max_size=4)))
    lead = draw(st.sampled_from(["", "/"]))
    trail = draw(st.sampled_from(["", "/"]))
    return lead + body + trail


paths = st.lists(st.sampled_from(PATH_SEGMENTS), min_size=1, max_size=5).map("/".join)


def pathspec_matches(pattern: str, path: str) -> bool:
    return GitIgnoreSpecPattern(pattern).match_file(path) is not None


@given(patterns([s for s in PATTERN_SEGMENTS if "!" not in s]), paths)
@example("src/auth/**", "src/auth/login.py")
@example("docs/", "docs")
@example("**/", "a")
@example("*/", "a/b")
def test_glob_matches_as_pathspec_reads_gitignore(pattern: str, path: str) -> None:
    # Negated classes are left out here: pathspec lets `[!a]` match `/`, git does not.
    assert parse_glob(pattern).matches(path) == pathspec_matches(pattern, path)


def test_glob_negated_class_never_matches_a_slash() -> None:
    glob = parse_glob("a[!x]b")
    assert glob.matches("ayb") and not glob.matches("axb") and not glob.matches("a/b")


@given(patterns(), patterns(), st.lists(paths, max_size=20))
@example("src/auth/**", "src/auth/login.py", [])
@example("src/auth/**", "docs/**", [])
@example("[a-c]x", "[!b]?", [])
def test_glob_overlap_agrees_with_brute_force(a: str, b: str, extra: list[str]) -> None:
    ga, gb = parse_glob(a), parse_glob(b)
    witness = ga.overlap(gb)
    both = [p for p in UNIVERSE + extra if ga.matches(p) and gb.matches(p)]
    if witness is None:
        assert both == []
    else:
        assert ga.matches(witness) and gb.matches(witness)
        assert gb.overlap(ga) is not None  # symmetric
        if "!" not in a + b:  # and git's reading agrees (see the negated-class note above)
            assert pathspec_matches(a, witness) and pathspec_matches(b, witness)


@given(patterns(PATTERN_SEGMENTS + ["*.md", "docs", "[!a-z]*"]))
@example("docs/*.md")
@example("**/test_*.py")
def test_glob_example_path_matches_it_and_reads_as_a_file_name(pattern: str) -> None:
    """The example a conflict names (a glob's overlap with itself) is a path the glob and
    git match, each star given a character: docs/a.md for docs/*.md, not docs/.md."""
    glob = parse_glob(pattern)
    example_path = glob.overlap(glob)
    assert example_path is not None and glob.matches(example_path)
    if "!" not in pattern:
        assert pathspec_matches(pattern, example_path)
    assert example_path.isprintable()
    assert not any(segment.startswith(".") for segment in example_path.split("/"))


@pytest.mark.parametrize("a, b, example_path", [
    ("docs/*.md", "docs/*.md", "docs/a.md"),
    ("docs/*.md", "docs/", "docs/a.md"),
    ("*.md", "docs/**", "docs/a.md"),
    ("**/x", "a/**", "a/x"),
    ("src/[!a]*", "src/*", "src/ba"),
    ("[!a-z0-9_-]", "*", "!"),
    (".md", "*.md", ".md"),  # the one path both match: the star matches nothing
])
def test_glob_overlap_names_a_readable_example_path(a: str, b: str, example_path: str) -> None:
    assert parse_glob(a).overlap(parse_glob(b)) == example_path


@pytest.mark.parametrize("a, b, overlap", [
    ("src/auth/**", "src/auth/login.py", True),
    ("src/auth/**", "docs/**", False),
    ("src/auth", "src/auth/login.py", True),   # a directory holds what is under it
    ("src/auth/", "src/auth", True),           # both hold what is under src/auth
    ("src/auth/", "src/auth.py", False),
    ("*.py", "src/deep/x/**", True),           # no slash: at any depth
    ("/*.py", "src/**", False),                # anchored: only at the root
    ("src/*.py", "src/*.md", False),
    ("src/[a-m]*.py", "src/[n-z]*.py", False),
    ("src/[!a]*", "src/a*", False),
    ("src/[!a]*", "src/?b", True),             # src/bb
    ("a/**/b", "a/x/y/b/c.txt", True),
    ("/a?", "/abc", False),
    ("a?", "abc", True),                       # ab/abc: a? holds the directory ab
])
def test_glob_overlap_examples(a: str, b: str, overlap: bool) -> None:
    assert (parse_glob(a).overlap(parse_glob(b)) is not None) is overlap


@pytest.mark.parametrize("pattern, problem", [
    ("!src/**", "negation"), ("#notes", "comment"), ("", "blank"), (" src", "spaces"),
    ("a//b", "empty"), ("../x", "`..`"), ("src/[a/b]", "never closed"),
    ("[z-a]", "low-high"), ("x[", "never closed"), ("a\\", "lone"), ("/", "nothing"),
    ("[a\\b]", "inside [...]"),
])
def test_glob_refuses_what_reserves_nothing_or_is_malformed(pattern: str, problem: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_glob(pattern, "--pattern")
    assert caught.value.field == "--pattern"
    assert problem in str(caught.value)


@pytest.mark.parametrize("given_path, normal", [
    ("./src//a.py", "src/a.py"), ("src/", "src"), ("a", "a"),
])
def test_normalize_path(given_path: str, normal: str) -> None:
    assert normalize_path(given_path) == normal


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "", "  "])
def test_normalize_path_refuses_paths_outside(bad: str) -> None:
    with pytest.raises(ValidationFailed):
        normalize_path(bad)


@given(st.lists(patterns(), min_size=1, max_size=12), paths, patterns())
def test_glob_index_finds_what_a_scan_finds(found: list[str], path: str, probe: str) -> None:
    index = GlobIndex()
    for n, text in enumerate(found):
        index.add(text, n)
    scanned = {n for n, text in enumerate(found) if parse_glob(text).matches(path)}
    assert {value for _, value in index.matching(path)} == scanned
    glob = parse_glob(probe)
    overlapping = {n for n, text in enumerate(found) if glob.overlap(parse_glob(text))}
    assert {value for _, value, _w in index.overlapping(glob)} == overlapping


@given(patterns())
@example("src/auth/login.py")
@example("/docs/")
@example("src/a\\*b/c")
def test_literal_prefix_from_the_text_is_a_prefix_of_the_parsed_one(pattern: str) -> None:
    fast, parsed = literal_prefix(pattern), parse_glob(pattern).prefix
    assert parsed[:len(fast)] == fast
