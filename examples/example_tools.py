"""Handlers and payloads of examples/organism.yaml.

Handlers get a typed payload and a frozen context, and return Reply objects:
they never see an envelope, so they cannot choose their <from> or <thread>.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from bus.pump import Context
from bus.pump import FinalAnswer
from bus.pump import Reply
from bus.xml import xmlify


@xmlify(root="greeting")
@dataclass
class Greeting:
    """Greet someone by name (loud: the shouter says it)."""

    name: str
    loud: bool = False


@xmlify(root="hello")
@dataclass
class Hello:
    """The greeter's answer."""

    text: str


@xmlify(root="shout")
@dataclass
class Shout:
    """Say a text loudly."""

    text: str


@xmlify(root="add")
@dataclass
class Add:
    """Add two numbers and return the sum."""

    a: float
    b: float


@xmlify(root="sum")
@dataclass
class Sum:
    """The sum of an <add>."""

    value: float


@xmlify(root="search")
@dataclass
class Search:
    """Search the web for a query."""

    query: str


@xmlify(root="search-result")
@dataclass
class SearchResult:
    """One search tool's answer."""

    source: str
    text: str


# Greetings waiting for the calculator, by thread: the calculator's answer comes back to
# the greeter on the thread it called from (seed 001's call chain, pruned as it bubbles).
# In memory: a greeting whose pump restarted in between is answered without its name.
_WAITING: dict[str, Greeting] = {}


async def greet(msg: Greeting | Sum, ctx: Context) -> Reply:
    """console -> greeter -> calculator -> greeter -> console: count the name's letters on
    the calculator (vowels + the others), then answer; a loud greeting goes on to the
    shouter, whose <final-answer> ends the conversation."""
    if isinstance(msg, Greeting):
        _WAITING[ctx.thread] = msg
        vowels = sum(letter in "aeiou" for letter in msg.name.lower())
        return Reply(Add(vowels, len(msg.name) - vowels), to="calculator")
    greeting = _WAITING.pop(ctx.thread, Greeting("friend"))
    text = f"hello, {greeting.name}! your name has {msg.value:g} letters"
    return Reply(Shout(text), to="shouter") if greeting.loud else Reply(Hello(text))


async def shout(msg: Shout, ctx: Context) -> Reply:
    return Reply(FinalAnswer(msg.text.upper() + "!"))


async def add(msg: Add, ctx: Context) -> Reply:
    return Reply(Sum(msg.a + msg.b))


async def search_fast(msg: Search, ctx: Context) -> Reply:
    await asyncio.sleep(0.1)
    return Reply(SearchResult("fast", f"a quick guess about {msg.query!r}"))


def search_slow(msg: Search, ctx: Context) -> Reply:
    """A plain function: the pump runs it in a thread, so it may block."""
    time.sleep(0.5)
    return Reply(SearchResult("slow", f"a thorough answer about {msg.query!r}"))


def add_now(msg: Add, ctx: Context) -> Reply:
    """`add` as a plain function: fast enough for `inline: true` (scripts/bench_pump.py)."""
    return Reply(Sum(msg.a + msg.b))
