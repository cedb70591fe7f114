"""`bus mcp` over stdio: the first answers come at once, while the SDK loads.

Importing the MCP SDK and building the server takes a second or two on a busy
machine (most of it pydantic building the SDK's protocol types), yet a
client's first requests are the handshake and the listings, whose answers
depend on the server's options and the protocol version only. So
`serve_stdio` answers those from a table of the SDK's own answers
(start_answers.py), in whatever version the client speaks, while a thread
imports the SDK and builds the server. A request the table cannot answer (a
tool call) waits for the server, which gets every such request in order once
it is built; from then on the SDK serves the wire alone, through its own stdio
transport, with no cost per message.

A handshake-era client's `initialize` and `notifications/initialized` are
replayed to the SDK, and its answer to the replayed `initialize` dropped, so
the SDK's session is the client's own; so is a 2026-era `subscriptions/listen`,
acknowledged here, so that its stream is the SDK's. Once the server is built, it is asked
over its own transport (start_table.py) every start question when the table
was not cached (a first start: the shipped table), else only the tool listings
the client got (a few milliseconds); a table that was not the server's is
replaced in the cache by the server's, and if a tool listing the client got
differs, the client gets `notifications/tools/list_changed`, on which it
lists again.
"""

from __future__ import annotations

import fcntl
import os
import queue
import sys
import threading
from typing import Any
from typing import AsyncIterator

import orjson

from bus.mcpserver.session import AgentSession
from bus.mcpserver.start_answers import ENVELOPE_VERSION
from bus.mcpserver.start_answers import LISTEN
from bus.mcpserver.start_answers import LISTENED
from bus.mcpserver.start_answers import SUBSCRIPTION_ID
from bus.mcpserver.start_answers import StartAnswers
from bus.mcpserver.start_answers import StartCache
from bus.mcpserver.start_answers import start_answers

HANDSHAKE = frozenset({"initialize", "notifications/initialized"})
# Answered here and replayed to the SDK, which must hold the session (initialize) or the
# stream (a listen): its own first answer to them is dropped.
REPLAYED = frozenset({"initialize", LISTEN})
EOF_GRACE_S = 1.0  # for running requests once stdin ends (the SDK's client waits 2 s, then kills)
LIST_CHANGED = {"jsonrpc": "2.0", "method": "notifications/tools/list_changed"}
READ_SIZE = 1 << 16
LINE_LIMIT = 1 << 30  # a request's line may be as long as the client makes it, as in the SDK
FRONT_SWITCH_INTERVAL_S = 0.0005  # the import thread yields the GIL to an answer this soon

_BUILT, _EOF = object(), object()  # what the line queue carries besides lines


def serve_stdio(session: AgentSession) -> None:
    """Serve `session` to the MCP client on stdin/stdout until stdin ends."""
    wire = Wire()
    cache = StartCache.of(session)
    answers, cached = start_answers(session, cache)
    lines = Lines(wire)
    building = Building(session, lines.queue, None if cached else cache)
    front = Front(wire, answers, lines)
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(FRONT_SWITCH_INTERVAL_S)
    try:
        handed = front.answer_until_built()
        if handed is None:  # stdin ended before anything needed the server
            return
        server, table = building.result()
    finally:
        sys.setswitchinterval(switch_interval)
    front.correct(server, table, cache, session.agent)
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
    """Imports the SDK and builds the server, then says so on the line queue.

    Given a cache (the start's table was not cached: a first start), it asks the
    built server every start question first, and keeps its table there.
    """

    def __init__(self, session: AgentSession, done: queue.SimpleQueue[Any],
                 cache: StartCache | None) -> None:
        super().__init__(name="mcp-build", daemon=True)
        self.session, self.done, self.cache = session, done, cache
        self.server: Any = None
        self.table: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            from bus.mcpserver.server import build_server
            from bus.mcpserver.start_table import start_table

            self.server = build_server(self.session)
            if self.cache is not None:
                self.table = start_table(self.server, self.session.agent)
                self.cache.keep(self.table)
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread
            self.error = exc
        finally:
            self.done.put(_BUILT)

    def result(self) -> tuple[Any, dict[str, Any] | None]:
        """The server, and its table if it was asked."""
        self.join()
        if self.error is not None:
            raise self.error
        return self.server, self.table


