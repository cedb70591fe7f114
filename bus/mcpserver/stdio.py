"""`bus mcp` over stdio: the first answers come from a cache while the SDK loads.

Importing the MCP SDK and building the server takes about half a second (most of
it pydantic building the SDK's protocol types), yet a client's first requests are
the handshake and the tool listing, whose answers are the same at every start of
one installation. So `serve_stdio` answers those (`initialize`, `server/discover`,
`tools/list`) from a cache of what the SDK answered at an earlier start, while a
thread imports the SDK and builds the server. The first request that needs the
server waits for it; from then on the SDK serves the wire alone, through its own
stdio transport, with no cost per message.

The cache cannot stay wrong unnoticed. Its key is the installation (Python, the
SDK's files, our sources' newest change, whether the agent joins), and once the
SDK serves it is asked each question the cache answered again: its answers are
kept for the next start, and a tool listing that changed (a tool group installed
by another package, say) is followed by `notifications/tools/list_changed`, on
which clients list again. A handshake-era client's `initialize` and
`notifications/initialized` are replayed to the SDK, and its answer to the
replayed `initialize` dropped, so the SDK's session is the client's own. With no
cache (the first start of an installation), every request waits for the SDK.
"""

from __future__ import annotations

import fcntl
import importlib.util
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any
from typing import AsyncIterator

import orjson

from bus import __version__
from bus.mcpserver.instructions import instructions
from bus.mcpserver.session import AgentSession

CACHED_METHODS = frozenset({"initialize", "server/discover", "tools/list"})
HANDSHAKE = frozenset({"initialize", "notifications/initialized"})
CHECK_ID = "agentbus-start-check-"  # our own requests to the SDK; their answers go nowhere
EOF_GRACE_S = 1.0  # for running requests once stdin ends (the SDK's client waits 2 s, then kills)
KEPT_INSTALLATIONS = 8  # cache entries kept, the most recently used
LIST_CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
READ_SIZE = 1 << 16
LINE_LIMIT = 1 << 30  # a request's line may be as long as the client makes it, as in the SDK
FRONT_SWITCH_INTERVAL_S = 0.0005  # the import thread yields the GIL to an answer this soon

_BUILT, _EOF = object(), object()  # what the line queue carries besides lines


def serve_stdio(session: AgentSession) -> None:
    """Serve `session` to the MCP client on stdin/stdout until stdin ends."""
    wire = Wire()
    cache = StartCache.load(session.agent, session.tools)
    lines = Lines(wire)
    building = Building(session, lines.queue)
    front = Front(wire, cache, lines)
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(FRONT_SWITCH_INTERVAL_S)
    try:
        handed = front.answer_until_needed()
        if handed is None:  # stdin ended before anything needed the server
            return
        server = building.result()
    finally:
        sys.setswitchinterval(switch_interval)
    lines.stop_after_next()
    import anyio

    anyio.run(_serve, server, front, handed)


async def _serve(server: Any, front: Front, handed: list[bytes]) -> None:
    # MCPServer.run_stdio_async with our streams in place of the SDK's own claim of fd 0 and 1.
    from mcp.server.stdio import stdio_server

    lowlevel = server._lowlevel_server  # noqa: SLF001 - what run_stdio_async runs
    async with stdio_server(stdin=front.requests(handed), stdout=front.answers()) as streams:
        await lowlevel.run(*streams, lowlevel.create_initialization_options())


class Wire:
    """The client's stdin and stdout, moved to private descriptors.

    fd 0 then reads the null device and fd 1 writes to stderr, so neither a stray
    print nor a child process's output can reach the protocol (the SDK's own
    stdio transport does the same).
    """

    def __init__(self) -> None:
        self.read_fd = _private_copy(0)
        self.writer = os.fdopen(_private_copy(1), "wb")
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(2, 1)

    def send(self, message: dict[str, Any]) -> None:
        self.write(orjson.dumps(message))

    def write(self, line: bytes) -> None:
        # A blocking write, not a worker thread per message as the SDK's transport has: a
        # full pipe means the client is not reading, and then there is no one to serve.
        self.writer.write(line + b"\n")
        self.writer.flush()


