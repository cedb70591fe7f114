"""The HTML of `bus serve`'s pages: each renders what a bus/views/queries.py function read.

Every value goes through `esc` (or is a `Safe` made here from escaped parts),
so a name or payload from the bus can never be markup. Every name is a link:
agents, workers, channels and messages to their pages, types and tasks to
the message browser filtered on them. Each page says when it was read
(`data-read-ms`) and which last seq it saw (`data-last-seq`); /static/live.js
marks it stale from there (see that file).
"""

from __future__ import annotations

import html
from functools import lru_cache
from pathlib import Path
from typing import Any
from typing import Iterable
from typing import Sequence
from urllib.parse import quote
from urllib.parse import urlencode

import orjson

from bus.log import browse
from bus.log.browse import LogFilter
from bus.log.browse import LogPage
from bus.channels.queries import ChannelDetail
from bus.channels.queries import DeadLetterSummary
from bus.log.messages import Message
from bus.log.messages import iso_utc
from bus.log.receipts import Receipt
from bus.views import queries

NAV = (("/", "overview"), ("/messages", "messages"), ("/agents", "agents"),
       ("/workers", "workers"), ("/tasks", "tasks"), ("/claims", "claims"),
       ("/reservations", "reservations"), ("/channels", "channels"),
       ("/dead-letters", "dead letters"), ("/pump", "pump units"), ("/history", "history"))
PREVIEW_CHARS = 120


STATIC = Path(__file__).resolve().parent / "static"


def inline_asset(name: str) -> str:
    """The text of /static/NAME, as a page's own `<style>` or `<script>` element.

    The console's pages carry their style and scripts (7 KB) instead of linking
    them: a page opened in a new tab then asks for nothing but itself. Linked,
    they came from the cache, and still cost a new tab 20 ms of 77 on this
    machine (docs/benchmarks.md).
    """
    found = (STATIC / name).stat()
    return _inline_asset(name, found.st_mtime_ns, found.st_size)


@lru_cache(maxsize=16)
def _inline_asset(name: str, _mtime_ns: int, _size: int) -> str:
    text = (STATIC / name).read_text(encoding="utf-8")
    if name.endswith(".css"):
        return f"<style>{text}</style>"
    # "</" would end the element early; in a script it may only be in a string or a comment
    code = text.replace("</", "<\\/")
    return f'<script data-src="/static/{name}">{code}</script>'


class Safe(str):
    """Text that is already HTML (escaped where it came from the bus)."""


def esc(value: Any) -> Safe:
    if isinstance(value, Safe):
        return value
    return Safe(html.escape("-" if value is None else str(value)))


def join(parts: Iterable[Any], sep: str = "") -> Safe:
    return Safe(sep.join(esc(p) for p in parts))


def link(href: str, text: Any, **attrs: str) -> Safe:
    extra = "".join(f' {k.replace("_", "-")}="{html.escape(v)}"' for k, v in attrs.items())
    return Safe(f'<a href="{html.escape(href)}"{extra}>{esc(text)}</a>')


def messages_href(**params: Any) -> str:
    given = {k: str(v) for k, v in params.items() if v is not None}
    return "/messages" + ("?" + urlencode(given) if given else "")


# The links to named things are kept once made: a page of fifty messages names a
# few agents, types and tasks many times, and quoting and escaping them again was
# most of the time the browser's server spent on a page (docs/benchmarks.md).
NAMES_KEPT = 4096


@lru_cache(maxsize=NAMES_KEPT)
def agent_link(name: str | None) -> Safe:
    return link(f"/agents/{quote(name, safe='')}", name) if name else esc("(everyone)")


@lru_cache(maxsize=NAMES_KEPT)
def worker_link(name: str) -> Safe:
    return link(f"/workers/{quote(name, safe='')}", name)


@lru_cache(maxsize=NAMES_KEPT)
def channel_link(name: str) -> Safe:
    return link(f"/channels/{quote(name, safe='')}", name)


def message_link(seq: int) -> Safe:
    if isinstance(seq, int):  # nothing to escape in a number (and fifty on a page)
        return Safe(f'<a href="/messages/{seq}">{seq}</a>')
    return link(f"/messages/{seq}", seq)


@lru_cache(maxsize=NAMES_KEPT)
def type_link(type_: str) -> Safe:
    return link(messages_href(type=type_), type_)


