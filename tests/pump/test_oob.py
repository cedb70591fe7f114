"""The out-of-band channel (bus/pump/oob.py): real keys, real signatures, a real socket.

The server runs in a thread of the test process and serves a Unix socket in
tmp_path; clients are `send_request` / `send_wire` on their own connections.
"""

from __future__ import annotations

import base64
import os
import socket
import stat
import threading
from pathlib import Path

import orjson
import pytest

from bus import Bus
from bus.storage.errors import BusError
from bus.storage.errors import OobKeyError
from bus.storage.errors import OobSocketError
from bus.storage.errors import StaleRequest
from bus.log.messages import now_ms
from bus.pump import oob
from bus.pump.oob import OobRequest
from bus.pump.oob import OobServer

T0 = 1_700_000_000_000
WINDOW_MS = 60_000


class Recorder:
    """A dispatcher that remembers its requests and answers, or fails on demand."""

    def __init__(self) -> None:
        self.requests: list[OobRequest] = []
        self.fail_with: Exception | None = None

    def __call__(self, request: OobRequest) -> object:
        self.requests.append(request)
        if self.fail_with is not None:
            raise self.fail_with
        return {"done": request.command}


@pytest.fixture
def keys(tmp_path: Path) -> oob.KeyPair:
    return oob.generate_keys(tmp_path / "keys")


@pytest.fixture
def other_keys(tmp_path: Path) -> oob.KeyPair:
    return oob.generate_keys(tmp_path / "other")


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def socket_path(db_path: Path) -> Path:
    return oob.socket_path_for(db_path)


@pytest.fixture
def server(bus: Bus, keys, recorder, socket_path):
    """An OobServer trusting `keys`, serving in a thread until the test ends."""
    started = OobServer(bus, socket_path, [oob.load_public_key(keys.public_path)], recorder)
    stop = threading.Event()
    thread = threading.Thread(target=started.serve_forever, args=(stop, 0.02))
    thread.start()
    yield started
    stop.set()
    thread.join()
    started.close()


def private(pair: oob.KeyPair):
    return oob.load_private_key(pair.private_path)


def audit(bus: Bus, type_: str) -> list:
    return [m for m in bus.list_messages(0, 1000) if m.type == type_]


def reframe(wire: bytes, **changes: object) -> bytes:
    """The request with envelope fields replaced (None removes one)."""
    envelope = orjson.loads(wire)
    for key, value in changes.items():
        if value is None:
            envelope.pop(key)
        else:
            envelope[key] = value
    return orjson.dumps(envelope)


# --- keys ------------------------------------------------------------------------------


def test_generate_keys_writes_a_private_file_only_the_owner_reads(keys):
    assert stat.S_IMODE(keys.private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(keys.public_path.stat().st_mode) & 0o077 in (0o044, 0o004, 0o040, 0)
    assert keys.private_path.name == "oob_ed25519" and keys.public_path.name == "oob_ed25519.pub"
    public = oob.load_public_key(keys.public_path)
    signature = private(keys).sign(b"hello")
    public.verify(signature, b"hello")  # raises if the pair does not match
    assert keys.key_id == oob.key_id(public) and len(keys.key_id) == 16


def test_generate_keys_never_overwrites(keys):
    before = keys.private_path.read_bytes()
    with pytest.raises(OobKeyError) as info:
        oob.generate_keys(keys.private_path.parent)
    assert info.value.path == str(keys.private_path)
    assert "never overwrites" in str(info.value)
    assert keys.private_path.read_bytes() == before


def test_load_private_key_refuses_a_file_others_can_read(keys):
    os.chmod(keys.private_path, 0o644)
    with pytest.raises(OobKeyError) as info:
        oob.load_private_key(keys.private_path)
    assert "mode 0644" in str(info.value) and "chmod 600" in str(info.value)


def test_key_loaders_refuse_the_wrong_files(keys, tmp_path):
    with pytest.raises(OobKeyError) as info:
        oob.load_private_key(tmp_path / "missing")
    assert "cannot be read" in str(info.value)
    public_as_private = tmp_path / "pub-copy"
    public_as_private.write_bytes(keys.public_path.read_bytes())
    os.chmod(public_as_private, 0o600)
    with pytest.raises(OobKeyError) as info:
        oob.load_private_key(public_as_private)
    assert "is not an unencrypted PEM private key" in str(info.value)
    with pytest.raises(OobKeyError) as info:
        oob.load_public_key(keys.private_path)
    assert "is not a PEM public key" in str(info.value)


# --- the socket file --------------------------------------------------------------------


def test_server_socket_is_beside_the_bus_with_mode_0600(server, db_path, socket_path):
    assert socket_path == db_path.parent / "oob.sock"
    mode = socket_path.stat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    assert [p.name for p in db_path.parent.iterdir() if p.name.startswith(".")] == []


def test_server_close_removes_the_socket(bus, keys, socket_path, recorder):
    server = OobServer(bus, socket_path, [], recorder)
    server.close()
    assert not socket_path.exists()


def test_socket_path_longer_than_107_bytes_is_refused(bus, tmp_path, recorder, keys):
    deep = tmp_path / ("d" * (120 - len(str(tmp_path))))
    deep.mkdir()
    path = deep / "oob.sock"
    with pytest.raises(OobSocketError) as info:
        OobServer(bus, path, [], recorder)
    assert f"is {len(str(path))} bytes long" in str(info.value)
    assert "at most 107 bytes" in str(info.value) and "shorter" in str(info.value)
    with pytest.raises(OobSocketError):
        oob.send_request(path, private(keys), "hot-reload")
    assert list(deep.iterdir()) == []


def test_stale_socket_file_is_replaced(bus, socket_path, recorder):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(socket_path))
    dead.close()  # the file stays, nobody listens
    OobServer(bus, socket_path, [], recorder).close()


