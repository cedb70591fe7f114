"""`bus serve`: the status as a live, read-only web page (Starlette on uvicorn).

One reader thread per server (bus/views/follow.py) holds a read-only
connection, wakes on commits, and reads the status and the chart series in
one snapshot; every open page gets it as a server-sent event.
Pages never make the server read more: a hundred tabs cost one reader.
When reading fails (the file became corrupt or foreign, or is gone), every
page is told so and marks what it shows stale, `/api/status` answers 503
with the error, and the reader tries again until reading works.

Read-only by construction: the connection is opened read-only (and refuses
writes at prepare time), and the page has only GET routes (the only writes
are a token's last use, bus/coordination/tokens.py, and what the MCP endpoint of
`bus serve --mcp` does, bus/mcpserver/http.py). bus/views/guard.py checks
Host, Origin and tokens before any route. Plotly's own
`plotly.min.js`, shipped inside the plotly package, is served from the
installed package: the page needs no network.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any
from typing import AsyncContextManager
from typing import AsyncIterator
from typing import Callable
from typing import Protocol
from typing import Sequence

import apsw
import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.responses import Response
from starlette.responses import StreamingResponse
from starlette.routing import BaseRoute
from starlette.routing import Mount
from starlette.routing import Route
from starlette.staticfiles import StaticFiles

from bus.api import Bus
from bus.storage.db import connect
from bus.storage.db import translate_busy
from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed
from bus.log.messages import now_ms
from bus.views.charts import History
from bus.views.charts import chart_data
from bus.views.follow import follow
from bus.coordination.tokens import TokenChecker
from bus.views.follow import read_failure
from bus.views.guard import LOOPBACK
from bus.views.guard import Guard
from bus.views.guard import GuardSettings
from bus.views.routes import routes
from bus.views.status import read_status
from bus.views.status import status_of

log = logging.getLogger("bus.views")

STATIC = Path(__file__).resolve().parent / "static"


def snapshot(conn: apsw.Connection, path: str, durability: str,
             history: History | None = None) -> bytes:
    """The status and every chart's series, read in one transaction, as JSON
    (`history`: what the server kept of the charts so far, brought up to date)."""
    return snapshots(conn, path, durability, history)[0]


def snapshots(conn: apsw.Connection, path: str, durability: str,
              history: History | None = None) -> tuple[bytes, bytes]:
    """`snapshot`, and its brief: only the time and the last seq, in the same shape,
    for the pages that only need to know whether the bus moved on (bus/views/static/live.js)."""
    with translate_busy(conn), conn:  # an error names the file
        status = status_of(conn, path, durability)
        full = orjson.dumps({"status": status.to_json_dict(),
                             "charts": chart_data(conn, status, history)})
        brief = orjson.dumps({"status": {"now_ms": status.now_ms,
                                         "log": {"last_seq": status.log.last_seq}}})
        return full, brief


class Broadcaster:
    """Reads a snapshot after each commit and hands it to every open event stream.

    `latest` is the last snapshot read (None before the first); `failure`,
    while reading fails, is why: `{"error", "field", "since_ms"}`, sent to the
    pages as an event of its own and cleared by the next snapshot read.
    """

    def __init__(self, path: str, durability: str) -> None:
        self.path = path
        self.durability = durability
        self.latest: bytes | None = None
        self.latest_brief: bytes | None = None
        self.failure: dict[str, Any] | None = None
        self.history = History()  # only the reader thread touches it, after start()
        # each open stream, and whether it wants the brief snapshots only
        self._streams: dict[asyncio.Queue[bytes | None], bool] = {}
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Read the first snapshot, then start the reader thread; call from the event loop."""
        self._loop = asyncio.get_running_loop()
        try:
            conn = connect(self.path, readonly=True)
            try:
                self.latest, self.latest_brief = snapshots(conn, self.path, self.durability,
                                                           self.history)
            finally:
                conn.close()
        except Exception as exc:  # the reader thread goes on trying
            self._fail(read_failure(exc, self.path))
        self._thread = threading.Thread(target=self._follow, name="bus-serve-reader",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._end_streams()

    def end_streams_soon(self) -> None:
        """End every open event stream; safe from a signal handler or another thread."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._end_streams)

    def _end_streams(self) -> None:
        for stream in self._streams:
            _put_latest(stream, None)

    async def events(self, brief: bool = False) -> AsyncIterator[bytes]:
        """Server-sent events: the latest snapshot and any failure now, then one per change
        (`brief`: the brief snapshots)."""
        stream: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=1)
        self._streams[stream] = brief
        latest = self.latest_brief if brief else self.latest
        try:
            now = [latest] if latest is not None else []
            if self.failure is not None:
                now.append(orjson.dumps(self.failure))
            for payload in now:
                yield b"data: " + payload + b"\n\n"
            while (payload := await stream.get()) is not None:
                yield b"data: " + payload + b"\n\n"
        finally:
            self._streams.pop(stream, None)

    def _follow(self) -> None:
        follow(self.path, lambda conn: snapshots(conn, self.path, self.durability, self.history),
               self._publish_soon, self._stop, on_error=self._fail_soon)

    def _publish_soon(self, payloads: tuple[bytes, bytes]) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._publish, payloads)

    def _publish(self, payloads: tuple[bytes, bytes]) -> None:
        if self.failure is not None:
            log.warning("reading %s works again", self.path)
        (self.latest, self.latest_brief), self.failure = payloads, None
        self._send(*payloads)

    def _fail_soon(self, failure: BusError) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._fail, failure)

    def _fail(self, failure: BusError) -> None:
        """Tell the pages why reading fails, at each retry (so they know the server is
        there); the same failure again keeps its first time and is logged once."""
        if self.failure is None or self.failure["error"] != str(failure):
            log.warning("reading %s failed; trying again until it works: %s", self.path,
                        failure)
            self.failure = {"error": str(failure), "field": getattr(failure, "field", None),
                            "since_ms": now_ms()}
        failure = orjson.dumps(self.failure)
        self._send(failure, failure)

    def _send(self, payload: bytes, brief: bytes) -> None:
        for stream, wants_brief in self._streams.items():
            _put_latest(stream, brief if wants_brief else payload)


def _put_latest(stream: asyncio.Queue[bytes | None], item: bytes | None) -> None:
    """A slow page skips to the newest snapshot instead of queueing old ones."""
    if stream.full():
        stream.get_nowait()
    stream.put_nowait(item)


def plotly_js() -> Path:
    """plotly.min.js as the installed plotly package ships it."""
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


def create_app(path: str, durability: str = "normal", *, guard: GuardSettings | None = None,
               extra_routes: Sequence[BaseRoute] = (),
               extra_lifespan: Callable[[], AsyncContextManager[Any]] | None = None) -> Starlette:
    """The web app for the bus at `path`: the page, its files, the status and its events.

    `guard` checks Host, Origin and tokens before every route (bus/views/guard.py);
    `extra_routes` (the MCP endpoint) are served beside the page, and
    `extra_lifespan()` runs for as long as the app does.
    """
    broadcaster = Broadcaster(path, durability)
    middleware = [Middleware(Guard, settings=guard)] if guard is not None else []
    app = Starlette(lifespan=_lifespan(broadcaster, extra_lifespan), middleware=middleware,
                    routes=[*_PAGE_ROUTES, *routes(path, broadcaster.history), *extra_routes])
    app.state.broadcaster = broadcaster
    return app


def _lifespan(broadcaster: Broadcaster, extra: Callable[[], AsyncContextManager[Any]] | None
              ) -> Callable[[Starlette], AsyncContextManager[None]]:
    """The reader thread, and `extra()`, for as long as the app runs."""
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        broadcaster.start()
        try:
            if extra is None:
                yield
            else:
                async with extra():
                    yield
        finally:
            broadcaster.stop()
    return lifespan


# --- the live page's own routes: the page, its status, its events, its files --------------


def _broadcaster(request: Request) -> Broadcaster:
    return request.app.state.broadcaster


async def _page(_request: Request) -> Response:
    return FileResponse(STATIC / "index.html")


async def _status(request: Request) -> Response:
    broadcaster = _broadcaster(request)
    if broadcaster.failure is not None:  # the status cannot be read now: say why
        return Response(orjson.dumps(broadcaster.failure), status_code=503,
                        media_type="application/json")
    return Response(broadcaster.latest, media_type="application/json")


async def _events(request: Request) -> Response:
    brief = request.query_params.get("brief") == "1"
    return StreamingResponse(_broadcaster(request).events(brief), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


async def _plotly(_request: Request) -> Response:
    return FileResponse(plotly_js(), media_type="text/javascript")


_PAGE_ROUTES = (
    Route("/", _page), Route("/api/status", _status), Route("/events", _events),
    Route("/static/plotly.min.js", _plotly), Mount("/static", StaticFiles(directory=STATIC)),
)


class _Server(uvicorn.Server):
    """uvicorn's server, ending the event streams when asked to stop: it waits for
    open responses before it shuts the app down, and a stream never ends by itself.

    `ready()` is called once it serves: the app started and Ctrl-C handled by uvicorn.
    Said any earlier, a caller that stops the server on seeing it sent a SIGINT that
    met no handler yet, and the server did not stop.
    """

    def __init__(self, config: uvicorn.Config, broadcaster: Broadcaster,
                 ready: Callable[[], Any]) -> None:
        super().__init__(config)
        self.broadcaster = broadcaster
        self.ready = ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.ready()

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.broadcaster.end_streams_soon()
        super().handle_exit(sig, frame)


def check_host(host: str, checker: TokenChecker | None, require_token: bool = False) -> None:
    """Listen beyond this machine only when a token exists: then every path needs one."""
    no_token = checker is None or not checker.bus.tokens.any_usable()
    if require_token and no_token:
        raise ValidationFailed("require_token", "no token exists, so nobody could reach the"
                                                " server; create one with bus token create"
                                                " --agent ID")
    if host not in LOOPBACK and no_token:
        raise ValidationFailed(
            "host", f"{host} is reachable from other machines, so every request needs a token,"
                    " and none exists; create one with bus token create --agent ID, or use"
                    " 127.0.0.1")


def listen(host: str, port: int) -> socket.socket:
    """A bound socket (port 0: any free one); ValidationFailed when the address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Naming IPPROTO_TCP is what makes asyncio set TCP_NODELAY on each accepted
    # connection (it checks sock.proto, and an unnamed protocol is 0). Without it a
    # response's second write (uvicorn sends headers, then body) waits for the
    # client's delayed ACK: ~40 ms per request on a kept-alive connection.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ValidationFailed("port", f"cannot listen on {host}:{port} ({exc.strerror});"
                                       " pick another --port, or 0 for any free one") from None
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    return sock


