"""The handler contract: what a handler gets (`msg`, `ctx`) and may return (`Reply`).

    async def add(msg: Add, ctx: Context) -> Reply | list[Reply] | None:
        return Reply(Sum(msg.a + msg.b))              # answers the caller
        return [Reply(Shout(text)), Reply(Log(text), to="logger")]   # several payloads
        return None                                   # nothing to say

A `<huh>` for a call the listener made (its peer refused the payload,
raised or timed out) comes to the same handler as a `bus.xml.pipeline.Huh`
(`msg.code`, `msg.message`), on the thread the call was made from, so the
agent sees its error and can correct itself.

A plain `def` handler runs in a thread of the pump's pool. Handlers never see
or build envelopes: the pump stamps `<from>` (the listener's name) and
`<thread>`, so a handler cannot forge either. `Reply.to` names a peer to call
(it must be in the listener's `peers`, and in its agent's `visible_tools` when
organism.yaml has an agent entry for it); without it the reply answers the
caller. A `FinalAnswer` payload ends the conversation: it goes straight to
the client that started it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any
from typing import Callable

from lxml import etree

from bus.storage.errors import BusError
from bus.xml.envelope import ENVELOPE_NS
from bus.xml.payload import is_xmlified
from bus.xml.payload import to_element
from bus.xml.payload import xmlify

FINAL_ANSWER = "final-answer"


@dataclass(frozen=True)
class Reply:
    """One payload a handler sends: to the caller (`to=None`) or to peer `to`."""

    payload: Any  # an @xmlify instance (or an lxml element)
    to: str | None = None


@dataclass(frozen=True)
class Tool:
    """A peer a handler may call, as its agent sees it: `usage` is the tool description
    generated from the peer's payload schema (summary, fields, an example)."""

    name: str
    root_tag: str
    capability: str | None
    usage: str


@dataclass(frozen=True)
class Context:
    """What a handler may know about the message it handles; frozen.

    `thread` is an opaque UUID (the call chain stays with the pump), `from_`
    the sender the pump stamped, `attempt` counts from 1 (more after a crashed
    pump), `deadline` is on the `time.monotonic()` clock. `tools` are the
    peers its agent may see and call (organism.yaml's `visible_tools`; without
    an agent entry, all its peers). `model` and `system_prompt` are its
    agent's (None without an agent entry, or when the entry gives none).
    """

    thread: str
    from_: str
    listener: str
    message_id: str
    attempt: int
    deadline: float
    tools: tuple[Tool, ...] = ()
    model: str | None = None
    system_prompt: str | None = None

    def remaining(self) -> float:
        """Seconds left before the pump gives up on this call."""
        return max(0.0, self.deadline - time.monotonic())


@xmlify(root=FINAL_ANSWER)
@dataclass(frozen=True)
class FinalAnswer:
    """The conversation's last word, delivered to the client that started it."""

    text: str


class HandlerFailed(BusError):
    """A handler raised, timed out or returned something that is not a Reply.

    `code` is the `<huh>` code the sender gets: handler-error, timeout,
    bad-reply, peer-denied.
    """

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(frozen=True)
class ReadyReply:
    """A reply ready for the commit: its payload element and where it goes."""

    element: etree._Element
    to: str | None
    final: bool = False
    # The @xmlify class the element was encoded from (so valid by construction), or
    # None for an lxml element a handler built itself.
    encoded_from: type | None = None


async def call_handler(handler: Callable[..., Any], msg: Any, ctx: Context, timeout: float,
                       executor: Executor) -> list[Reply]:
    """Run one handler call with a timeout; its replies as a list.

    Raises HandlerFailed. A sync handler that overruns keeps its thread until
    it returns (Python cannot stop a thread); the pump stops waiting for it.
    """
    try:
        if inspect.iscoroutinefunction(handler):
            result = await _within(handler(msg, ctx), timeout)
        else:
            loop = asyncio.get_running_loop()
            result = await asyncio.wait_for(
                loop.run_in_executor(executor, handler, msg, ctx), timeout)
    except asyncio.TimeoutError:
        raise _timed_out(timeout) from None
    except Exception as exc:  # the handler's bug: the sender learns of it, the pump goes on
        raise _raised(exc) from None
    return replies_of(result)