def _private_copy(fd: int) -> int:
    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)


class _Stopped:
    """The thread's last word: what it read past its last whole line."""

    def __init__(self, partial: bytes) -> None:
        self.partial = partial


class Lines:
    """The client's lines: read by a thread until the handover, then by the event loop.

    The front waits on one queue for either a line or the server being built. At
    the handover the thread stops after its next read, handing on what it read
    past its last whole line, and the event loop reads the pipe itself: no thread
    hop per request, where the SDK's transport has one.
    """

    def __init__(self, wire: Wire) -> None:
        self.fd = wire.read_fd
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.stopping = threading.Event()
        threading.Thread(target=self._read, name="mcp-stdin", daemon=True).start()

    def _read(self) -> None:
        buffer = bytearray()
        while chunk := os.read(self.fd, READ_SIZE):
            buffer += chunk
            for line in _whole_lines(buffer):
                self.queue.put(line)
            if self.stopping.is_set():
                self.queue.put(_Stopped(bytes(buffer)))
                return
        if buffer:
            self.queue.put(bytes(buffer))  # a last line without its newline
        self.queue.put(_EOF)

    def stop_after_next(self) -> None:
        self.stopping.set()

    async def rest(self) -> AsyncIterator[bytes]:
        """The lines not read yet: from the queue until the thread stops, then the pipe's."""
        import anyio

        while not isinstance(item := await anyio.to_thread.run_sync(self.queue.get), _Stopped):
            if item is _EOF:
                return
            if item is not _BUILT:
                yield item
        async for line in _read_directly(self.fd, item.partial):
            yield line


async def _read_directly(fd: int, partial: bytes) -> AsyncIterator[bytes]:
    """The lines on `fd`, `partial` first: read by the event loop from a pipe, or, for a
    file given as stdin, by a worker thread a chunk at a time."""
    import asyncio

    import anyio

    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    reader.feed_data(partial)
    try:
        await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", closefd=False))
    except ValueError:  # not a pipe, socket or terminal
        buffer = bytearray(partial)
        while chunk := await anyio.to_thread.run_sync(os.read, fd, READ_SIZE):
            buffer += chunk
            for line in _whole_lines(buffer):
                yield line
        if buffer:
            yield bytes(buffer)
        return
    while line := await reader.readline():
        yield line


def _whole_lines(buffer: bytearray) -> list[bytes]:
    """The whole lines at the start of `buffer`, each with its newline, taken out of it."""
    end = buffer.rfind(b"\n") + 1
    if not end:
        return []
    lines = [line + b"\n" for line in bytes(buffer[:end]).split(b"\n")[:-1]]
    del buffer[:end]
    return lines


class Building(threading.Thread):
    """Imports the SDK and builds the server, then says so on the line queue."""

    def __init__(self, session: AgentSession, done: queue.SimpleQueue[Any]) -> None:
        super().__init__(name="mcp-build", daemon=True)
        self.session, self.done = session, done
        self.server: Any = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            from bus.mcpserver.server import build_server

            self.server = build_server(self.session)
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
            self.error = exc
        finally:
            self.done.put(_BUILT)

    def result(self) -> Any:
        self.join()
        if self.error is not None:
            raise self.error
        return self.server


