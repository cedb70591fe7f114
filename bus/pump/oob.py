"""The out-of-band control channel: signed requests over a private Unix socket.

Privileged commands (`add-listener`, `remove-listener`, `hot-reload`) never
travel through the pump's routing: they arrive on a Unix socket of mode 0600
beside the bus file, one request per connection, each signed with Ed25519.
Up to MAX_CONNECTIONS connections are read at once, each with a deadline
of CONNECTION_TIMEOUT_S for its whole request, so idle or slow clients do
not hold up a valid request; requests are then handled one at a time.

A request on the wire is one JSON object

    {"payload": "<canonical JSON text>", "signature": "<base64 Ed25519 signature>"}

where the payload is `orjson.dumps({"args", "command", "nonce", "ts_ms"},
OPT_SORT_KEYS)` and the signature is over exactly those UTF-8 bytes. The
server refuses an unsigned request, a signature no authorized key made, a
timestamp outside the window (stale or in the future) and a nonce seen before
(nonces are kept in the bus, so a replay is refused after a restart too).
Every accepted request is recorded as an `oob_command` message in the same
transaction as its nonce, then handed to the dispatcher the pump supplies;
its outcome is an `oob_result` message; refusals are `oob_refused` messages.

    server = OobServer(bus, socket_path, [load_public_key(pub)], dispatcher)
    threading.Thread(target=server.serve_forever, args=(stop,)).start()
    send_request(socket_path, load_private_key(key), "remove-listener", {"name": "calc"})
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import select
import socket
import stat
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Mapping

import apsw
import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from bus.api import Bus
from bus.storage.db import write_transaction
from bus.storage.errors import BusError
from bus.log.messages import append
from bus.log.messages import now_ms
from bus.log.messages import prepare_row
from bus.log.payloads import PayloadPolicy
from bus.pump.errors import BadSignature
from bus.pump.errors import MalformedRequest
from bus.pump.errors import OobKeyError
from bus.pump.errors import OobRefused
from bus.pump.errors import OobSocketError
from bus.pump.errors import OrganismInvalid
from bus.pump.errors import ReplayedRequest
from bus.pump.errors import StaleRequest
from bus.pump.errors import UnsignedRequest
from bus.pump.organism import DEFAULT_SOCKET
from bus.pump.organism import DEFAULT_WINDOW_S
from bus.pump.organism import LIST_CAPABILITIES
from bus.pump.organism import SCHEMA_REQUEST
from bus.pump.organism import parse_listener

COMMANDS = ("add-listener", "remove-listener", "hot-reload", LIST_CAPABILITIES, SCHEMA_REQUEST)
PAYLOAD_KEYS = ("args", "command", "nonce", "ts_ms")
AUDIT_AGENT = "oob"  # from_agent of the audit messages
MAX_REQUEST_BYTES = 64 * 1024
SUN_PATH_MAX = 107  # bytes: sockaddr_un.sun_path is 108 on Linux, NUL included
CONNECTION_TIMEOUT_S = 5.0  # a client has this long, in all, to send its whole request
MAX_CONNECTIONS = 8  # served at once; more wait in the listen backlog
# Nonces are kept this long; a request older than the window is stale anyway,
# and the window is at most an hour (organism.WINDOW_MAX_S).
NONCE_RETENTION_MS = 2 * 3600 * 1000
NONCE_MIN, NONCE_MAX = 16, 128
PRIVATE_KEY_NAME = "oob_ed25519"
PUBLIC_KEY_NAME = "oob_ed25519.pub"

_REMEMBER_NONCE_SQL = (
    "INSERT INTO oob_nonces (nonce, key_id, ts_ms, seen_at_ms) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (nonce) DO NOTHING RETURNING nonce"
)
_FORGET_NONCES_SQL = "DELETE FROM oob_nonces WHERE ts_ms < ?"
_SO_PEERCRED_FORMAT = "3i"  # struct ucred: pid, uid, gid

Dispatcher = Callable[["OobRequest"], Any]


@dataclass(frozen=True)
class OobRequest:
    """A verified request: what to do, and who signed it (`key_id`) when."""

    command: str
    args: dict[str, Any]
    nonce: str
    ts_ms: int
    key_id: str

    def to_json_dict(self) -> dict[str, Any]:
        return {"command": self.command, "args": self.args, "nonce": self.nonce,
                "ts_ms": self.ts_ms, "key": self.key_id}


# --- keys ---------------------------------------------------------------------------


@dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_path: Path
    key_id: str


def generate_keys(out_dir: str | os.PathLike[str]) -> KeyPair:
    """Write a new Ed25519 key pair: `oob_ed25519` (mode 0600) and `oob_ed25519.pub`.

    Never overwrites: raises OobKeyError if either file exists.
    """
    out = Path(out_dir)
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    private_path, public_path = out / PRIVATE_KEY_NAME, out / PUBLIC_KEY_NAME
    for path in (private_path, public_path):
        if path.exists():
            raise OobKeyError(str(path), "exists already; keygen never overwrites a key: "
                                         "remove it or choose another --out directory")
    key = Ed25519PrivateKey.generate()
    _write_new(private_path, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()), 0o600)
    public = key.public_key()
    _write_new(public_path, public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    return KeyPair(private_path, public_path, key_id(public))


def _write_new(path: Path, data: bytes, mode: int) -> None:
    # O_EXCL: a file created in the meantime is not overwritten; the mode is
    # set at creation, so the private key is never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file readable by its owner only."""
    data, mode = _read_key_file(path)
    if mode & 0o077:
        raise OobKeyError(str(path), f"is readable by group or others (mode {mode:04o}); "
                                     "run `chmod 600` on it")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise OobKeyError(str(path), f"is not an unencrypted PEM private key ({exc}); "
                                     "use the file `bus pump oob keygen` wrote") from None
    return _expect(key, Ed25519PrivateKey, path, "private")


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """An Ed25519 public key from a PEM file (`oob_ed25519.pub`)."""
    data, _ = _read_key_file(path)
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise OobKeyError(str(path), f"is not a PEM public key ({exc}); list the .pub file "
                                     "`bus pump oob keygen` wrote") from None
    return _expect(key, Ed25519PublicKey, path, "public")