@lru_cache(maxsize=NAMES_KEPT)
def task_link(task: str | None) -> Safe:
    """A task's page: its place in the graph, its lease, and a link to its messages."""
    return link(f"/tasks/{quote(task, safe='')}", task) if task else esc(None)


def when(ts_ms: int | None) -> Safe:
    """As bus.log.messages.iso_utc, with the second's text kept once made (a page of a busy
    log shows many messages of the same second)."""
    if ts_ms is None:
        return esc(None)
    return Safe(f"{_iso_second(ts_ms // 1000)}.{ts_ms % 1000:03d}Z")


@lru_cache(maxsize=NAMES_KEPT)
def _iso_second(ts_s: int) -> str:
    return iso_utc(ts_s * 1000)[:-5]


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], *, id: str = "",
          sort: tuple[str, bool] | None = None, sortable: Sequence[str] = ()) -> Safe:
    """A table; the columns in `sortable` are links that sort by them (`sort`: now)."""
    head = "".join(f"<th>{_sort_header(c, sort) if c in sortable else esc(c)}</th>"
                   for c in columns)
    body = ["<tr>" + "".join(f"<td>{esc(v)}</td>" for v in row) + "</tr>" for row in rows]
    ident = f' id="{html.escape(id)}"' if id else ""
    return Safe(f"<table{ident}><tr>{head}</tr>"
                f"{''.join(body) or '<tr><td>none</td></tr>'}</table>")


def _sort_header(column: str, sort: tuple[str, bool] | None) -> Safe:
    descending = sort is not None and sort[0] == column and not sort[1]
    mark = "" if sort is None or sort[0] != column else (" ▼" if sort[1] else " ▲")
    query = urlencode({"sort": column, "order": "desc" if descending else "asc"})
    return link(f"?{query}", column + mark)


def sort_rows(rows: list[Any], params: dict[str, str], columns: dict[str, str],
              default: str) -> tuple[list[Any], tuple[str, bool]]:
    """`rows` sorted by the `sort` parameter (a column title; `columns` maps it to the
    attribute), `order=desc` for descending; an unknown column sorts by `default`."""
    column = params.get("sort", default)
    if column not in columns:
        column = default
    descending = params.get("order") == "desc"
    attribute = columns[column]
    present = [row for row in rows if getattr(row, attribute) is not None]
    missing = [row for row in rows if getattr(row, attribute) is None]  # last either way
    ordered = sorted(present, key=lambda row: _sort_key(getattr(row, attribute)),
                     reverse=descending) + missing
    return ordered, (column, descending)


def _sort_key(value: Any) -> tuple[int, Any]:
    """Numbers by value, before anything else by its text."""
    if isinstance(value, (int, float)):
        return (0, value)
    return (1, str(value))


def shell(title: str, body: str, read_ms: int, last_seq: int,
          scripts: Sequence[str] = ()) -> str:
    """The page around `body`: navigation, the live/stale marker, live.js and `scripts`
    (more of /static's), with the style, all inline (see inline_asset)."""
    nav = join((link(href, name) for href, name in NAV), " · ")
    return (
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)} · bus serve</title>"
        f"{inline_asset('style.css')}</head>"
        f"<body data-read-ms=\"{read_ms}\" data-last-seq=\"{last_seq}\">"
        f"<header><h1>{esc(title)}</h1><nav>{nav}</nav>"
        f"<p id=\"live\" class=\"\">read at {when(read_ms)}</p></header>"
        f"<main>{body}</main>"
        + "".join(inline_asset(name) for name in ("live.js", *scripts))
        + "</body></html>")


def failure_page(title: str, error: str, read_ms: int) -> str:
    body = f"<p class=\"error\" id=\"error\">{esc(error)}</p>"
    return shell(title, body, read_ms, 0).replace(
        f"<p id=\"live\" class=\"\">read at {when(read_ms)}</p>",
        f"<p id=\"live\" class=\"stale\">stale: the bus cannot be read: {esc(error)}</p>")


def preview(message: Message) -> str:
    if message.payload_ref is not None:
        return f"(blob {message.payload_ref[:19]}…, {message.payload_size or '?'} bytes)"
    if message.payload_error is not None:
        return f"({message.payload_error})"
    text = orjson.dumps(message.payload).decode() if message.payload is not None else ""
    return text if len(text) <= PREVIEW_CHARS else text[:PREVIEW_CHARS] + "…"


