"""An agent's waiting messages as compact text, for a harness to put before a model.

Each message is one header line (`#seq from -> to type`, with its
correlation and reply references) and its body: a string payload as it is,
any other payload as compact JSON. The text has a budget of characters (a
model's context is the scarce thing, and Claude Code cuts long hook output):
messages that do not fit are left out whole, so the caller acknowledges only
up to the last one shown and the rest come next time.

`pending` reads what waits (waiting for it on the bus's own wake) and
`acknowledge` acks what was shown, with its receipts: every harness's answer
(the hooks, their background waiter, `bus inbox`) is these two around its
own way of showing the text.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable
from typing import Protocol
from typing import Sequence
from typing import TypeVar

import apsw
import orjson

from bus.log.messages import Message

TEXT_BUDGET = 9000  # characters: under the 10,000 Claude Code keeps of a hook's output
BODY_MAX = 2000  # characters of one body before it is cut
BLOB_PREVIEW = 2000  # characters read of a payload in the blob store (a body shows no more)

T = TypeVar("T")


class Log(Protocol):
    """What a harness's answer uses of the `Bus` facade (bus/api.py, a part above this one)."""

    def poll(self, agent: str, limit: int = ..., *, wait: float = ...,
             preview: int = ...) -> Sequence[Message]: ...

    def ack(self, agent: str, seq: int) -> int: ...

    def record_delivered(self, agent: str, shown: Sequence[Message], via: str,
                         session: str | None = None) -> None: ...

    def wait_for(self, fetch: Callable[[], T], seconds: float,
                 done: Callable[[T], bool] = ...) -> T: ...

    def read(self) -> AbstractContextManager[apsw.Connection]: ...

    def write(self) -> AbstractContextManager[apsw.Connection]: ...


@dataclass(frozen=True)
class Inbox:
    """The text for `shown`, the messages it holds; `more` when others wait behind them."""

    agent: str
    text: str
    shown: tuple[Message, ...]
    more: bool

    @property
    def last_seq(self) -> int | None:
        return self.shown[-1].seq if self.shown else None


def pending(log: Log, agent: str, limit: int, wait: float = 0.0,
            preview: int = BLOB_PREVIEW) -> Inbox:
    """The messages waiting for `agent` as text, at most `limit`; waiting up to `wait` s
    (`Bus.poll`'s wait: woken by commits) for one when none waits.

    `preview`: characters read of a payload in the blob store (0: all of it).
    """
    found = log.poll(agent, limit + 1, wait=wait, preview=preview)
    return render(agent, found[:limit], more=len(found) > limit, budget=TEXT_BUDGET)


def acknowledge(log: Log, inbox: Inbox, via: str, session: str | None = None) -> None:
    """Ack what `inbox` showed, with its receipts (`via`, `session`). Call it once the
    text is where the agent will see it: a crash before this shows it again."""
    if inbox.last_seq is None:
        return
    log.record_delivered(inbox.agent, inbox.shown, via, session)
    log.ack(inbox.agent, inbox.last_seq)


def render(agent: str, found: Sequence[Message], more: bool = False,
           budget: int = TEXT_BUDGET) -> Inbox:
    """The messages of `found` that fit in `budget` characters, oldest first (at least one)."""
    blocks: list[str] = []
    used = 0
    for message in found:
        block = message_text(message)
        if blocks and used + len(block) + 1 > budget:
            break
        blocks.append(block)
        used += len(block) + 1
    shown = tuple(found[:len(blocks)])
    more = more or len(shown) < len(found)
    if not shown:
        return Inbox(agent, "", shown, more)
    lines = [_headline(agent, len(shown)), *blocks]
    if more:
        lines.append(f"More messages wait for {agent}; they come next time"
                     f" (or now: bus poll --agent {agent}).")
    return Inbox(agent, "\n".join(lines), shown, more)


def message_text(message: Message) -> str:
    """`#seq from -> to type [corr=...] [reply-to=...] id=...` and the body on the next line."""
    to = message.to_agent if message.to_agent is not None else "*"
    header = [f"#{message.seq}", f"{message.from_agent} -> {to}", message.type]
    if message.correlation_id:
        header.append(f"corr={message.correlation_id}")
    if message.in_reply_to:
        header.append(f"reply-to={message.in_reply_to}")
    header.append(f"id={message.id}")  # what a reply's in_reply_to names
    body = _body(message)
    return " ".join(header) if body is None else " ".join(header) + "\n" + body


def _headline(agent: str, count: int) -> str:
    noun = "message" if count == 1 else "messages"
    return f"agentbus: {count} {noun} for {agent}:"


def _body(message: Message) -> str | None:
    if message.payload_error:
        return f"(payload unreadable: {message.payload_error})"
    if message.payload_preview is not None:  # a blob: only its first characters were read
        return _cut(message.payload_preview, message.payload_size or 0, message.seq)
    if message.payload is None:
        return None
    if isinstance(message.payload, str):
        text = message.payload
    else:
        text = orjson.dumps(message.payload).decode()
    return text if len(text) <= BODY_MAX else _cut(text, len(text.encode()), message.seq)


def _cut(text: str, size: int, seq: int) -> str:
    """The body's first characters, and how to get the rest (the MCP tool `poll` by seq)."""
    return f"{text[:BODY_MAX]}... (cut; {size} bytes in all: poll with seq={seq} for the rest)"
