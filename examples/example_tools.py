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
    """Greet someone by name."""

    name: str


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


async def greet(msg: Greeting, ctx: Context) -> Reply:
    """Ask the shouter (a peer) to shout the greeting; the shouter gives the final answer."""
    return Reply(Shout(f"hello, {msg.name}"), to="shouter")


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