class Extension(Protocol):
    """What is served beside the page on the same port (the MCP endpoint of
    bus/mcpserver/http.py): its routes, and what runs for as long as the app does."""

    def routes(self) -> Sequence[BaseRoute]: ...

    def running(self) -> AsyncContextManager[Any]: ...


@dataclass(frozen=True)
class ServerOptions:
    """Where the server listens and whom it lets in.

    A `host` beyond this machine needs a usable token in the file, and then
    every request needs one; `require_token` asks for one on loopback too.
    `certfile` and `keyfile` (PEM) serve HTTPS; `allowed_hosts` are the names
    clients use to reach a non-loopback host.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    allowed_hosts: tuple[str, ...] = ()
    certfile: str | None = None
    keyfile: str | None = None
    require_token: bool = False

    @property
    def tokens_everywhere(self) -> bool:
        """Whether every request needs a token (and so the server needs the bus to check it)."""
        return self.require_token or self.host not in LOOPBACK

    @property
    def plain_http_beyond_loopback(self) -> bool:
        """Whether tokens and the bus would cross the network unencrypted."""
        return self.host not in LOOPBACK and self.certfile is None


def serve(path: str, options: ServerOptions = ServerOptions(), *, durability: str = "normal",
          ready: Callable[[str], Any] = lambda url: None,
          open_bus: Callable[[], Bus] | None = None,
          extension: Callable[[Bus], Extension] | None = None) -> None:
    """Serve the page for the bus at `path` until interrupted; `ready(url)` is called once
    it listens.

    The page alone on loopback reads the file read-only. Tokens need the bus
    (a token's last use is written), and so does an `extension` (made from the
    bus, e.g. the MCP endpoint): then `open_bus()` opens it (the caller keeps
    and closes it; by default the bus at `path` is opened here and closed at
    the end). Raises ValidationFailed for a remote host without a token or a
    port that is taken, and what `read_status` raises for a file that cannot
    be shown.
    """
    with contextlib.ExitStack() as stack:
        bus = None
        if extension is not None or options.tokens_everywhere:
            bus = open_bus() if open_bus is not None else stack.enter_context(
                Bus.open(path, durability))
        served = extension(bus) if extension is not None and bus is not None else None
        _run(path, options, durability, ready, TokenChecker(bus) if bus is not None else None,
             served)


def _run(path: str, options: ServerOptions, durability: str, ready: Callable[[str], Any],
         checker: TokenChecker | None, extension: Extension | None) -> None:
    check_host(options.host, checker, options.require_token)
    read_status(path, durability)
    sock = listen(options.host, options.port)
    guard = GuardSettings(options.host, sock.getsockname()[1],
                          tokens_everywhere=options.tokens_everywhere,
                          allowed_hosts=options.allowed_hosts,
                          tls=options.certfile is not None, checker=checker)
    app = create_app(path, durability, guard=guard,
                     extra_routes=extension.routes() if extension is not None else (),
                     extra_lifespan=extension.running if extension is not None else None)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5,
                            ssl_certfile=options.certfile, ssl_keyfile=options.keyfile)
    server = _Server(config, app.state.broadcaster, lambda: ready(_url(options, guard.port)))
    server.run(sockets=[sock])


def _url(options: ServerOptions, port: int) -> str:
    shown_host = f"[{options.host}]" if ":" in options.host else options.host
    return f"{'https' if options.certfile is not None else 'http'}://{shown_host}:{port}/"