def test_live_socket_and_other_files_are_refused(bus, server, socket_path, recorder, tmp_path):
    with pytest.raises(OobSocketError) as info:
        OobServer(bus, socket_path, [], recorder)
    assert "another server is listening" in str(info.value)
    plain = tmp_path / "plain.sock"
    plain.write_text("data")
    with pytest.raises(OobSocketError) as info:
        OobServer(bus, plain, [], recorder)
    assert "is not a socket" in str(info.value)
    assert plain.read_text() == "data"


def test_client_without_a_server_gets_a_clear_error(keys, socket_path):
    with pytest.raises(OobSocketError) as info:
        oob.send_request(socket_path, private(keys), "hot-reload")
    assert "nobody is listening" in str(info.value)


# --- accepted requests --------------------------------------------------------------------


def test_signed_request_is_dispatched_and_audited(bus, server, keys, recorder, socket_path):
    args = {"name": "calc.add"}
    response = oob.send_request(socket_path, private(keys), "remove-listener", args)
    assert response["ok"] is True and response["result"] == {"done": "remove-listener"}
    [request] = recorder.requests
    assert (request.command, request.args, request.key_id) == (
        "remove-listener", args, keys.key_id)
    assert response["nonce"] == request.nonce
    [command] = audit(bus, "oob_command")
    assert (command.from_agent, command.correlation_id) == ("oob", request.nonce)
    assert command.payload == request.to_json_dict()
    [result] = audit(bus, "oob_result")
    assert result.payload == {"command": "remove-listener", **response}
    assert result.seq > command.seq
    assert audit(bus, "oob_refused") == []


def test_every_command_is_accepted(bus, server, keys, recorder, socket_path):
    spec = {"name": "calc.add", "root_tag": "add", "payload": "m:Add", "handler": "m:add"}
    for command, args in [("add-listener", spec), ("remove-listener", {"name": "x"}),
                          ("hot-reload", {}), ("list-capabilities", {}),
                          ("schema-request", {"listener": "calc.add"})]:
        assert oob.send_request(socket_path, private(keys), command, args)["ok"]
    assert [r.command for r in recorder.requests] == list(oob.COMMANDS)


def test_dispatcher_failures_are_reported_and_the_server_goes_on(server, bus, keys, recorder,
                                                                 socket_path):
    recorder.fail_with = BusError("name: no listener is named 'x'")
    response = oob.send_request(socket_path, private(keys), "remove-listener", {"name": "x"})
    assert (response["ok"], response["error"], response["message"]) == (
        False, "failed", "name: no listener is named 'x'")
    recorder.fail_with = ValueError("boom")
    response = oob.send_request(socket_path, private(keys), "hot-reload")
    assert response["message"] == "ValueError: boom"
    recorder.fail_with = None
    assert oob.send_request(socket_path, private(keys), "hot-reload")["ok"]
    assert [m.payload["ok"] for m in audit(bus, "oob_result")] == [False, False, True]


# --- refused requests -----------------------------------------------------------------------