class Front:
    """Answers what the cache can until the server is needed, then hands the wire over."""

    def __init__(self, wire: Wire, cache: StartCache, lines: Lines) -> None:
        self.wire, self.cache, self.lines = wire, cache, lines
        self.served: list[tuple[str, Any]] = []  # (method, params) answered from the cache
        self.expected: dict[Any, Expected] = {}  # request id -> what to do with its answer
        self.outstanding: set[int | str] = set()  # the client's requests the server still owes
        self.drained: Any = None  # at the end of stdin: an anyio.Event, set as it empties

    def answer_until_needed(self) -> list[bytes] | None:
        """The lines for the server once it is built or needed; None if stdin ended first."""
        handed: list[bytes] = []
        while (line := self.lines.queue.get()) is not _BUILT:
            if line is _EOF:
                return None
            request = _request(line)
            method = request.get("method")
            result = self.cache.answer(method, request.get("params"))
            if result is not None and "id" in request:
                self.wire.send({"jsonrpc": "2.0", "id": request["id"], "result": result})
                self.served.append((method, request.get("params")))
                if method == "initialize":  # the SDK must see it too; its answer is dropped
                    self.expected[request["id"]] = Expected(method, request["params"], True, True)
                    handed.append(line)
                continue
            handed.append(line)
            if method not in HANDSHAKE:
                break  # this one needs the server
        return _in_replay_order(handed, self._checks())

    def _checks(self) -> list[bytes]:
        """Each question the cache answered, put to the server again (not initialize:
        its replay is its check)."""
        checks = []
        for number, (method, params) in enumerate(self.served):
            if method == "initialize":
                continue
            request_id = f"{CHECK_ID}{number}"
            self.expected[request_id] = Expected(method, params, True, True)
            checks.append(orjson.dumps({"jsonrpc": "2.0", "id": request_id, "method": method,
                                        **({} if params is None else {"params": params})}))
        return checks

    async def requests(self, handed: list[bytes]) -> AsyncIterator[str]:
        """What the SDK reads: the lines handed over, then the client's.

        When stdin ends, the requests still running get up to EOF_GRACE_S to be
        answered before the SDK is told (it cancels what still runs then): a
        client that writes its requests and closes its end, as `bus mcp <
        requests.jsonl` does, gets its answers.
        """
        import anyio

        for line in handed:
            self._note(line)
            yield line.decode("utf-8", "replace")
        async for line in self.lines.rest():
            self._note(line)
            yield line.decode("utf-8", "replace")
        with anyio.move_on_after(EOF_GRACE_S):
            while self.outstanding:
                self.drained = anyio.Event()
                await self.drained.wait()

    def _note(self, line: bytes) -> None:
        request = _request(line)
        method, request_id = request.get("method"), request.get("id")
        if method == "notifications/cancelled":  # a cancelled request is not answered
            self._settle((request.get("params") or {}).get("requestId"))
        if method is None or not isinstance(request_id, (int, str)):
            return
        if request_id not in self.expected:
            self.outstanding.add(request_id)
            if method in CACHED_METHODS:
                self.expected[request_id] = Expected(method, request.get("params"), False,
                                                     False)

    def _settle(self, request_id: Any) -> None:
        self.outstanding.discard(request_id)
        if not self.outstanding and self.drained is not None:
            self.drained.set()

    def answers(self) -> Answers:
        return Answers(self)

    def answered(self, text: str) -> bool:
        """Note the server's answer (kept in the cache if it is one the front waits for);
        whether the client should see it."""
        if not (self.expected or self.outstanding):
            return True
        message = orjson.loads(text)
        if "method" in message:  # a notification, or a request of the server's own
            return True
        self._settle(message.get("id"))
        expected = self.expected.pop(message.get("id"), None)
        if expected is None:
            return True
        if "result" in message:  # an error is not kept, and is not the client's if ours
            changed = self.cache.keep(expected.method, expected.params, message["result"])
            if changed and expected.served and expected.method == "tools/list":
                self.wire.send(LIST_CHANGED)
        return not expected.swallowed


def _in_replay_order(handed: list[bytes], checks: list[bytes]) -> list[bytes]:
    """The handshake first (a handshake-era session must begin with it), then the checks,
    then the request that needed the server."""
    def handshake(line: bytes) -> bool:
        return _request(line).get("method") in HANDSHAKE
    return ([line for line in handed if handshake(line)] + checks
            + [line for line in handed if not handshake(line)])


