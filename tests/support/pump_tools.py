"""Payloads and handlers of the pump tests' organisms (imported as tests.support.pump_tools).

Handlers record their calls in CALLS (in-process tests read it) and, when
PUMP_TOOLS_LOG is set, append one line per call to that file (child processes).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from dataclasses import dataclass

from lxml import etree

from bus.pump import Context
from bus.pump import FinalAnswer
from bus.pump import Reply
from bus.xml import xmlify
from bus.xml.envelope import build_envelope
from bus.xml.pipeline import Huh

CALLS: list[tuple[str, object, Context]] = []


def record(listener: str, msg: object, ctx: Context) -> None:
    CALLS.append((listener, msg, ctx))
    log = os.environ.get("PUMP_TOOLS_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{listener} {ctx.message_id} {ctx.attempt}\n")


@xmlify(root="add")
@dataclass
class Add:
    """Add two numbers."""

    a: float
    b: float


@xmlify(root="sum")
@dataclass
class Sum:
    value: float


@xmlify(root="search")
@dataclass
class Search:
    query: str


@xmlify(root="result")
@dataclass
class Result:
    source: str
    text: str


@xmlify(root="echo")
@dataclass
class Echo:
    """Echo `text` back `count` times (0: no reply); `mode` picks a failure."""

    text: str
    count: int = 1
    mode: str = "ok"  # ok, raise, sleep, peer, bad, final


@xmlify(root="boot")
@dataclass
class Boot:
    """<boot/>"""


async def add(msg: Add, ctx: Context) -> Reply:
    record(ctx.listener, msg, ctx)
    return Reply(Sum(msg.a + msg.b))


async def search_fast(msg: Search, ctx: Context) -> Reply:
    record(ctx.listener, msg, ctx)
    await asyncio.sleep(0.1)
    return Reply(Result("fast", msg.query))


async def search_slow(msg: Search, ctx: Context) -> Reply:
    record(ctx.listener, msg, ctx)
    await asyncio.sleep(0.5)
    return Reply(Result("slow", msg.query))


def search_sync(msg: Search, ctx: Context) -> Reply:
    record(ctx.listener, msg, ctx)
    time.sleep(0.3)
    return Reply(Result("sync", msg.query))


async def echo(msg: Echo, ctx: Context) -> object:
    record(ctx.listener, msg, ctx)
    if msg.mode == "raise":
        raise RuntimeError(f"cannot echo {msg.text}")
    if msg.mode == "sleep":
        await asyncio.sleep(30)
    if msg.mode == "peer":
        return Reply(Echo(msg.text), to="stranger")
    if msg.mode == "bad":
        return "not a reply"
    if msg.mode == "final":
        return Reply(FinalAnswer(msg.text))
    if msg.count == 0:
        return None
    return [Reply(Result(str(i), msg.text)) for i in range(msg.count)]


async def slow_echo(msg: Echo, ctx: Context) -> list[Reply]:
    """Like echo's ok mode, but takes 50 ms: long enough to be killed around."""
    record(ctx.listener, msg, ctx)
    await asyncio.sleep(0.05)
    return [Reply(Result(str(i), msg.text)) for i in range(msg.count)]


async def on_boot(msg: Boot, ctx: Context) -> None:
    record(ctx.listener, msg, ctx)


def element_reply(msg: Echo, ctx: Context) -> Reply:
    record(ctx.listener, msg, ctx)
    element = etree.Element("result")
    etree.SubElement(element, "source").text = "element"
    etree.SubElement(element, "text").text = msg.text
    return Reply(element)


async def count_up(msg: Sum, ctx: Context) -> Reply:
    """Asks calc.add for value + 1 until it reaches 3: each answer comes back on its thread."""
    record(ctx.listener, msg, ctx)
    if msg.value >= 3:
        return Reply(FinalAnswer(f"counted to {msg.value:g}"))
    return Reply(Add(msg.value, 1), to="calc.add")


def counter_listeners(inline: bool = False) -> str:
    """organism.yaml's listener entries of `counter` and the `calc.add` it calls (inline:
    a plain `def`, answered in the transaction that routes)."""
    add = "add_inline\n    inline: true" if inline else "add"
    return ("  - name: counter\n    root_tag: sum\n    payload: tests.support.pump_tools:Sum\n"
            "    handler: tests.support.pump_tools:count_up\n    peers: [calc.add]\n"
            "  - name: calc.add\n    root_tag: add\n    payload: tests.support.pump_tools:Add\n"
            f"    handler: tests.support.pump_tools:{add}\n")


@xmlify(root="poison")
@dataclass
class Poison:
    text: str


async def poison(msg: Poison, ctx: Context) -> None:
    """Kills the pump's process (SIGKILL) every time it is called."""
    record(ctx.listener, msg, ctx)
    os.kill(os.getpid(), signal.SIGKILL)


@xmlify(root="lookup", namespace="https://example.org/ns/lookup/v1")
@dataclass
class Lookup:
    """Look a word up (a namespaced payload)."""

    word: str


async def lookup(msg: Lookup, ctx: Context) -> Reply:
    record("lookup", msg, ctx)
    return Reply(etree.fromstring(f"<meaning>{msg.word}: a word</meaning>"))


@xmlify(root="ask")
@dataclass
class Ask:
    """A question `careless` and `stubborn` pass on to calc.add, wrongly."""

    text: str


BAD_ADD = "<add><a>one</a><b>2</b></add>"  # calc.add's pipeline refuses it


