"""The answers `bus mcp` gives at its start, before the MCP SDK is imported.

A client's first requests are the handshake and the listings (tools,
prompts, resources, resource templates; a ping; in the 2026 era a listen for
their changes), and what the server answers to them depends on the server's
options and on the protocol version only, never on the client. So they are
answered from a table of the SDK's own answers for these options
(start_table.py asks them), one per protocol version:

- `initialize` in the client's version if the table has it, else in the
  version the SDK offers instead (as the SDK negotiates); the listings that
  follow in the version agreed;
- a 2026-era request (its version in the `_meta` envelope) in that version.

A request the table cannot answer (another method, a page cursor, a version
the SDK does not speak) waits for the server.

The table comes from the cache of an earlier start with this installation
and these options (`$XDG_CACHE_HOME/agentbus/mcp-start.json`), else from the
tables shipped for the default options (start_answers.json), which a first
start uses. Either is checked once the server is built (stdio.py): a tool
listing that differs is followed by `notifications/tools/list_changed`, and
the server's own table is cached. This module imports nothing of the SDK.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bus import __version__
from bus.mcpserver.instructions import instructions
from bus.mcpserver.session import AgentSession

# The questions a client asks at its start, besides initialize; none takes an argument.
LISTINGS = ("tools/list", "prompts/list", "resources/list", "resources/templates/list", "ping",
            "server/discover")
ENVELOPE_VERSION = "io.modelcontextprotocol/protocolVersion"  # a 2026-era request's version
# A 2026-era client subscribes to the server's list changes with a listen request, whose
# stream begins with an acknowledgement naming the request's id.
LISTEN = "subscriptions/listen"
LISTENED = "notifications/subscriptions/acknowledged"
SUBSCRIPTION_ID = "io.modelcontextprotocol/subscriptionId"
LISTEN_FILTER = {"toolsListChanged": True, "promptsListChanged": True,
                 "resourcesListChanged": True}  # the start table's: what Claude Code asks
SHIPPED_PATH = Path(__file__).with_name("start_answers.json")
KEPT_INSTALLATIONS = 8  # cache entries kept, the most recently used


def question(method: str, version: str) -> str:
    return f"{method} {version}"


def selection(session: AgentSession) -> str:
    """The options a server's answers depend on: whether the agent joins, and the tool
    groups listed beside the daily loop."""
    return orjson.dumps({"joining": session.agent is None,
                         "tools": sorted(session.tools)}).decode()


class StartAnswers:
    """One table of answers, for one agent: its instructions are filled in."""

    def __init__(self, table: dict[str, Any] | None, agent: str | None) -> None:
        table = table or {}
        self.offered: str | None = table.get("offered")
        self.answers: dict[str, int] = table.get("answers", {})
        self.distinct: list[Any] = table.get("distinct", [])
        self.templated = frozenset(table.get("templated", ()))
        self.agent = agent

    def version_agreed(self, requested: Any) -> str | None:
        """The version an `initialize` asking for `requested` agrees on: the client's if
        the SDK speaks it, else the one it offers (None for no version: the SDK refuses)."""
        if not isinstance(requested, str):
            return None
        return requested if question("initialize", requested) in self.answers else self.offered

    def answer(self, method: str, version: str | None) -> dict[str, Any] | None:
        """The SDK's answer ({"result": ...} or {"error": ...}) to `method` in `version`."""
        key = question(method, version or "")
        if key not in self.answers:
            return None
        stored = self.distinct[self.answers[key]]
        if key not in self.templated:
            return stored
        return {"result": {**stored["result"], "instructions": instructions(self.agent)}}

    def acknowledgement(self, params: dict[str, Any], version: str | None,
                        request_id: Any) -> dict[str, Any] | None:
        """The acknowledgement the SDK begins a listen stream with, for a listen request
        asking for what the table's asked for; None for another."""
        answer = self.answer(LISTEN, version)
        if answer is None or "notification" not in answer \
                or params.get("notifications") != LISTEN_FILTER:
            return None
        notification = answer["notification"]
        meta = {**notification["params"]["_meta"], SUBSCRIPTION_ID: request_id}
        return {"jsonrpc": "2.0", **notification,
                "params": {**notification["params"], "_meta": meta}}

    def differs(self, other: StartAnswers, method: str, version: str | None) -> bool:
        return self.answer(method, version) != other.answer(method, version)


def start_answers(session: AgentSession, cache: StartCache) -> tuple[StartAnswers, bool]:
    """The answers for `session`'s options, and whether they are cached: the SDK's at an
    earlier start with this installation, else the shipped ones."""
    cached = cache.table()
    table = cached or _read(SHIPPED_PATH).get(selection(session))
    return StartAnswers(table, session.agent), cached is not None


class StartCache:
    """The SDK's table from earlier starts with this installation and these options.

    One JSON file in the user's cache directory, keyed by installation and
    options; a cache that cannot be read or written is no cache.
    """

    def __init__(self, path: Path, key: str) -> None:
        self.path, self.key = path, key

    @classmethod
    def of(cls, session: AgentSession) -> StartCache:
        return cls(cache_path(), installation_key(selection(session)))

    def table(self) -> dict[str, Any] | None:
        entry = _read(self.path).get(self.key)
        return entry.get("table") if isinstance(entry, dict) else None

    def keep(self, table: dict[str, Any]) -> None:
        everything = _read(self.path)
        if everything.get(self.key, {}).get("table") == table:
            return  # as it was: no write at every start
        everything[self.key] = {"used": time.time(), "table": table}
        newest = sorted(everything, key=lambda k: everything[k].get("used", 0))[
            -KEPT_INSTALLATIONS:]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            spare = self.path.with_name(f"{self.path.name}.{os.getpid()}")
            spare.write_bytes(orjson.dumps({k: everything[k] for k in newest}))
            os.replace(spare, self.path)  # whole or not at all: starts read it concurrently
        except OSError:
            pass


def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "agentbus" / "mcp-start.json"


def installation_key(options: str) -> str:
    """What the SDK's answers depend on besides the options, cheap to compute (about a
    millisecond): the Python, the SDK, our sources' newest change, and the directories
    packages are installed in, whose change time moves when a package (a tool group
    registered by another package, a new SDK) is installed or removed."""
    sdk = importlib.util.find_spec("mcp")  # found, not imported
    sdk_init = os.stat(sdk.origin) if sdk is not None and sdk.origin else None
    return orjson.dumps([
        __version__, sys.executable, sys.version, options,
        None if sdk_init is None else [sdk.origin, sdk_init.st_mtime_ns, sdk_init.st_size],
        max(_newest_source(Path(spec.origin).parent) for name in ("bus", "workers", "blobs")
            if (spec := importlib.util.find_spec(name)) is not None and spec.origin),
        [_changed(entry) for entry in sys.path if entry.endswith("-packages")],
    ]).decode()


def _changed(directory: str) -> int | None:
    try:
        return os.stat(directory or ".").st_mtime_ns
    except OSError:
        return None


def _newest_source(directory: Path) -> int:
    newest = 0
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            if entry.name != "__pycache__":
                newest = max(newest, _newest_source(Path(entry.path)))
        elif entry.name.endswith((".py", ".json")):
            newest = max(newest, entry.stat().st_mtime_ns)
    return newest


def _read(path: Path) -> dict[str, Any]:
    try:
        stored = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return stored if isinstance(stored, dict) else {}