MESSAGE_COLUMNS = ("seq", "time", "from", "to", "type", "task", "payload")


def message_rows(found: Iterable[Message]) -> list[list[Any]]:
    return [[message_link(m.seq), when(m.ts_ms), agent_link(m.from_agent),
             agent_link(m.to_agent), type_link(m.type), task_link(m.correlation_id), preview(m)]
            for m in found]


def messages_table(found: Iterable[Message], id: str) -> Safe:
    return table(MESSAGE_COLUMNS, message_rows(found), id=id)


# --- the browser -----------------------------------------------------------------


_FILTER_FIELDS = (("type", "type"), ("sender", "from"), ("to", "to"), ("task", "task"),
                  ("since", "since (15m, 1h, 2d)"), ("text", "text"))


def messages_page(filt: LogFilter, page: LogPage | None, error: str | None) -> Safe:
    """The filter form (a GET form: the filters are the URL), then messages_results."""
    inputs = "".join(
        f'<label>{esc(label)} <input name="{name}" value="{esc(getattr(filt, name) or "")}"'
        f'{" disabled" if name == "text" and page is not None and not page.search_enabled else ""}'
        "></label>" for name, label in _FILTER_FIELDS)
    form = (f'<form id="filters" method="get" action="/messages">{inputs}'
            '<button type="submit">filter</button> '
            f'{link("/messages", "clear", id="clear")}</form>')
    return Safe(form + messages_results(filt, page, error))


def messages_results(filt: LogFilter, page: LogPage | None, error: str | None) -> Safe:
    """What the filters found: the page and its links, or why not (`error`). Also served
    alone, for /static/browse.js to put in place of the one shown (see Console.browse)."""
    if error is not None:
        return Safe(f'<div id="results"><p class="error" id="error">{esc(error)}</p></div>')
    assert page is not None
    notes = []
    if not page.search_enabled:
        notes.append("text search is off for this bus (`bus search --enable` turns it on)")
    if page.scanned_to is not None:
        notes.append(f"no more matches down to seq {page.scanned_to} (a page reads at most"
                     f" {browse.SCAN_WINDOW:,} messages without an indexed filter);"
                     " older ones follow")
    paging = [link(messages_href(**filt.params(before=None)), "newest", id="newest")]
    if page.next_before is not None:
        paging.append(link(messages_href(**filt.params(before=page.next_before)), "older →",
                           id="older"))
    return Safe('<div id="results">' + "".join(f'<p class="note">{esc(n)}</p>' for n in notes)
                + messages_table(page.messages, "messages") + f'<p>{join(paging, " ")}</p></div>')


# --- one thing each ----------------------------------------------------------------


def pairs(items: Iterable[tuple[str, Any]]) -> Safe:
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in items)
    return Safe(f'<table class="pairs">{rows}</table>')


def section(title: str, *parts: Any) -> Safe:
    return Safe(f"<section><h2>{esc(title)}</h2>{join(parts)}</section>")


def message_page(detail: queries.MessageDetail) -> Safe:
    m = detail.message
    facts = [("seq", m.seq), ("id", m.id), ("time", when(m.ts_ms)),
             ("from", agent_link(m.from_agent)), ("to", agent_link(m.to_agent)),
             ("type", type_link(m.type)),
             ("task / correlation id", task_link(m.correlation_id)),
             ("in reply to", link(f"/messages/{detail.answers.seq}", m.in_reply_to)
              if detail.answers else m.in_reply_to)]
    if m.payload_ref is not None:
        facts.append(("blob", f"{m.payload_ref} ({m.payload_size or '?'} bytes)"))
    if m.payload_error is not None:
        facts.append(("payload error", m.payload_error))
    if detail.channel is not None:
        facts.append(("channel", channel_link(detail.channel["name"])))
        facts.append(("topic / priority / status", f"{detail.channel['topic']} /"
                      f" {detail.channel['priority']} / {detail.channel['status']}"))
    shown = (m.payload_preview if m.payload_ref is not None
             else orjson.dumps(m.payload, option=orjson.OPT_INDENT_2).decode())
    channel = channel_link(detail.channel["name"]) if detail.channel else ""
    deliveries = table(("channel", "recipient", "status", "attempts", "retries", "delivered",
                        "acked", "last error"),
                       [[channel, agent_link(d.recipient), d.status, d.attempts,
                         d.retry_count, when(d.delivered_at_ms), when(d.acked_at_ms),
                         d.last_error] for d in detail.deliveries], id="deliveries")
    return join([
        pairs(facts), section("payload", Safe(f'<pre id="payload">{esc(shown)}</pre>')),
        receipt_section(detail.receipt) if detail.receipt else "",
        section("deliveries", deliveries),
        section(f"replies (among the next {queries.REPLY_WINDOW:,} messages)",
                messages_table(detail.replies, "replies")),
        section(f"thread (same task / correlation id; the first {queries.THREAD_MAX})",
                messages_table(detail.thread, "thread"),
                link(messages_href(task=m.correlation_id), "the whole thread, newest first")
                if m.correlation_id else ""),
        section("more", join([link(messages_href(sender=m.from_agent), f"from {m.from_agent}"),
                              link(messages_href(type=m.type), f"of type {m.type}"),
                              link(messages_href(before=m.seq + 1), "the log from here")],
                             " · "))])


