"""`bus serve --mcp` and `bus token`: agents over HTTP, through the MCP SDK's own client.

Every test runs the server as a real process on 127.0.0.1 with a free port,
and the agents as the SDK's Streamable HTTP client (tests/support/remote_agent.py, in
processes of their own where several agents act at once).
"""

from __future__ import annotations

import json
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from bus import Bus
from bus.log.messages import now_ms
from tests.support.cli_helpers import run
from tests.conftest import REPO_ROOT

AGENT = str(REPO_ROOT / "tests" / "support" / "remote_agent.py")
CHROMIUM = shutil.which("chromium")
PAGE_TIMEOUT_MS = 20_000


class McpServer:
    """`bus serve --mcp --port 0 --tools all` in its own process (the tests call tools of
    every group, so `--tools` reaches the HTTP servers too); the URL comes from its first
    line."""

    def __init__(self, db: Path, env: dict[str, str], *extra: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bus.cli", "--db", str(db), "serve", "--mcp", "--port", "0",
             "--tools", "all", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=env)
        line = self.proc.stdout.readline()
        assert " at http://" in line, line + self.proc.stderr.read()
        self.url = line.split(" at ")[1].split()[0]
        self.mcp = self.url + "mcp"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=30)


@pytest.fixture
def served(db_path: Path, python_env: dict[str, str]):
    with Bus.open(db_path, create=True):
        pass
    servers: list[McpServer] = []

    def start(*extra: str) -> McpServer:
        servers.append(McpServer(db_path, python_env, *extra))
        return servers[-1]
    yield start
    for server in servers:
        server.stop()


def token_for(db: Path, agent: str, **kwargs: Any) -> tuple[str, str]:
    with Bus.open(db) as bus:
        new = bus.tokens.create(agent, **kwargs)
    return new.id, new.token