def assert_refused(bus, recorder, response, kind: str, fragment: str) -> None:
    assert response["ok"] is False
    assert response["error"] == kind
    assert fragment in response["message"]
    assert recorder.requests == []
    assert audit(bus, "oob_command") == []
    [refused] = audit(bus, "oob_refused")
    assert refused.payload == {"error": kind, "message": response["message"]}


def test_unsigned_request_is_refused(bus, server, keys, recorder, socket_path):
    wire = reframe(oob.sign_request(private(keys), "hot-reload", {}), signature=None)
    response = oob.send_wire(socket_path, wire)
    assert_refused(bus, recorder, response, "unsigned", "signature: the request is not signed")


def test_changed_payload_fails_the_signature(bus, server, keys, recorder, socket_path):
    wire = oob.sign_request(private(keys), "remove-listener", {"name": "calc"})
    payload = orjson.loads(wire)["payload"].replace('"calc"', '"root"')
    response = oob.send_wire(socket_path, reframe(wire, payload=payload))
    assert_refused(bus, recorder, response, "bad_signature", "no authorized key made it")


def test_request_signed_with_another_key_is_refused(bus, server, other_keys, recorder,
                                                    socket_path):
    response = oob.send_request(socket_path, private(other_keys), "hot-reload")
    assert_refused(bus, recorder, response, "bad_signature", "oob.authorized_keys")


@pytest.mark.parametrize("signature", ["not base64!", base64.b64encode(b"short").decode(), 7])
def test_garbage_signature_is_refused(bus, server, keys, recorder, socket_path, signature):
    wire = reframe(oob.sign_request(private(keys), "hot-reload", {}), signature=signature)
    response = oob.send_wire(socket_path, wire)
    assert_refused(bus, recorder, response, "bad_signature", "64 bytes")


def test_replayed_request_is_refused(bus, server, keys, recorder, socket_path):
    wire = oob.sign_request(private(keys), "hot-reload", {})
    assert oob.send_wire(socket_path, wire)["ok"]
    response = oob.send_wire(socket_path, wire)
    assert response["error"] == "replayed"
    assert "was used by an earlier request" in response["message"]
    assert len(recorder.requests) == 1
    assert len(audit(bus, "oob_command")) == 1
    assert [m.payload["error"] for m in audit(bus, "oob_refused")] == ["replayed"]


def test_replay_is_refused_after_a_restart(db_path, keys, recorder, socket_path):
    wire = oob.sign_request(private(keys), "hot-reload", {})
    public = [oob.load_public_key(keys.public_path)]
    for expected in (True, False):
        with Bus.open(db_path) as bus, OobServer(bus, socket_path, public, recorder) as server:
            assert server.handle(wire)["ok"] is expected
    assert len(recorder.requests) == 1


@pytest.mark.parametrize("age_ms, kind", [
    (61_000, "s old"), (-61_000, "s in the future"),
])
def test_stale_and_future_requests_are_refused(bus, server, keys, recorder, socket_path,
                                               age_ms, kind):
    wire = oob.sign_request(private(keys), "hot-reload", {}, ts_ms=now_ms() - age_ms)
    response = oob.send_wire(socket_path, wire)
    assert_refused(bus, recorder, response, "stale", kind)
    assert "within 60 s of the server's clock" in response["message"]


def test_request_inside_the_window_is_accepted(server, keys, recorder, socket_path):
    wire = oob.sign_request(private(keys), "hot-reload", {}, ts_ms=now_ms() - 30_000)
    assert oob.send_wire(socket_path, wire)["ok"]


def test_window_boundary_is_inclusive(keys):
    public = [oob.load_public_key(keys.public_path)]
    for ts_ms in (T0 - WINDOW_MS, T0 + WINDOW_MS):
        wire = oob.sign_request(private(keys), "hot-reload", {}, ts_ms=ts_ms)
        assert oob.verify_request(wire, public, now=T0, window_ms=WINDOW_MS).ts_ms == ts_ms
    wire = oob.sign_request(private(keys), "hot-reload", {}, ts_ms=T0 - WINDOW_MS - 1)
    with pytest.raises(StaleRequest) as info:
        oob.verify_request(wire, public, now=T0, window_ms=WINDOW_MS)
    assert (info.value.ts_ms, info.value.now_ms, info.value.window_ms) == (
        T0 - WINDOW_MS - 1, T0, WINDOW_MS)