class Expected:
    """An answer the front waits for: `swallowed` ones are its own; `served` ones the cache
    answered already, so a change is worth telling the client."""

    __slots__ = ("method", "params", "swallowed", "served")

    def __init__(self, method: str, params: Any, swallowed: bool, served: bool) -> None:
        self.method, self.params, self.swallowed, self.served = method, params, swallowed, served


class Answers:
    """The SDK's stdout: each answer to the wire, those the front waits for read first."""

    def __init__(self, front: Front) -> None:
        self.front = front

    async def write(self, text: str) -> None:
        if not self.front.answered(text):
            return
        self.front.wire.write(text.rstrip("\n").encode())

    async def flush(self) -> None:
        pass  # every write is flushed


def _request(line: bytes) -> dict[str, Any]:
    """The JSON-RPC message on a line, or {} when it is not one (the SDK answers those)."""
    try:
        message = orjson.loads(line)
    except orjson.JSONDecodeError:
        return {}
    return message if isinstance(message, dict) else {}


class StartCache:
    """What the SDK answered to the cacheable requests at earlier starts of this installation.

    One JSON file in the user's cache directory (`$XDG_CACHE_HOME/agentbus/mcp-start.json`),
    keyed by installation; a cache that cannot be read or written is no cache.
    The instructions name the agent, so they are stored without it and filled in.
    """

    def __init__(self, path: Path, key: str, agent: str | None,
                 answers: dict[str, Any]) -> None:
        self.path, self.key, self.agent, self.answers = path, key, agent, answers

    @classmethod
    def load(cls, agent: str | None, tools: frozenset[str] = frozenset()) -> StartCache:
        path = cache_path()
        key = installation_key(joining=agent is None, tools=tools)
        entry = _read(path).get(key, {})
        return cls(path, key, agent, entry.get("answers", {}) if isinstance(entry, dict) else {})

    def answer(self, method: Any, params: Any) -> dict[str, Any] | None:
        if method not in CACHED_METHODS:
            return None
        stored = self.answers.get(_question(method, params))
        if stored is None:
            return None
        result = dict(stored["result"])
        if stored["agent_instructions"]:
            result["instructions"] = instructions(self.agent)
        return result

    def keep(self, method: str, params: Any, result: dict[str, Any]) -> bool:
        """Store the SDK's answer; whether it differs from the one stored."""
        result = dict(result)
        templated = result.get("instructions") == instructions(self.agent)
        if templated:
            del result["instructions"]
        stored = {"result": result, "agent_instructions": templated}
        question = _question(method, params)
        if self.answers.get(question) == stored:
            return False
        self.answers[question] = stored
        self._save()
        return True

    def _save(self) -> None:
        everything = _read(self.path)
        everything[self.key] = {"used": time.time(), "answers": self.answers}
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


def installation_key(joining: bool, tools: frozenset[str] = frozenset()) -> str:
    """What the cached answers depend on, cheap to compute (under a millisecond)."""
    sdk = importlib.util.find_spec("mcp")  # found, not imported
    sdk_init = os.stat(sdk.origin) if sdk is not None and sdk.origin else None
    return orjson.dumps([
        __version__, sys.executable, sys.version, joining, sorted(tools),
        None if sdk_init is None else [sdk.origin, sdk_init.st_mtime_ns, sdk_init.st_size],
        max(_newest_source(Path(spec.origin).parent) for name in ("bus", "workers", "blobs")
            if (spec := importlib.util.find_spec(name)) is not None and spec.origin),
    ]).decode()


def _newest_source(directory: Path) -> int:
    newest = 0
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            if entry.name != "__pycache__":
                newest = max(newest, _newest_source(Path(entry.path)))
        elif entry.name.endswith(".py"):
            newest = max(newest, entry.stat().st_mtime_ns)
    return newest


def _question(method: str, params: Any) -> str:
    return f"{method} {orjson.dumps(params, option=orjson.OPT_SORT_KEYS).decode()}"


def _read(path: Path) -> dict[str, Any]:
    try:
        stored = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return stored if isinstance(stored, dict) else {}