def _read_key_file(path: str | os.PathLike[str]) -> tuple[bytes, int]:
    try:
        with open(path, "rb") as f:
            return f.read(), stat.S_IMODE(os.fstat(f.fileno()).st_mode)
    except OSError as exc:
        raise OobKeyError(str(path), f"cannot be read ({exc.strerror}); check the path, "
                                     "or create a key pair with `bus pump oob keygen`") from None


def _expect(key: object, kind: type, path: str | os.PathLike[str], which: str) -> Any:
    if not isinstance(key, kind):
        raise OobKeyError(str(path), f"holds a {type(key).__name__}, not an Ed25519 {which} "
                                     "key; create one with `bus pump oob keygen`")
    return key


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short fingerprint: the first 16 hex digits of sha256 over the raw public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


# --- signing and verifying ------------------------------------------------------------


def canonical_payload(command: str, args: Mapping[str, Any], nonce: str, ts_ms: int) -> bytes:
    """The exact bytes a request's signature covers."""
    return orjson.dumps({"command": command, "args": dict(args), "nonce": nonce, "ts_ms": ts_ms},
                        option=orjson.OPT_SORT_KEYS)


def sign_request(private_key: Ed25519PrivateKey, command: str, args: Mapping[str, Any],
                 *, ts_ms: int | None = None, nonce: str | None = None) -> bytes:
    """A signed request, ready to send; a fresh nonce and the clock unless given."""
    payload = canonical_payload(command, args, nonce or secrets.token_hex(16),
                                now_ms() if ts_ms is None else ts_ms)
    signature = base64.b64encode(private_key.sign(payload)).decode()
    return orjson.dumps({"payload": payload.decode(), "signature": signature})


def verify_request(wire: bytes, public_keys: Iterable[Ed25519PublicKey], *, now: int,
                   window_ms: int) -> OobRequest:
    """Check a request's signature, shape and timestamp (not its nonce: see `OobServer`).

    Raises UnsignedRequest, BadSignature, MalformedRequest or StaleRequest.
    """
    envelope = _loads(wire, "request")
    if not isinstance(envelope, dict):
        raise MalformedRequest("request", "must be a JSON object with payload and signature")
    signature = envelope.get("signature")
    if signature in (None, ""):
        raise UnsignedRequest("signature: the request is not signed; sign it with an "
                              "authorized key (bus pump oob send --key FILE)")
    payload = envelope.get("payload")
    if not isinstance(payload, str):
        raise MalformedRequest("payload", "must be the signed canonical JSON text")
    signer = _signer(payload.encode(), signature, public_keys)
    fields = _loads(payload.encode(), "payload")
    request = _request(fields, signer)
    if abs(now - request.ts_ms) > window_ms:
        raise StaleRequest(request.ts_ms, now, window_ms)
    return request