RECEIPT_STATES = {"sent": "sent, never delivered to the recipient's session",
                  "delivered": "delivered to the recipient's session, not acked yet",
                  "acked": "acked by the recipient"}


def receipt_section(receipt: Receipt) -> Safe:
    """A direct message's receipt: whether it reached its recipient's session, and how."""
    facts = [("state", RECEIPT_STATES[receipt.state])]
    d = receipt.delivery
    if d is not None:
        facts += [("first delivered", when(d.first_ms)), ("last delivered", when(d.last_ms)),
                  ("deliveries", d.deliveries), ("last via", d.via),
                  ("session", d.session or "-")]
    return Safe(f'<section id="receipt"><h2>receipt</h2>{pairs(facts)}</section>')


def agent_page(detail: queries.AgentDetail, now: int,
               seen: Sequence[tuple[int, str]] = ()) -> Safe:
    """`seen`: the liveness changes the server saw (the file keeps only the last beat)."""
    beat = detail.liveness
    facts = [("liveness", beat.state if beat else "never beat"),
             ("last beat", when(beat.ts_ms) if beat else None),
             ("silent for", f"{(now - beat.ts_ms) / 1000:.1f} s" if beat else None),
             ("status / task", f"{beat.status} / {beat.task}" if beat else None),
             ("cursor (last acked seq)", detail.cursor)]
    if detail.is_worker:
        facts.append(("worker", worker_link(detail.agent)))
    return join([
        pairs(facts),
        section("liveness as this server saw it (the last hour)", table(
            ("since", "state"), [[when(ts), state] for ts, state in reversed(seen)],
            id="liveness")),
        section("claims", claims_rows_table(detail.claims, now, "claims")),
        section("file reservations", table(("pattern", "mode", "expires", "reason"), [
            [r.pattern, r.mode, when(r.expires_at_ms), r.reason] for r in detail.reservations],
            id="reservations")),
        section("channels", table(("channel", "role"), [[channel_link(n), r]
                                                        for n, r in detail.channels])),
        section("newest messages sent", messages_table(detail.sent, "sent"),
                link(messages_href(sender=detail.agent), "all messages from it")),
        section("newest messages to it", messages_table(detail.received, "received"),
                link(messages_href(to=detail.agent), "all messages to it"))])


def claims_rows_table(claims: Iterable[Any], now: int, id: str, sort: Any = None,
                      sortable: Sequence[str] = ()) -> Safe:
    return table(("task", "holder", "fence", "claimed", "lease left s", "attempt"),
                 [[task_link(c.task_id), agent_link(c.agent), c.fence, when(c.claimed_at_ms),
                   f"{(c.lease_until_ms - now) / 1000:.1f}", f"{c.attempts}/{c.max_attempts}"]
                  for c in claims], id=id, sort=sort, sortable=sortable)


