"""Topic matching: the seed's example table, validation, and the tiered index
checked against the plain reference algorithm with Hypothesis."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus.channels.topics import TopicIndex
from bus.channels.topics import matches
from bus.channels.topics import validate_pattern
from bus.channels.topics import validate_topic
from bus.storage.errors import ValidationFailed

# Seed 004, "Matching Examples": (topic, pattern, matches?)
SEED_TABLE = [
    ("build.frontend.complete", "build.frontend.complete", True),
    ("build.frontend.complete", "build.*.complete", True),
    ("build.frontend.complete", "build.#", True),
    ("build.frontend.complete", "build.backend.complete", False),
    ("build.frontend.complete", "build.*.start", False),
    ("build.frontend.test.unit", "build.*.complete", False),
    ("build", "build.#", True),
    ("deploy.staging", "*.staging", True),
]


@pytest.mark.parametrize("topic,pattern,expected", SEED_TABLE)
def test_matches_follows_the_seed_table(topic: str, pattern: str, expected: bool) -> None:
    assert matches(topic, pattern) is expected


@pytest.mark.parametrize("topic,pattern,expected", SEED_TABLE)
def test_topic_index_follows_the_seed_table(topic: str, pattern: str, expected: bool) -> None:
    assert TopicIndex([(pattern, "agent")]).match(topic) == ({"agent"} if expected else set())


def test_topic_index_returns_each_subscriber_once_whatever_matched() -> None:
    index = TopicIndex([("build.#", "a"), ("build.*.success", "a"), ("build.web.success", "a"),
                        ("*.web.*", "b"), ("deploy.#", "c"), ("#", "d")])
    assert index.match("build.web.success") == {"a", "b", "d"}
    assert index.match("deploy") == {"c", "d"}
    assert index.match("other") == {"d"}


def test_multi_level_wildcard_with_a_star_in_its_prefix() -> None:
    index = TopicIndex([("*.web.#", "a")])
    assert index.match("build.web") == {"a"}
    assert index.match("build.web.x.y") == {"a"}
    assert index.match("build.api.x") == set()
    assert index.match("web") == set()


@pytest.mark.parametrize("bad,problem", [
    ("", "1-256 characters"), ("a..b", "segment ''"), ("a.*", "segment '*'"),
    ("a.#", "segment '#'"), ("a b", "segment 'a b'"), ("x" * 257, "1-256 characters"),
])
def test_validate_topic_names_the_problem(bad: str, problem: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        validate_topic(bad)
    assert caught.value.field == "topic" and problem in caught.value.reason


@pytest.mark.parametrize("bad,problem", [
    ("a.#.b", "'#' only as the last segment"), ("a.b*", "segment 'b*'"), ("a..b", "segment ''"),
    ("", "1-256 characters"),
])
def test_validate_pattern_names_the_problem(bad: str, problem: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        validate_pattern(bad)
    assert caught.value.field == "topic_pattern" and problem in caught.value.reason


def test_validate_pattern_accepts_the_wildcards() -> None:
    for pattern in ("#", "*", "a.*.c", "a.#", "*.*.#", "build.frontend.complete"):
        assert validate_pattern(pattern) == pattern


# --- the tiered index against the reference -----------------------------------

SEGMENTS = st.sampled_from(["a", "b", "c", "build", "web"])
topics = st.lists(SEGMENTS, min_size=1, max_size=5).map(".".join)
pattern_segments = st.one_of(SEGMENTS, st.just("*"))
patterns = st.builds(
    lambda body, multi: ".".join(body + (["#"] if multi else [])),
    st.lists(pattern_segments, min_size=0, max_size=5), st.booleans(),
).filter(bool)
subscriptions = st.lists(st.tuples(patterns, st.sampled_from(["s1", "s2", "s3", "s4"])),
                         max_size=30)


@given(subscriptions, st.lists(topics, min_size=1, max_size=10))
def test_topic_index_agrees_with_the_reference(subs: list[tuple[str, str]],
                                               probe: list[str]) -> None:
    index = TopicIndex(subs)
    for topic in probe:
        expected = {agent for pattern, agent in subs if matches(topic, pattern)}
        assert index.match(topic) == expected


@given(patterns)
def test_generated_patterns_validate(pattern: str) -> None:
    assert validate_pattern(pattern) == pattern