def _signer(payload: bytes, signature: object, public_keys: Iterable[Ed25519PublicKey]) -> str:
    """The id of the authorized key that made `signature` over `payload`."""
    try:
        raw = base64.b64decode(signature, validate=True) if isinstance(signature, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != 64:
        raise BadSignature("signature: is not a base64 Ed25519 signature (64 bytes); "
                           "sign the request with bus pump oob send")
    for public_key in public_keys:
        try:
            public_key.verify(raw, payload)
            return key_id(public_key)
        except InvalidSignature:
            continue
    raise BadSignature("signature: no authorized key made it (wrong key, or the payload "
                       "changed after signing); sign with a private key whose public key "
                       "is listed under oob.authorized_keys")


def _request(fields: object, signer: str) -> OobRequest:
    if not isinstance(fields, dict) or sorted(fields) != list(PAYLOAD_KEYS):
        raise MalformedRequest("payload", f"must be an object with exactly the keys "
                                          f"{', '.join(PAYLOAD_KEYS)}")
    command, args, nonce, ts_ms = (fields[k] for k in ("command", "args", "nonce", "ts_ms"))
    if command not in COMMANDS:
        raise MalformedRequest("command", f"{command!r} is not one of: {', '.join(COMMANDS)}")
    if not isinstance(args, dict):
        raise MalformedRequest("args", "must be a JSON object")
    if not isinstance(nonce, str) or not NONCE_MIN <= len(nonce) <= NONCE_MAX:
        raise MalformedRequest("nonce", f"must be a string of {NONCE_MIN}-{NONCE_MAX} "
                                        "characters, e.g. 32 random hex digits")
    if isinstance(ts_ms, bool) or not isinstance(ts_ms, int):
        raise MalformedRequest("ts_ms", "must be the signing time in epoch milliseconds")
    _check_args(command, args)
    return OobRequest(command, args, nonce, ts_ms, signer)


def _check_args(command: str, args: dict[str, Any]) -> None:
    if command == "add-listener":
        try:
            parse_listener(args, "request", "args")
        except OrganismInvalid as exc:
            raise MalformedRequest(exc.field, exc.reason) from None
    elif command == "remove-listener":
        if sorted(args) != ["name"] or not isinstance(args["name"], str):
            raise MalformedRequest("args", 'must be {"name": LISTENER}')
    elif command == SCHEMA_REQUEST:
        if sorted(args) != ["listener"] or not isinstance(args["listener"], str):
            raise MalformedRequest("args", 'must be {"listener": LISTENER}')
    elif args:
        raise MalformedRequest("args", f"{command} takes no arguments: send {{}}")


def _loads(data: bytes, field: str) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise MalformedRequest(field, f"is not JSON ({exc})") from None


# --- the audit --------------------------------------------------------------------------


def record_request(conn: apsw.Connection, request: OobRequest, now: int,
                   payloads: PayloadPolicy | None = None) -> None:
    """Remember the nonce and publish `oob_command`, in one transaction (`payloads`: the
    bus's PayloadPolicy, which places the message's payload as a publish's).

    Raises ReplayedRequest (and writes nothing) for a nonce seen before.
    """
    with write_transaction(conn):
        conn.execute(_FORGET_NONCES_SQL, (now - NONCE_RETENTION_MS,))
        fresh = conn.execute(_REMEMBER_NONCE_SQL, (request.nonce, request.key_id,
                                                   request.ts_ms, now)).get
        if fresh is None:
            raise ReplayedRequest(request.nonce)
        _audit(conn, payloads, "oob_command", request.to_json_dict(), now, request.nonce)


def _audit(conn: apsw.Connection, payloads: PayloadPolicy | None, type_: str,
           payload: dict[str, Any], now: int, correlation_id: str | None = None) -> None:
    row = prepare_row(AUDIT_AGENT, type_, payload, correlation_id=correlation_id)
    with write_transaction(conn):
        append(conn, [row], payloads, now)


# --- the server ---------------------------------------------------------------------------


class OobServer:
    """Serves signed requests on a Unix socket; `dispatcher(request)` does the work.

    The dispatcher's return value (JSON-serialisable) is the client's
    `result`; a BusError it raises is reported to the client as a failure.
    """

    def __init__(self, bus: Bus, socket_path: str | os.PathLike[str],
                 public_keys: Iterable[Ed25519PublicKey], dispatcher: Dispatcher,
                 window_s: float = DEFAULT_WINDOW_S) -> None:
        self.bus = bus
        self.path = Path(socket_path)
        self.public_keys = tuple(public_keys)
        self.dispatcher = dispatcher
        self.window_ms = int(window_s * 1000)
        self._sock = bind_socket(self.path)
        self._inode = self.path.stat().st_ino
        self._lock = threading.Lock()
        # A fixed pool: its threads (and their bus connections) are reused.
        self._pool = ThreadPoolExecutor(MAX_CONNECTIONS, thread_name_prefix="oob-connection")
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._handling = threading.Lock()  # verify, record, dispatch: one request at a time

    def serve_forever(self, stop: threading.Event, poll_s: float = 0.1) -> None:
        """Handle connections until `stop` is set (checked every `poll_s` seconds)."""
        while not stop.is_set():
            self.serve_once(poll_s)

    def serve_once(self, timeout: float) -> bool:
        """Accept one connection if one arrives within `timeout` seconds and a slot is free;
        it is served on the pool, beside the others."""
        ready, _, _ = select.select([self._sock], [], [], timeout)
        if not ready or not self._slots.acquire(timeout=timeout):
            return False
        try:
            conn, _ = self._sock.accept()
        except OSError:
            self._slots.release()
            return False
        self._pool.submit(self._serve, conn)
        return True

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                response = self._answer(conn, time.monotonic() + CONNECTION_TIMEOUT_S)
                conn.sendall(orjson.dumps(response) + b"\n")
        except OSError:
            pass  # the client went away or missed its deadline: nothing to answer
        finally:
            self._slots.release()

    def _answer(self, conn: socket.socket, deadline: float) -> dict[str, Any]:
        try:
            if not _same_user(conn):
                raise OobRefused("peer: connections are accepted from the socket owner's "
                                 "user only")
            wire = _read_request(conn, deadline)
        except OobRefused as exc:
            with self._handling:
                return self._refuse(exc, now_ms())
        try:
            with self._handling:
                return self.handle(wire)
        except BusError as exc:  # e.g. BusBusy: the client may retry with a new request
            return {"ok": False, "error": "failed", "message": str(exc)}

    def handle(self, wire: bytes, now: int | None = None) -> dict[str, Any]:
        """Verify, record and dispatch one request; the response for the client."""
        at = now_ms() if now is None else now
        try:
            request = verify_request(wire, self.public_keys, now=at, window_ms=self.window_ms)
            with self.bus.write() as conn:
                record_request(conn, request, at, self.bus.payloads)
        except OobRefused as exc:
            return self._refuse(exc, at)
        response = self._dispatch(request)
        with self.bus.write() as conn:
            _audit(conn, self.bus.payloads, "oob_result", {"command": request.command, **response},
                   now_ms(), request.nonce)
        return response

    def _refuse(self, exc: OobRefused, at: int) -> dict[str, Any]:
        with self.bus.write() as conn:
            _audit(conn, self.bus.payloads, "oob_refused",
                   {"error": exc.kind, "message": str(exc)}, at)
        return {"ok": False, "error": exc.kind, "message": str(exc)}

    def _dispatch(self, request: OobRequest) -> dict[str, Any]:
        try:
            result = self.dispatcher(request)
            orjson.dumps(result)
        except BusError as exc:
            return {"ok": False, "nonce": request.nonce, "error": "failed", "message": str(exc)}
        except Exception as exc:  # the pump's bug must not take the control channel down
            return {"ok": False, "nonce": request.nonce, "error": "failed",
                    "message": f"{type(exc).__name__}: {exc}"}
        return {"ok": True, "nonce": request.nonce, "result": result}

    def close(self) -> None:
        """Stop listening, let the connections being served finish (each within its
        deadline), and remove the socket file (if it is still ours)."""
        with self._lock:
            self._sock.close()
            self._pool.shutdown(wait=True)
            try:
                if self.path.stat().st_ino == self._inode:
                    self.path.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> OobServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _read_request(conn: socket.socket, deadline: float) -> bytes:
    """Everything the client sends until it shuts down writing, by `deadline` (monotonic).

    A client still sending at the deadline gets TimeoutError (an OSError): one
    byte every few seconds does not hold a connection open for good.
    """
    chunks, size = [], 0
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request did not arrive in time")
        conn.settimeout(remaining)
        chunk = conn.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_REQUEST_BYTES:
            raise MalformedRequest("request", f"is larger than {MAX_REQUEST_BYTES} bytes")
    return b"".join(chunks)


def _same_user(conn: socket.socket) -> bool:
    """SO_PEERCRED: the client runs as our user (or root); the socket's mode says the same."""
    if not hasattr(socket, "SO_PEERCRED"):  # not Linux: the 0600 mode alone decides
        return True
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                            struct.calcsize(_SO_PEERCRED_FORMAT))
    _pid, uid, _gid = struct.unpack(_SO_PEERCRED_FORMAT, creds)
    return uid in (os.getuid(), 0)


