"""Who may talk to `bus serve`: Host and Origin checks, and bearer tokens (bus/coordination/tokens.py).

Every request passes here before any route:
- `Host` must name this server (DNS-rebinding protection, as the MCP
  specification asks): on loopback only `localhost`, `127.0.0.1` and `[::1]`
  with the port; elsewhere the address listened on, or the names given.
- `Origin`, when a browser sends one, must be this server's own origin.
- The protected-resource metadata (RFC 9728, bus/mcpserver/http.py) is public:
  a 401 points to it, so that a client learns that tokens come from
  `bus token` rather than trying OAuth.
- A token is required for `/mcp` always (it says which agent a request acts
  as), and for every path when the server listens beyond this machine.
  Tokens come in `Authorization: Bearer ...`; a browser opens the page once
  with `?token=...`, which sets an HttpOnly, SameSite=Strict cookie and
  redirects to the same page without the token in its address. `/mcp` takes
  the header only, so a page elsewhere cannot ride the cookie.

The checked token is put in the ASGI scope under `TOKEN_SCOPE_KEY`.
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qs
from urllib.parse import urlencode
from urllib.parse import urlsplit

import anyio.to_thread
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.responses import RedirectResponse
from starlette.types import ASGIApp
from starlette.types import Receive
from starlette.types import Scope
from starlette.types import Send

from bus.log.messages import now_ms
from bus.coordination.tokens import TokenChecker

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
WILDCARD = frozenset({"0.0.0.0", "::"})
COOKIE = "agentbus_token"
TOKEN_SCOPE_KEY = "agentbus.token"
MCP_PATH = "/mcp"
# RFC 9728: where a client learns how /mcp is protected; public, as the RFC has it.
WELL_KNOWN_RESOURCE = "/.well-known/oauth-protected-resource"
RESOURCE_METADATA_PATH = WELL_KNOWN_RESOURCE + MCP_PATH
TOKEN_HELP = ("a bearer token from `bus token create --agent ID`, in Authorization: Bearer"
              " <token>; there is no authorization server to ask")


@dataclass
class GuardSettings:
    """What the guard checks; `port` is set once the socket is bound."""

    host: str
    port: int = 0
    tokens_everywhere: bool = False  # the page too, not only /mcp
    allowed_hosts: tuple[str, ...] = ()  # names a non-loopback server answers to
    tls: bool = False
    checker: TokenChecker | None = field(default=None, repr=False)

    def host_allowed(self, host_header: str | None) -> bool:
        if not host_header:
            return False
        name, port = _split_host(host_header)
        default_port = 443 if self.tls else 80
        implied = port is None and self.port == default_port  # "Host: name" means port 80/443
        if self.port and port != str(self.port) and not implied:
            return False
        if self.host in LOOPBACK:
            return name in LOOPBACK
        names = {self.host.strip("[]"), *self.allowed_hosts}
        # Listening on every address: any name reaches it, and a token is required anyway.
        return (self.host in WILDCARD and not self.allowed_hosts) or name in names


def _split_host(host_header: str) -> tuple[str, str | None]:
    """("::1", "8765") from "[::1]:8765"; ("localhost", None) from "localhost"."""
    if host_header.startswith("["):
        name, _, rest = host_header[1:].partition("]")
        return name, rest[1:] if rest.startswith(":") else None
    name, colon, port = host_header.rpartition(":")
    return (name, port) if colon else (host_header, None)


class Guard:
    """ASGI middleware: refuses what `GuardSettings` does not allow, before any route."""

    def __init__(self, app: ASGIApp, settings: GuardSettings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        refusal = self._refusal(headers)
        if refusal is not None:
            return await PlainTextResponse(refusal[1], status_code=refusal[0])(scope, receive, send)
        path = scope.get("path", "")
        # The protected-resource metadata is public (RFC 9728): those two paths exactly.
        needs_token = (path == MCP_PATH or self.settings.tokens_everywhere) \
            and path not in (WELL_KNOWN_RESOURCE, RESOURCE_METADATA_PATH)
        if not needs_token:
            return await self.app(scope, receive, send)
        from_query = path != MCP_PATH and _query_token(scope)
        presented = from_query or _bearer(headers) or (path != MCP_PATH and _cookie(headers))
        token = await self._check(presented)
        if token is None:
            return await _unauthorized(scope)(scope, receive, send)
        if from_query:  # keep the token out of the address bar and the history
            return await self._set_cookie(scope, from_query)(scope, receive, send)
        scope[TOKEN_SCOPE_KEY] = token
        await self.app(scope, receive, send)

    def _refusal(self, headers: Headers) -> tuple[int, str] | None:
        host = headers.get("host")
        if not self.settings.host_allowed(host):
            return 421, f"Host {host!r} is not this server's; use the address bus serve printed"
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != host:
            return 403, f"Origin {origin!r} may not call this server"
        return None

    async def _check(self, presented: str | None) -> Any:
        checker = self.settings.checker
        if not presented or checker is None:
            return None
        now = now_ms()
        # One indexed read, on the loop: a WAL reader never waits, and a hop to a
        # thread per request cost more than the read. The write of the token's last
        # use (once a minute) may wait for the write lock: in a thread.
        token = checker.find(presented, now)
        if token is not None and checker.note_use_due(token.id, now):
            await anyio.to_thread.run_sync(checker.note_use, token.id, now)
        return token

    def _set_cookie(self, scope: Scope, token: str) -> RedirectResponse:
        query = {k: v for k, v in parse_qs(scope.get("query_string", b"").decode()).items()
                 if k != "token"}
        target = scope.get("path", "/") + (f"?{urlencode(query, doseq=True)}" if query else "")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(COOKIE, token, httponly=True, samesite="strict",
                            secure=self.settings.tls, path="/")
        return response


def _unauthorized(scope: Scope) -> PlainTextResponse:
    """401, with the challenge pointing to the protected-resource metadata (RFC 9728)."""
    metadata = f"{request_origin(scope)}{RESOURCE_METADATA_PATH}"
    return PlainTextResponse(
        "a valid token is required: Authorization: Bearer <token> (bus token create --agent"
        " ID); the token is missing, unknown, revoked or expired", status_code=401,
        headers={"WWW-Authenticate": f'Bearer realm="agentbus", error="invalid_token",'
                                     f' error_description="{TOKEN_HELP}",'
                                     f' resource_metadata="{metadata}"'})


def request_origin(scope: Scope) -> str:
    """This server's origin as the client names it: its scheme and Host (checked already)."""
    return f"{scope.get('scheme', 'http')}://{Headers(scope=scope).get('host')}"


def _bearer(headers: Headers) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None


def _cookie(headers: Headers) -> str | None:
    jar: SimpleCookie = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no token, not a server error
        return None
    morsel = jar.get(COOKIE)
    return morsel.value if morsel is not None else None


def _query_token(scope: Scope) -> str | None:
    values = parse_qs(scope.get("query_string", b"").decode()).get("token")
    return values[0] if values else None