def worker_page(detail: queries.WorkerDetail) -> Safe:
    w = detail.worker
    facts = [("state", w.state), ("task", task_link(w.task)), ("agent", agent_link(w.worker)),
             ("branch", w.branch), ("base", w.base), ("repository", w.repo),
             ("worktree", w.worktree), ("head commit", w.head_commit),
             ("merge commit", w.merge_commit), ("review note", w.note),
             ("created", when(w.created_at_ms)), ("updated", when(w.updated_at_ms))]
    history = table(("seq", "time", "from", "to", "command"),
                    [[message_link(h.seq), when(h.ts_ms), h.from_state, h.to_state, h.command]
                     for h in detail.history], id="history")
    commits = (table(("commit",), [[c] for c in detail.commits], id="commits")
               if detail.commits is not None else Safe(f'<p class="note" id="commits">'
                                                       f'{esc(detail.commits_note)}</p>'))
    return join([pairs(facts), section("state history (its state_change messages)", history),
                 section(f"commits on {w.branch} not on {w.base}", commits),
                 section("newest messages", messages_table(detail.sent, "sent"),
                         link(messages_href(sender=w.worker), "all messages from it"))])


def channel_page(detail: ChannelDetail) -> Safe:
    c = detail.channel
    facts = [("type", c.type), ("owner", agent_link(c.owner)), ("state", c.state),
             ("delivery", c.delivery_mode), ("open deliveries", c.open_deliveries),
             ("dead letters", c.dead_letters)]
    return join([
        pairs(facts),
        section("participants", table(("agent", "role", "joined"),
                                      [[agent_link(p.agent), p.role, when(p.joined_at_ms)]
                                       for p in detail.participants], id="participants")),
        section("newest deliveries", table(
            ("seq", "recipient", "status", "attempts", "retries", "delivered", "acked",
             "last error"),
            [[message_link(s), agent_link(d.recipient), d.status, d.attempts, d.retry_count,
              when(d.delivered_at_ms), when(d.acked_at_ms), d.last_error]
             for s, d in detail.deliveries], id="deliveries")),
        section("dead letters", dead_letters_table(detail.dead_letters, "dead-letters"))])


def dead_letters_table(letters: Iterable[DeadLetterSummary], id: str, sort: Any = None,
                       sortable: Sequence[str] = ()) -> Safe:
    return table(("id", "seq", "channel", "recipient", "retries", "last error", "dead since"),
                 [[d.id, message_link(d.seq), channel_link(d.channel), agent_link(d.recipient),
                   d.retry_count, d.last_error, when(d.dead_lettered_at_ms)] for d in letters],
                 id=id, sort=sort, sortable=sortable)


def counts(title: str, by: dict[str, int]) -> Safe:
    parts = [f"{sum(by.values())} {title}"] + [f"{n} {k}" for k, n in sorted(by.items())]
    return Safe(f'<p class="counts-line" id="counts">{esc(", ".join(parts))}</p>')


def tally(values: Iterable[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for value in values:
        found[value] = found.get(value, 0) + 1
    return found


def task_page(task_id: str, detail: Any, claim: Any, events: list[Message], now: int) -> Safe:
    """A task: in the graph (`detail`, a bus.coordination.tasks.TaskDetail) or only leased."""
    parts = []
    if detail is None:
        parts.append(Safe('<p class="note" id="not-in-graph">not in the task graph'
                          ' (`bus task add` puts it there): a correlation id or a lease;'
                          ' its lease and messages:</p>'))
    else:
        t = detail.task
        parts.append(pairs([("title", t.title), ("state", t.state), ("priority", t.priority),
                            ("ready", "yes" if detail.ready else "no"),
                            ("waiting on", f"{t.waiting_on} tasks"),
                            ("created", when(t.created_at_ms)),
                            ("finished", when(t.finished_at_ms)),
                            ("finished by", agent_link(t.finished_by) if t.finished_by
                             else None)]))
        neighbours = ("task", "title", "state")
        parts.append(section("depends on", table(neighbours, [
            [task_link(d.task_id), d.title, d.state] for d in detail.dependencies],
            id="dependencies")))
        parts.append(section("dependents", table(neighbours, [
            [task_link(d.task_id), d.title, d.state] for d in detail.dependents],
            id="dependents")))
    lease = ([("holder", agent_link(claim.agent)), ("fence", claim.fence),
              ("lease", "expired" if claim.expired(now)
               else f"{(claim.lease_until_ms - now) / 1000:.1f} s left"),
              ("attempt", f"{claim.attempts}/{claim.max_attempts}")]
             if claim is not None else [("holder", "nobody holds its lease")])
    parts.append(section("lease", pairs(lease)))
    parts.append(section("takeovers, releases, death (the bus's announcements)",
                         messages_table(events, "claim-events")))
    parts.append(section("messages", link(messages_href(task=task_id),
                                          f"every message about {task_id}", id="task-messages")))
    return join(parts)