class Front:
    """Answers what the start's table can until the server is built, then hands the wire
    over."""

    def __init__(self, wire: Wire, table: StartAnswers, lines: Lines) -> None:
        self.wire, self.table, self.lines = wire, table, lines
        self.version: str | None = None  # agreed by the handshake answered here
        self.served: list[tuple[str, str | None]] = []  # (method, version) answered here
        self.dropped: set[Any] = set()  # ids of the replayed requests the SDK answers to us
        self.acknowledged: set[Any] = set()  # the listens whose acknowledgement it sends us
        self.outstanding: set[int | str] = set()  # the client's requests the server still owes
        self.drained: Any = None  # at the end of stdin: an anyio.Event, set as it empties

    def answer_until_built(self) -> list[bytes] | None:
        """The lines for the server, once it is built; None if stdin ended with nothing for it.

        A request the table cannot answer waits for the server, and those after it are
        answered all the same: a client may ask something only the server answers
        (Claude Code's `subscriptions/listen`) before its listings, and JSON-RPC lets the
        answers come in any order.
        """
        handed: list[bytes] = []
        while (line := self.lines.queue.get()) is not _BUILT:
            if line is _EOF:
                if all(_request(waiting).get("method") in HANDSHAKE | REPLAYED
                       for waiting in handed):
                    return None
                self.lines.queue.put(_EOF)  # for the server too, once it has answered these
                break
            request = _request(line)
            if "id" in request and self._answered_here(request):
                if request.get("method") in REPLAYED:
                    handed.append(line)
                continue
            handed.append(line)
        return handed

    def _answered_here(self, request: dict[str, Any]) -> bool:
        method, params = request.get("method"), request.get("params")
        if not isinstance(method, str) or not (params is None or isinstance(params, dict)):
            return False
        if method == LISTEN:
            return self._acknowledged_here(request["id"], params or {})
        if method == "initialize":
            version = self.table.version_agreed((params or {}).get("protocolVersion"))
        elif set(params or {}) - {"_meta"}:  # a page cursor, say: the server answers that
            return False
        else:
            version = _envelope_version(params) or self.version
        answer = self.table.answer(method, version)
        if answer is None:
            return False
        self.wire.send({"jsonrpc": "2.0", "id": request["id"], **answer})
        self.served.append((method, version))
        if method == "initialize":
            self.version = version
            self.dropped.add(request["id"])  # the SDK's answer to it, once replayed
        return True

    def _acknowledged_here(self, request_id: Any, params: dict[str, Any]) -> bool:
        """A listen request acknowledged as the SDK would; the stream is the server's, and
        its own acknowledgement is dropped."""
        acknowledgement = self.table.acknowledgement(params, _envelope_version(params),
                                                     request_id)
        if acknowledgement is None:
            return False
        self.wire.send(acknowledgement)
        self.acknowledged.add(request_id)
        return True

    def correct(self, server: Any, table: dict[str, Any] | None, cache: StartCache,
                agent: str | None) -> None:
        """Tell the client to list the tools again if the server lists them otherwise than
        it was told. `table` is the server's (a first start), or None: the table was
        cached, and only the listings the client got are asked again (the whole table is
        asked and cached if one differs)."""
        from bus.mcpserver.start_table import start_table
        from bus.mcpserver.start_table import tool_listings

        listed = {version for method, version in self.served if method == "tools/list"}
        if table is None:
            if not self._told_otherwise(StartAnswers(tool_listings(server, listed), agent),
                                        listed):
                return
            table = start_table(server, agent)
            cache.keep(table)
        if self._told_otherwise(StartAnswers(table, agent), listed):
            self.wire.send(LIST_CHANGED)

    def _told_otherwise(self, asked: StartAnswers, versions: set[str | None]) -> bool:
        return any(self.table.differs(asked, "tools/list", version) for version in versions)

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
        # A listen is a stream that ends only with the connection: not worth waiting for.
        if method not in (None, LISTEN) and isinstance(request_id, (int, str)) \
                and request_id not in self.dropped:
            self.outstanding.add(request_id)

    def _settle(self, request_id: Any) -> None:
        self.outstanding.discard(request_id)
        if not self.outstanding and self.drained is not None:
            self.drained.set()

    def answers(self) -> Answers:
        return Answers(self)

    def answered(self, text: str) -> bool:
        """Note the server's answer; whether the client should see it (not the answer to a
        replayed request: the client has had its own)."""
        if not (self.dropped or self.outstanding or self.acknowledged):
            return True
        message = orjson.loads(text)
        if "method" in message:  # a notification, or a request of the server's own
            return not self._acknowledgement_given(message)
        self._settle(message.get("id"))
        if message.get("id") in self.dropped:
            self.dropped.discard(message.get("id"))
            return False
        return True


    def _acknowledgement_given(self, message: dict[str, Any]) -> bool:
        if message["method"] != LISTENED:
            return False
        listen = ((message.get("params") or {}).get("_meta") or {}).get(SUBSCRIPTION_ID)
        if listen not in self.acknowledged:
            return False
        self.acknowledged.discard(listen)
        return True


def _envelope_version(params: dict[str, Any] | None) -> str | None:
    """A 2026-era request's protocol version, from its `_meta` envelope."""
    meta = (params or {}).get("_meta")
    version = meta.get(ENVELOPE_VERSION) if isinstance(meta, dict) else None
    return version if isinstance(version, str) else None


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