def signed_payload(pair, fields: dict) -> bytes:
    """A correctly signed request whose payload is `fields`, whatever they are."""
    payload = orjson.dumps(fields, option=orjson.OPT_SORT_KEYS)
    signature = base64.b64encode(private(pair).sign(payload)).decode()
    return orjson.dumps({"payload": payload.decode(), "signature": signature})


GOOD_FIELDS = {"command": "hot-reload", "args": {}, "nonce": "n" * 32}


@pytest.mark.parametrize("changes, field", [
    ({"command": "shutdown"}, "command"),
    ({"args": []}, "args"),
    ({"nonce": "short"}, "nonce"),
    ({"nonce": 12345678901234567}, "nonce"),
    ({"ts_ms": "now"}, "ts_ms"),
    ({"extra": 1}, "payload"),
    ({"command": "remove-listener", "args": {}}, "args"),
    ({"command": "remove-listener", "args": {"name": "a", "force": True}}, "args"),
    ({"command": "add-listener", "args": {"name": "a", "root_tag": "t", "payload": "m:P"}},
     "args.handler"),
    ({"command": "add-listener", "args": {"name": "a", "root_tag": "hot-reload",
                                          "payload": "m:P", "handler": "m:h"}},
     "args.root_tag"),
    ({"args": {"file": "x"}}, "args"),
])
def test_malformed_signed_requests_are_refused(bus, server, keys, recorder, socket_path,
                                               changes, field):
    fields = {**GOOD_FIELDS, "ts_ms": now_ms(), **changes}
    response = oob.send_wire(socket_path, signed_payload(keys, fields))
    assert_refused(bus, recorder, response, "malformed", f"{field}: ")
    assert response["message"].startswith(f"{field}: ")


@pytest.mark.parametrize("wire, fragment", [
    (b"not json", "request: is not JSON"),
    (b"[1, 2]", "request: must be a JSON object"),
    (b'{"signature": "abc"}', "payload: must be the signed canonical JSON text"),
    (b"x" * (oob.MAX_REQUEST_BYTES + 1), "is larger than 65536 bytes"),
])
def test_garbage_requests_are_refused(bus, server, recorder, socket_path, wire, fragment):
    response = oob.send_wire(socket_path, wire)
    assert_refused(bus, recorder, response, "malformed", fragment)


# --- nonces ------------------------------------------------------------------------------------


def test_old_nonces_are_forgotten(bus, keys):
    public = [oob.load_public_key(keys.public_path)]
    old = oob.verify_request(oob.sign_request(private(keys), "hot-reload", {}, ts_ms=T0),
                             public, now=T0, window_ms=WINDOW_MS)
    oob.record_request(bus.conn, old, T0)
    later = T0 + oob.NONCE_RETENTION_MS + 1
    new = oob.verify_request(oob.sign_request(private(keys), "hot-reload", {}, ts_ms=later),
                             public, now=later, window_ms=WINDOW_MS)
    oob.record_request(bus.conn, new, later)
    nonces = [row[0] for row in bus.conn.execute("SELECT nonce FROM oob_nonces")]
    assert nonces == [new.nonce]


# --- several connections at once ---------------------------------------------------------


def idle_connection(socket_path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(socket_path))
    return sock


def still_open(sock: socket.socket) -> bool:
    """The server has neither answered nor closed it: a read would block."""
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)


def test_idle_connections_do_not_hold_up_a_valid_request(server, keys, socket_path):
    """Served one at a time, the request waited for each idle client's timeout (15 s)."""
    idle = [idle_connection(socket_path) for _ in range(3)]
    try:
        response = oob.send_request(socket_path, private(keys), "remove-listener",
                                    {"name": "calc.add"})
        assert response["ok"] is True
        assert all(still_open(sock) for sock in idle)  # answered while they still wait
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_trickles_its_request_is_cut_off_at_the_deadline(server, socket_path,
                                                                        monkeypatch):
    """The deadline covers the whole request, not each read: a byte every 0.1 s, under the
    per-read timeout, still ends when the connection's time is up."""
    monkeypatch.setattr(oob, "CONNECTION_TIMEOUT_S", 0.5)
    sock = idle_connection(socket_path)
    sock.settimeout(30)
    cut_off = threading.Event()
    try:
        for _ in range(600):  # a minute of trickling at most
            try:
                sock.sendall(b" ")
            except OSError:  # EPIPE / ECONNRESET: the server closed it
                cut_off.set()
                break
            if not still_open(sock):
                cut_off.set()
                break
            cut_off.wait(0.1)
    finally:
        sock.close()
    assert cut_off.is_set()