# --- socket files ---------------------------------------------------------------------------


def socket_path_for(bus_path: str | os.PathLike[str], name: str = DEFAULT_SOCKET) -> Path:
    """Where the OOB socket lives: `name` (oob.socket) relative to the bus file's directory."""
    return Path(bus_path).absolute().parent / name


def check_socket_path(path: Path) -> None:
    """Refuse a path too long for a Unix socket address, naming the fix."""
    size = len(os.fsencode(path))
    if size > SUN_PATH_MAX:
        raise OobSocketError(str(path), (
            f"is {size} bytes long; a Unix socket path holds at most {SUN_PATH_MAX} bytes: "
            "move the bus to a shorter directory or set oob.socket to a shorter path"))


def bind_socket(path: Path) -> socket.socket:
    """A listening socket at `path`, mode 0600 from the moment it has that name.

    It is bound under a temporary name, restricted, then renamed into place,
    so no other user can connect in between. A stale socket file (nobody
    listening) is replaced; a live one or a non-socket file is refused.
    """
    temp = path.with_name(f".{secrets.token_hex(3)}")
    for candidate in (path, temp):
        check_socket_path(candidate)
    _clear_stale(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(os.fspath(temp))
        os.chmod(temp, 0o600)
        sock.listen(16)
        os.replace(temp, path)
    except OSError as exc:
        sock.close()
        temp.unlink(missing_ok=True)
        raise OobSocketError(str(path), f"cannot listen here ({exc.strerror}); check the "
                                        "directory exists and is writable") from None
    return sock


def _clear_stale(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OobSocketError(str(path), "exists and is not a socket; remove it or set "
                                        "oob.socket to another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(os.fspath(path))
    except ConnectionRefusedError:
        path.unlink()  # left behind by a server that died
        return
    finally:
        probe.close()
    raise OobSocketError(str(path), "another server is listening on it; stop it first")


# --- the client -----------------------------------------------------------------------------


def send_request(socket_path: str | os.PathLike[str], private_key: Ed25519PrivateKey,
                 command: str, args: Mapping[str, Any] | None = None, *,
                 timeout: float = 30.0) -> dict[str, Any]:
    """Sign and send one request; the server's response (`ok`, `result` or `error`)."""
    return send_wire(socket_path, sign_request(private_key, command, args or {}), timeout)


def send_wire(socket_path: str | os.PathLike[str], wire: bytes,
              timeout: float = 30.0) -> dict[str, Any]:
    """Send request bytes as they are (tests send forged ones); the parsed response."""
    path = Path(socket_path)
    check_socket_path(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(os.fspath(path))
            sock.sendall(wire)
            sock.shutdown(socket.SHUT_WR)
            reply = b"".join(iter(lambda: sock.recv(65536), b""))
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise OobSocketError(str(path), f"nobody is listening ({exc.strerror}); start "
                                            "the pump, or pass the socket it uses") from None
        except OSError as exc:
            raise OobSocketError(str(path), f"the request failed ({exc})") from None
    try:
        return orjson.loads(reply)
    except orjson.JSONDecodeError:
        raise OobSocketError(str(path), "the server closed the connection without an "
                                        "answer; see the pump's log") from None