async def careless(msg: object, ctx: Context) -> Reply:
    """Calls calc.add with a payload it refuses; told so (a Huh), it answers with the code."""
    record(ctx.listener, msg, ctx)
    if isinstance(msg, Huh):
        return Reply(Result("careless", f"calc.add said {msg.code}"))
    return Reply(etree.fromstring(BAD_ADD), to="calc.add")


async def stubborn(msg: object, ctx: Context) -> Reply:
    """Sends calc.add the same refused payload again on every <huh>: would loop for ever."""
    record(ctx.listener, msg, ctx)
    return Reply(etree.fromstring(BAD_ADD), to="calc.add")


def envelope_reply(msg: Echo, ctx: Context) -> Reply:
    """Returns a whole envelope instead of a payload."""
    record(ctx.listener, msg, ctx)
    return Reply(build_envelope(Result("x", msg.text), sender=ctx.listener, thread=ctx.thread))


async def misaddressed(msg: object, ctx: Context) -> Reply:
    """Calls calc.add with an <echo>, which calc.add does not take; answers with the code."""
    record(ctx.listener, msg, ctx)
    if isinstance(msg, Huh):
        return Reply(Result("misfit", f"{ctx.from_} said {msg.code}"))
    return Reply(Echo("hello"), to="calc.add")


def echo_inline(msg: Echo, ctx: Context) -> object:
    """A plain `def` echo for inline listeners; `mode` picks a failure (raise, sleep, peer,
    kill: SIGKILL the pump's process while its transaction is open)."""
    record(ctx.listener, msg, ctx)
    if msg.mode == "raise":
        raise RuntimeError(f"cannot echo {msg.text}")
    if msg.mode == "sleep":
        time.sleep(ctx.remaining() + 0.05)  # past the listener's timeout, whatever it is
    if msg.mode == "peer":
        return Reply(Add(1, 2), to="calc.add")
    if msg.mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    return [Reply(Result(str(i), msg.text)) for i in range(msg.count)]


def add_inline(msg: Add, ctx: Context) -> Reply:
    """`add` as a plain function, for inline listeners."""
    record(ctx.listener, msg, ctx)
    return Reply(Sum(msg.a + msg.b))


def introduce(msg: Echo, ctx: Context) -> Reply:
    """Answers with its agent as organism.yaml describes it: model and system prompt
    (a plain `def`, so it runs inline too)."""
    record(ctx.listener, msg, ctx)
    return Reply(Result(ctx.model or "no model", ctx.system_prompt or "no prompt"))


async def ask_calc(msg: object, ctx: Context) -> Reply:
    """Asks calc.add for 1 + 2; its <sum> (not an <ask>) comes back here, on this thread."""
    record(ctx.listener, msg, ctx)
    if isinstance(msg, Sum):
        return Reply(Result("asker", f"calc.add said {msg.value:g}"))
    return Reply(Add(1, 2), to="calc.add")


async def ask_dictionary(msg: object, ctx: Context) -> Reply:
    """Looks a word up: the dictionary's <meaning> is no @xmlify class, so it comes back
    here as an lxml element."""
    record(ctx.listener, msg, ctx)
    if isinstance(msg, etree._Element):
        return Reply(Result("definer", f"<{msg.tag}> {msg.text}"))
    return Reply(Lookup("word"), to="dictionary")


async def relay(msg: object, ctx: Context) -> Reply:
    """Passes an <ask> on to echo, whose <final-answer> ends the conversation."""
    record(ctx.listener, msg, ctx)
    return Reply(Echo(getattr(msg, "text", "?"), mode="final"), to="echo")


async def ignore_answers(msg: object, ctx: Context) -> Reply | None:
    """Asks calc.add for 1 + 2, then has nothing to say about its <sum>."""
    record(ctx.listener, msg, ctx)
    return None if isinstance(msg, Sum) else Reply(Add(1, 2), to="calc.add")


async def outer(msg: object, ctx: Context) -> Reply:
    """An <echo> goes on to the asker as an <ask>; the asker's <result> comes back here and
    goes on to the client: console -> outer -> asker -> calc.add -> asker -> outer -> console."""
    record(ctx.listener, msg, ctx)
    if isinstance(msg, Result):
        return Reply(Result("outer", msg.text))
    return Reply(Ask(getattr(msg, "text", "?")), to="asker")


async def bad_sum(msg: Add, ctx: Context) -> Reply:
    """Answers an <add> with a <sum> its schema refuses (an lxml element, so the pump did
    not encode it)."""
    record(ctx.listener, msg, ctx)
    return Reply(etree.fromstring("<sum><value>three</value></sum>"))


# Where `Meet`'s pipelines wait for each other (tests/pump/test_pump_pipelines.py): None, or
# a barrier every pipeline that deserializes a <meet> waits at, and what they did.
RENDEZVOUS: threading.Barrier | None = None
PIPELINE_EVENTS: list[tuple[str, str]] = []  # (event, thread name), in the order they happened


@xmlify(root="meet")
@dataclass
class Meet:
    """Deserialized in its listener's pipeline: there it waits at RENDEZVOUS, if set."""

    text: str

    def __post_init__(self) -> None:
        if RENDEZVOUS is None:
            return
        PIPELINE_EVENTS.append(("start", threading.current_thread().name))
        try:
            RENDEZVOUS.wait()
        except threading.BrokenBarrierError:
            raise ValueError("the other listener's pipeline never ran beside this one") \
                from None
        PIPELINE_EVENTS.append(("end", threading.current_thread().name))


async def meet(msg: Meet, ctx: Context) -> Reply:
    record(ctx.listener, msg, ctx)
    return Reply(Result(ctx.listener, f"met {len(msg.text)}"))