def agent_calls(url: str, token: str, calls: list[list[Any]], env: dict[str, str]) -> list[dict]:
    done = subprocess.run([sys.executable, AGENT, url, token, "calls", json.dumps(calls)],
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


def http_status(url: str, token: str | None = None, method: str = "POST",
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
    """Status and headers of one raw request (an MCP initialize for a POST)."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    request = urllib.request.Request(url, data=body if method == "POST" else None,
                                     method=method, headers={
                                         "Content-Type": "application/json",
                                         "Accept": "application/json, text/event-stream",
                                         **({"Authorization": f"Bearer {token}"} if token else {}),
                                         **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as refused:
        return refused.code, dict(refused.headers)


def stored(db: Path) -> list[tuple[str, str, str]]:
    """(from, type, id) of every message in the file, in order."""
    with Bus.open(db) as bus:
        return [tuple(row) for row in bus.conn.execute(
            "SELECT from_agent, type, id FROM messages ORDER BY seq")]


# --- tokens -----------------------------------------------------------------------------


def test_token_create_list_revoke_keeps_only_the_hash(db_path: Path) -> None:
    with Bus.open(db_path, create=True):
        pass
    created = run(["token", "create", "--agent", "w1", "--expires", "30d", "--json"], db_path)
    assert created.exit_code == 0, created.stderr
    new = json.loads(created.stdout)
    assert set(new) == {"id", "agent", "token"} and new["agent"] == "w1"
    listed = run(["token", "list", "--json"], db_path)
    assert new["token"] not in listed.stdout
    row = json.loads(listed.stdout.splitlines()[0])
    assert row["id"] == new["id"] and row["read_only"] is False
    assert row["expires_ms"] - row["created_ms"] == 30 * 86_400_000
    assert new["token"].encode() not in db_path.read_bytes()
    assert run(["token", "revoke", new["id"]], db_path).exit_code == 0
    refused = run(["token", "revoke", "tok-nope"], db_path)
    assert refused.exit_code == 1 and "tok-nope" in refused.stderr
    bad = run(["token", "create", "--agent", "w1", "--expires", "soon"], db_path)
    assert bad.exit_code == 2 and "--expires" in bad.stderr


# --- identity and refusals --------------------------------------------------------------


def test_remote_request_acts_as_its_tokens_agent_only(served, db_path: Path,
                                                      python_env: dict[str, str]) -> None:
    server = served()
    _, alice = token_for(db_path, "alice")
    _, bob = token_for(db_path, "bob")
    first = agent_calls(server.mcp, alice, [
        ["publish", {"type": "hello", "to": "bob"}],
        ["publish", {"type": "forged", "from": "bob"}],
        ["publish", {"type": "forged", "from_agent": "bob"}],
        ["publish", {"type": "forged", "agent": "bob"}]], python_env)
    assert "result" in first[0]
    assert all("publish takes no such argument" in r["error"] for r in first[1:])
    second = agent_calls(server.mcp, bob, [["poll", {}], ["publish", {"type": "reply"}]],
                         python_env)
    [message] = second[0]["result"]["messages"]
    assert (message["from"], message["type"]) == ("alice", "hello")
    assert [row[:2] for row in stored(db_path)] == [("alice", "hello"), ("bob", "reply")]


def test_remote_refuses_missing_unknown_revoked_and_expired_tokens(
        served, db_path: Path, python_env: dict[str, str]) -> None:
    server = served()
    revoked_id, revoked = token_for(db_path, "w1")
    _, expired = token_for(db_path, "w1", expires_ms=1000, now=now_ms() - 60_000)
    _, good = token_for(db_path, "w1")
    assert http_status(server.mcp, good)[0] == 200
    assert http_status(server.mcp, revoked)[0] == 200
    with Bus.open(db_path) as bus:
        bus.tokens.revoke(revoked_id)
    for token in (None, "abt_" + "x" * 43, "not-a-token", revoked, expired):
        status, headers = http_status(server.mcp, token)
        assert status == 401, token
        assert headers["www-authenticate"].startswith("Bearer "), headers


def test_remote_lists_the_daily_loop_unless_tools_names_more(served, db_path: Path,
                                                             python_env: dict[str, str]) -> None:
    lean = served("--tools", "")  # the last --tools wins: none beside the daily loop
    _, token = token_for(db_path, "w1")
    published, claimed = agent_calls(lean.mcp, token, [
        ["publish", {"type": "x"}], ["claim", {"task": "t1"}]], python_env)
    assert published["result"]["seq"] == 1
    assert claimed["error"].startswith("unknown_tool: claim: this server does not list it; it"
                                       " is in the tool group tasks")
    with Bus.open(db_path) as bus:
        assert bus.conn.execute("SELECT count(*) FROM task_claims").fetchone() == (0,)


def test_remote_read_only_token_may_not_write(served, db_path: Path,
                                              python_env: dict[str, str]) -> None:
    server = served()
    _, reader = token_for(db_path, "watcher", read_only=True)
    results = agent_calls(server.mcp, reader, [
        ["liveness", {}], ["task_ready", {}], ["publish", {"type": "x"}],
        ["claim", {"task": "t1"}], ["heartbeat", {"status": "idle"}],
        ["poll", {}]], python_env)  # poll may ack (ack_through): not read-only
    assert "result" in results[0] and "result" in results[1]
    for refused in results[2:]:
        assert "read-only" in refused["error"], refused
    assert stored(db_path) == []
    with Bus.open(db_path) as bus:
        assert bus.claims.list() == []


def test_serve_refuses_foreign_host_and_origin(served, db_path: Path) -> None:
    server = served()
    _, token = token_for(db_path, "w1")
    port = server.url.rstrip("/").rsplit(":", 1)[1]
    for path, method in (("", "GET"), ("api/status", "GET"), ("mcp", "POST")):
        url = server.url + path
        assert http_status(url, token, method, {"Host": "evil.example"})[0] == 421
        assert http_status(url, token, method, {"Host": f"evil.example:{port}"})[0] == 421
        assert http_status(url, token, method, {"Origin": "http://evil.example"})[0] == 403
        for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
            assert http_status(url, token, method, {"Host": host,
                                                    "Origin": f"http://{host}"})[0] == 200


def test_serve_require_token_refused_when_none_exists(db_path: Path) -> None:
    with Bus.open(db_path, create=True):
        pass
    result = run(["serve", "--require-token", "--port", "0"], db_path)
    assert result.exit_code == 2 and "--require-token" in result.stderr


# --- many agents, and a crash -----------------------------------------------------------


@pytest.mark.slow
def test_sixteen_agents_publish_poll_claim_and_ack_through_one_server(
        served, db_path: Path, python_env: dict[str, str]) -> None:
    server = served()
    agents = [f"agent-{i:02d}" for i in range(16)]
    tokens = [token_for(db_path, agent)[1] for agent in agents]
    count, tasks = 10, [f"task-{n}" for n in range(8)]
    procs = [subprocess.Popen(
        [sys.executable, AGENT, server.mcp, token, "exchange", json.dumps({
            "to": agents[(i + 1) % 16], "count": count, "tasks": tasks, "expect": count})],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=python_env)
        for i, token in enumerate(tokens)]
    summaries = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-3000:]
        summaries.append(json.loads(stdout.splitlines()[-1]))
    for i, summary in enumerate(summaries):
        assert summary["errors"] == [], summary["errors"][:3]
        sender = agents[(i - 1) % 16]
        assert sorted(n for _, n, _ in summary["received"]) == list(range(count))
        assert {frm for frm, _, _ in summary["received"]} == {sender}
    granted = [task for s in summaries for task in s["granted"]]
    assert sorted(granted) == sorted(tasks)  # each task went to exactly one agent
    everything = stored(db_path)
    assert len(everything) == 16 * count
    assert len({message_id for _, _, message_id in everything}) == 16 * count


@pytest.mark.slow
def test_server_killed_mid_run_keeps_every_acknowledged_publish(
        served, db_path: Path, python_env: dict[str, str]) -> None:
    server = served()
    _, token = token_for(db_path, "w1")
    ids = [str(uuid.uuid4()) for _ in range(2000)]
    client = subprocess.Popen([sys.executable, AGENT, server.mcp, token, "publish_ids",
                               json.dumps({"ids": ids})], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=python_env)
    acknowledged = []
    deadline = time.monotonic() + 120
    while len(acknowledged) < 20 and time.monotonic() < deadline:
        line = client.stdout.readline()
        assert line, client.stderr.read()[-3000:]
        acknowledged.append(json.loads(line))
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(timeout=30)
    rest, _ = client.communicate(timeout=120)  # the client fails once the server is gone
    acknowledged += [json.loads(line) for line in rest.splitlines()]
    acked_ids = [a["id"] for a in acknowledged if "result" in a]
    assert len(acked_ids) >= 20
    assert set(acked_ids) <= {message_id for _, _, message_id in stored(db_path)}
    again = served()
    retried = agent_calls(again.mcp, token, [["publish", {"type": "crash", "id": acked_ids[-1]}]],
                          python_env)
    assert retried[0]["result"]["duplicate"] is True
    assert [m for _, _, m in stored(db_path)].count(acked_ids[-1]) == 1


# --- the page with a token --------------------------------------------------------------


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (make test installs it)")
def test_serve_page_with_a_token_in_chromium(served, db_path: Path) -> None:
    sync_api = pytest.importorskip("playwright.sync_api")
    _, token = token_for(db_path, "viewer", read_only=True)
    with Bus.open(db_path) as bus:
        bus.publish("planner", "note", {"n": 1})
    server = served("--require-token")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM)
        page = browser.new_page()
        refused = page.goto(server.url)
        assert refused is not None and refused.status == 401
        page.goto(server.url + f"?token={token}")
        assert "token=" not in page.url  # the cookie carries it from here on
        page.wait_for_function("document.body.dataset.lastSeq === '1'", timeout=PAGE_TIMEOUT_MS)
        page.wait_for_function("document.getElementById('live').className === ''",
                               timeout=PAGE_TIMEOUT_MS)
        assert page.goto(server.url + "api/status").status == 200  # with the cookie
        fresh = browser.new_context().new_page()  # a context of its own: no cookie
        assert fresh.goto(server.url + "api/status").status == 401
        browser.close()


def test_a_401_points_to_the_protected_resource_metadata_which_names_bus_token(
        served, db_path: Path) -> None:
    """RFC 9728: the challenge names the metadata, which is public even where every path
    needs a token, names /mcp as the resource and names no authorization server."""
    token_for(db_path, "viewer", read_only=True)  # a non-loopback server needs a token to exist
    for server in (served(), served("--host", "0.0.0.0")):
        port = server.url.rstrip("/").rsplit(":", 1)[1]
        local = f"http://127.0.0.1:{port}"
        status, headers = http_status(local + "/mcp")
        challenge = headers["www-authenticate"]
        assert status == 401 and "bus token create" in challenge, challenge
        metadata_url = challenge.split('resource_metadata="')[1].split('"')[0]
        assert metadata_url == local + "/.well-known/oauth-protected-resource/mcp"
        for url in (metadata_url, local + "/.well-known/oauth-protected-resource"):
            with urllib.request.urlopen(url, timeout=30) as response:
                metadata = json.loads(response.read())
            assert metadata["resource"] == local + "/mcp"
            assert metadata["bearer_methods_supported"] == ["header"]
            assert "authorization_servers" not in metadata
            assert "bus token create" in metadata["agentbus_tokens"]
    # Only those two paths are public: one that merely begins like them needs the token.
    beyond = local + "/.well-known/oauth-protected-resource-and-more"
    assert http_status(beyond)[0] == 401


# --- beyond loopback, and TLS ------------------------------------------------------------


def test_serve_on_every_address_needs_a_token_everywhere_and_warns_without_tls(
        served, db_path: Path) -> None:
    _, token = token_for(db_path, "viewer", read_only=True)
    server = served("--host", "0.0.0.0")
    port = server.url.rstrip("/").rsplit(":", 1)[1]
    local = f"http://127.0.0.1:{port}/"
    for path in ("", "api/status", "events", "mcp"):
        method = "POST" if path == "mcp" else "GET"
        status, headers = http_status(local + path, None, method)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer "), path
    assert http_status(local + "api/status", token, "GET")[0] == 200
    server.stop()
    assert "warning: serving 0.0.0.0 over plain HTTP" in server.proc.stderr.read()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl makes the test certificate")
def test_serve_with_certfile_and_keyfile_speaks_https(served, db_path: Path,
                                                      tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    _, token = token_for(db_path, "w1")
    proc = subprocess.Popen([sys.executable, "-m", "bus.cli", "--db", str(db_path), "serve",
                             "--mcp", "--port", "0", "--certfile", str(cert), "--keyfile",
                             str(key)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert " at https://127.0.0.1:" in line, line + proc.stderr.read()
        url = line.split(" at ")[1].split()[0]
        context = ssl.create_default_context(cafile=str(cert))
        context.check_hostname = False  # the certificate names localhost, the URL 127.0.0.1
        request = urllib.request.Request(url + "api/status")
        with urllib.request.urlopen(request, timeout=30, context=context) as response:
            assert response.status == 200
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)


def test_read_only_is_the_tools_annotation() -> None:
    from mcp.types import ToolAnnotations

    from bus.mcpserver.http import read_only_tool

    assert read_only_tool(ToolAnnotations(readOnlyHint=True))
    assert not read_only_tool(ToolAnnotations(readOnlyHint=False))
    assert not read_only_tool(ToolAnnotations()) and not read_only_tool(None)


def test_serve_allow_remote_is_deprecated_with_a_note(served) -> None:
    server = served("--allow-remote")
    server.stop()
    assert "note: --allow-remote is no longer needed" in server.proc.stderr.read()