async def _within(call: Any, timeout: float) -> Any:
    """`await call` with a timeout, in the calling task where Python has
    `asyncio.timeout` (3.11): `wait_for` runs it in a task of its own, so a handler
    that never awaits took three turns of the loop to finish instead of one."""
    if _TIMEOUT is None:
        return await asyncio.wait_for(call, timeout)
    async with _TIMEOUT(timeout):
        return await call


_TIMEOUT = getattr(asyncio, "timeout", None)


def call_inline(handler: Callable[..., Any], msg: Any, ctx: Context,
                timeout: float) -> list[Reply]:
    """Run a plain `def` handler here and now; its replies as a list.

    Raises HandlerFailed, with code "timeout" when it returned after `timeout`
    seconds: it could not be stopped, but what it returned is dropped, as the
    pump would have stopped waiting for it on the leased path.
    """
    started = time.monotonic()
    try:
        result = handler(msg, ctx)
    except Exception as exc:  # the handler's bug: the sender learns of it, the pump goes on
        raise _raised(exc) from None
    if time.monotonic() - started > timeout:
        raise _timed_out(timeout)
    return replies_of(result)


def _timed_out(timeout: float) -> HandlerFailed:
    return HandlerFailed("timeout", f"the handler did not answer within {timeout:g} s; "
                                    "send a smaller request or try again later")


def _raised(exc: Exception) -> HandlerFailed:
    return HandlerFailed("handler-error", f"the handler failed: {type(exc).__name__}: "
                                          f"{exc}"[:500])


def replies_of(result: object) -> list[Reply]:
    """A handler's return value as a list of Reply; HandlerFailed for anything else."""
    if result is None:
        return []
    items = result if isinstance(result, (list, tuple)) else [result]
    for item in items:
        if not isinstance(item, Reply):
            raise HandlerFailed("bad-reply", f"the handler returned {type(item).__name__}; "
                                             "return Reply(payload), a list of them, or None")
    return list(items)


def outputs_of(replies: list[Reply], peers: tuple[str, ...],
               visible: tuple[str, ...] | None = None) -> list[ReadyReply]:
    """Payload elements of `replies`, calls checked; HandlerFailed names the problem.

    A call (`Reply.to`) must go to one of `peers`, and, when the listener has an
    agent entry, to one of its `visible` tools: an agent calls only what it sees.
    """
    may_call = peers if visible is None else visible
    outputs = []
    for index, reply in enumerate(replies):
        if reply.to is not None and reply.to not in may_call:
            raise _call_denied(index, reply.to, peers, visible)
        cls = type(reply.payload)
        outputs.append(ReadyReply(_element(reply.payload, index), reply.to,
                              isinstance(reply.payload, FinalAnswer),
                              cls if is_xmlified(cls) else None))
    return outputs


def _call_denied(index: int, to: str, peers: tuple[str, ...],
                 visible: tuple[str, ...] | None) -> HandlerFailed:
    if to in peers:  # so visible is not None: the agent may not see it
        return HandlerFailed("peer-denied", (
            f"reply {index} calls {to!r}, a tool this listener's agent cannot see (its "
            f"visible_tools: {', '.join(visible or ()) or 'none'}); add {to} to the agent's "
            "visible_tools in organism.yaml"))
    also = "" if visible is None else " and to its agent's visible_tools"
    return HandlerFailed("peer-denied", f"reply {index} is addressed to {to!r}, which this "
                                        f"listener may not call; add it to the listener's "
                                        f"peers{also} in organism.yaml")


def _element(payload: Any, index: int) -> etree._Element:
    if is_xmlified(type(payload)):
        try:
            return to_element(payload)
        except BusError as exc:
            raise HandlerFailed("bad-reply", f"reply {index}: {exc}") from None
    if isinstance(payload, etree._Element) and isinstance(payload.tag, str):
        if etree.QName(payload).namespace == ENVELOPE_NS:
            raise HandlerFailed("bad-reply", f"reply {index} is an envelope; return the payload"
                                             " only: the pump builds the envelope around it")
        return payload
    raise HandlerFailed("bad-reply", f"reply {index} holds {type(payload).__name__}; a "
                                     "payload is an @xmlify instance or an lxml element")
