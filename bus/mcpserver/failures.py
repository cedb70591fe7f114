"""Tool errors as an agent reads them: a code, the argument at fault, one sentence with the fix.

Every refused call ends as `{"error": {"code", "argument", "message"}}` in the
structured result (no `argument` when none is at fault) and as its text
`code: message` (a client that shows the model only an error's text, as Claude
Code does, keeps the code so). Three sources feed it:

- the arguments failed the tool's schema (pydantic's errors, rewritten here in
  the argument's name: no pydantic wording, no documentation URL);
- the library refused (`BusError.error_code`, `field` when it names one);
- the server itself refused (unknown tool or argument, not joined yet).

Library messages are written for the command line: `in_tool_terms` rewrites
their CLI hints (`bus channel create`, `pass force=True`) as tools and
arguments. docs/mcp.md lists the codes; `CODES` is that list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from typing import Mapping
from typing import Sequence

from bus.storage.errors import BusError

CODES = {
    "invalid_argument": "an argument's value is refused; the message says which and why",
    "missing_argument": "a required argument was not given",
    "unknown_argument": "the tool takes no argument of that name (no tool takes an agent id)",
    "unknown_tool": "no tool has that name",
    "not_joined": "call join(name) first: the server has no agent name yet",
    "already_joined": "this session has its name already; one session is one agent",
    "name_taken": "a live agent has that name; pick another, or give its reclaim_token",
    "bad_reclaim_token": "the reclaim_token is not the one join gave for that name",
    "not_found": "the channel, worker, consumer, thread or dead letter named does not exist",
    "conflict": "the state of the task, worker, thread or claim does not allow this now",
    "stale_fence": "the fence given is no longer the task's: another agent holds the task now",
    "reserved": "another live agent holds some of those paths exclusively (the message names them)",
    "read_only_token": "the HTTP token is read-only: only tools that change nothing may be called",
    "busy": "the bus or the organism is busy; call again a little later",
    "full": "the bus is full (disk, size limit or unfinished deliveries)",
    "read_only": "the bus file cannot be written by this server",
    "corrupt": "the bus file or a blob is damaged",
    "search_disabled": "full-text search is not enabled on this bus",
    "invalid_xml": "the xml argument cannot be parsed or is not a payload",
    "denied": "the organism does not allow this request",
    "unknown_organism": "no pump has ever booted an organism of that name on this bus",
    "organism_not_running": "the organism's pump is not running, so nothing would answer",
    "git": "a git command of the worker lifecycle failed",
    "refused": "any other refusal by the bus; the message says why",
    "internal": "the server failed unexpectedly; the message names the error",
}


@dataclass(frozen=True)
class Failure:
    """One refused call: `code` from CODES, the `argument` at fault (or None), the sentence."""

    code: str
    argument: str | None
    message: str

    def to_json_dict(self) -> dict[str, Any]:
        at_fault = {} if self.argument is None else {"argument": self.argument}
        return {"error": {"code": self.code, **at_fault, "message": self.message}}

    def text(self) -> str:
        """The error as one line of text: its code, then the message (which names the
        argument first): `unknown_argument: agent: claim takes no such argument; ...`."""
        return f"{self.code}: {self.message}"


def failure_of(exc: BusError) -> Failure:
    """The library's refusal, in tool terms."""
    code = getattr(exc, "error_code", "refused")
    field = getattr(exc, "field", None)
    return Failure(code if code in CODES else "refused",
                   field if isinstance(field, str) else None, in_tool_terms(str(exc)))


def unexpected(exc: BaseException) -> Failure:
    """A crash of the tool itself: its kind and text, nothing of the traceback."""
    return Failure("internal", None, f"the tool failed unexpectedly ({type(exc).__name__}:"
                                     f" {_shorten(str(exc), 200)}); the bus changed nothing"
                                     " that its own transaction did not commit")


def invalid_arguments(errors: Sequence[Mapping[str, Any]],
                      properties: Mapping[str, Any]) -> Failure:
    """The first of a schema validation's errors as one sentence naming the argument.

    `errors` is pydantic's `ValidationError.errors()`; `properties` the tool's input
    schema properties, whose descriptions say what a missing argument is for.
    """
    error = errors[0]
    argument = _argument(error.get("loc", ()))
    kind = error.get("type", "")
    if kind == "missing":
        description = properties.get(argument, {}).get("description", "")
        fix = f" ({description.rstrip('.')})" if description else ""
        return Failure("missing_argument", argument, f"{argument}: is required; give it{fix}")
    return Failure("invalid_argument", argument,
                   f"{argument}: {_expected(kind, error.get('ctx') or {}, error.get('msg', ''))}"
                   f", got {_shorten(repr(error.get('input')), 60)}")


def _argument(loc: Sequence[Any]) -> str:
    """("messages", 3, "type") -> "messages[3].type"."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "arguments"


_TYPES = {"int": "an integer", "float": "a number", "bool": "true or false",
          "string": "a string", "dict": "a JSON object", "list": "a JSON array",
          "model": "a JSON object"}


def _expected(kind: str, ctx: Mapping[str, Any], msg: str) -> str:
    """What the argument must be, from pydantic's error type and context."""
    base = kind.split("_", 1)[0]
    if kind.endswith(("_parsing", "_type")) and base in _TYPES:
        return f"must be {_TYPES[base]}"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=",
              "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()), "?")
        return f"must be {bounds[kind]} {limit}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '?')}"
    if kind == "string_too_short":
        return f"must have at least {ctx.get('min_length')} character(s)"
    if kind == "string_too_long":
        return f"must have at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items"
    if kind == "extra_forbidden":
        return "is not a field of this object"
    # Any other pydantic error: its own short message, in our form, without its URL.
    return msg[:1].lower() + msg[1:] if msg else "is refused"


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


# Command-line hints in library messages, and what an agent calls instead.
_TOOL_TERMS = (
    (re.compile(r"`bus channel create`"), "channel_create"),
    (re.compile(r"`bus channel list`"), "channel_list"),
    (re.compile(r"`bus dlq list`"), "dlq_list"),
    (re.compile(r"`worker status(?: [^`]*)?`"), "worker_status"),
    (re.compile(r"`bus consumers`"), "liveness"),
    (re.compile(r"see bus claims --dead"), "its claim is dead"),
    (re.compile(r"run `bus search --enable` \(or Bus\.enable_search\(\)\) once"),
     "the bus's operator enables it once; until then use channel_search"),
    (re.compile(r"choose another --worker id"), "choose another worker id"),
    (re.compile(r"or `worker cancel ([^`]+)`"), r"or ask whoever leads to cancel worker \1"),
    (re.compile(r"pass --repo with a git repository"),
     "start the server in a git repository"),
    (re.compile(r"pass --repo or run git init"), "start the server in a git repository"),
    (re.compile(r"pass --base with the branch to work from"), "give base, the branch to work from"),
    (re.compile(r"make a first commit \(git commit --allow-empty -m initial\)"),
     "make a first commit"),
    (re.compile(r"pass --force"), "pass force=true"),
    (re.compile(r"\b([a-z_]+)=True\b"), r"\1=true"),
)


def in_tool_terms(text: str) -> str:
    """`text` with the command line's hints rewritten as tool calls and arguments."""
    for pattern, replacement in _TOOL_TERMS:
        text = pattern.sub(replacement, text)
    return text
