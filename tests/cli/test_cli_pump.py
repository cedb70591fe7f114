"""`bus pump threads`, `bus pump organism check` and `bus pump oob` through click's CliRunner
(exit codes and whole outputs), plus `bus pump oob send` as a real subprocess."""

from __future__ import annotations

import json
import stat
import subprocess
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus import Bus
from bus.cli import main
from bus.pump import oob
from bus.pump import threads
from tests.support.cli_helpers import bad_value
from tests.support.cli_helpers import last_error
from tests.pump.test_organism import GOOD
from tests.pump.test_organism import TOOLS

T0 = 1_700_000_000_000


def run(args: list[str], db: Path | str | None = None):
    """Invoke the CLI in-process; BUS_DB / BUS_DURABILITY from the caller's shell are hidden."""
    argv = (["--db", str(db)] if db is not None else []) + args
    return CliRunner().invoke(main, argv, env={"BUS_DB": None, "BUS_DURABILITY": None},
                              catch_exceptions=False)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


# --- bus pump threads -----------------------------------------------------------------------


def test_threads_lists_paths_oldest_first(bus: Bus, db_path: Path):
    root = threads.initialize_root(bus.conn, "org", now=T0)
    call = threads.extend_chain(bus.conn, root.uuid, "calc.add", now=T0 + 1000)
    threads.prune_for_response(bus.conn, call.uuid, now=T0 + 2500)
    result = run(["pump", "threads"], db_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "  ".join(["uuid".ljust(36), "path".ljust(12), "parent".ljust(36), "status",
                   "created".ljust(24), "closed"]),
        f"{root.uuid}  org           {'-'.ljust(36)}  open    2023-11-14T22:13:20.000Z  -",
        f"{call.uuid}  org/calc.add  {root.uuid}  closed  2023-11-14T22:13:21.000Z"
        "  2023-11-14T22:13:22.500Z",
    ]


def test_threads_json_and_filters(bus: Bus, db_path: Path):
    root = threads.initialize_root(bus.conn, "org", now=T0)
    call = threads.extend_chain(bus.conn, root.uuid, "calc.add", now=T0)
    threads.close_thread(bus.conn, call.uuid, now=T0 + 1)
    result = run(["pump", "threads", "--json", "--status", "closed"], db_path)
    assert result.exit_code == 0
    assert json_lines(result.stdout) == [threads.get_thread(bus.conn, call.uuid).to_json_dict()]
    newest = run(["pump", "threads", "--json", "--limit", "1"], db_path)
    assert [t["uuid"] for t in json_lines(newest.stdout)] == [call.uuid]


def test_threads_on_an_empty_registry(bus: Bus, db_path: Path):
    result = run(["pump", "threads"], db_path)
    assert (result.exit_code, result.stdout) == (0, "no threads\n")


def test_threads_usage_errors_exit_2(bus: Bus, db_path: Path):
    assert run(["pump", "threads", "--status", "gone"], db_path).exit_code == 2
    assert run(["pump", "threads", "--limit", "0"], db_path).exit_code == 2


def test_threads_without_a_bus_exits_1(tmp_path: Path):
    result = run(["pump", "threads"], tmp_path / "none.db")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no bus database at ")
    assert not (tmp_path / "none.db").exists()


# --- bus pump organism check ------------------------------------------------------------------


def write_organism(directory: Path, text: str = GOOD) -> Path:
    module = f"cli_tools_{abs(hash(directory)) % 10**8}"
    (directory / f"{module}.py").write_text(TOOLS)
    path = directory / "organism.yaml"
    path.write_text(text.replace("demo_tools", module))
    return path


def test_pump_dead_with_none_says_so(bus: Bus, db_path: Path, tmp_path: Path):
    path = write_organism(tmp_path)
    result = run(["pump", "dead", str(path)], db_path)
    assert (result.exit_code, result.output) == (0, "no dead letters for organism demo-org\n")
    result = run(["pump", "dead", str(path), "--json"], db_path)
    assert (result.exit_code, result.output) == (0, "")


def test_organism_check_reports_the_routes(tmp_path: Path):
    path = write_organism(tmp_path)
    result = run(["pump", "organism", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"{path}: organism demo-org is valid: 3 listeners, 1 agent\n"
        "  <add> -> calc.add\n  <research-query> -> researcher\n  <search> -> websearch\n")


def test_organism_check_json(tmp_path: Path):
    path = write_organism(tmp_path)
    result = run(["pump", "organism", "check", str(path), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "ok": True, "organism": "demo-org", "source": str(path),
        "listeners": ["calc.add", "researcher", "websearch"], "agents": ["researcher"],
        "routes": {"add": ["calc.add"], "research-query": ["researcher"],
                   "search": ["websearch"]}}


def test_organism_check_names_the_key_of_a_bad_file(tmp_path: Path):
    path = write_organism(tmp_path, GOOD.replace("peers: [calc.add, websearch]",
                                                 "peers: [calc.add, bing]"))
    result = run(["pump", "organism", "check", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (f"Error: {path}: listeners[1].peers[1]: no listener is named "
                             "'bing'; listeners: calc.add, researcher, websearch\n")


def test_organism_check_imports_the_references(tmp_path: Path):
    path = write_organism(tmp_path, GOOD.replace("demo_tools:search", "demo_tools:nothing"))
    result = run(["pump", "organism", "check", str(path)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {path}: listeners[2].handler: ")
    assert "has no attribute 'nothing'" in result.stderr


def test_organism_check_of_a_missing_file_exits_1(tmp_path: Path):
    result = run(["pump", "organism", "check", str(tmp_path / "none.yaml")])
    assert result.exit_code == 1
    assert "(file): cannot be read" in result.stderr


# --- bus pump oob keygen / send ----------------------------------------------------------------


def test_oob_keygen_writes_the_pair_beside_the_bus(db_path: Path):
    result = run(["pump", "oob", "keygen"], db_path)
    assert result.exit_code == 0, result.output
    private, public = db_path.parent / "oob_ed25519", db_path.parent / "oob_ed25519.pub"
    key_id = oob.key_id(oob.load_public_key(public))
    assert result.stdout == (
        f"private key: {private} (mode 0600, keep it secret)\n"
        f"public key:  {public} (key id {key_id})\n"
        "list the public key under oob.authorized_keys in organism.yaml\n")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert not db_path.exists()  # keygen does not need the bus


def test_oob_keygen_json_and_refusal_to_overwrite(tmp_path: Path):
    out = tmp_path / "keys"
    result = run(["pump", "oob", "keygen", "--out", str(out), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "private_key": str(out / "oob_ed25519"), "public_key": str(out / "oob_ed25519.pub"),
        "key_id": oob.key_id(oob.load_public_key(out / "oob_ed25519.pub"))}
    again = run(["pump", "oob", "keygen", "--out", str(out)])
    assert again.exit_code == 1
    assert again.stderr == (f"Error: key file {out / 'oob_ed25519'}: exists already; keygen "
                            "never overwrites a key: remove it or choose another --out "
                            "directory\n")


@pytest.fixture
def serving(bus: Bus, db_path: Path, tmp_path: Path):
    """An OobServer on the default socket beside the bus, trusting keys/oob_ed25519."""
    pair = oob.generate_keys(tmp_path / "keys")
    requests: list[oob.OobRequest] = []
    server = oob.OobServer(bus, oob.socket_path_for(db_path),
                           [oob.load_public_key(pair.public_path)],
                           lambda request: requests.append(request) or {"listeners": 2})
    stop = threading.Event()
    thread = threading.Thread(target=server.serve_forever, args=(stop, 0.02))
    thread.start()
    yield pair, requests
    stop.set()
    thread.join()
    server.close()


def test_oob_send_as_a_real_process(serving, db_path: Path, bus_command, python_env):
    pair, requests = serving
    result = subprocess.run(
        [*bus_command, "--db", str(db_path), "pump", "oob", "send", "remove-listener",
         '{"name": "calc.add"}', "--key", str(pair.private_path)],
        env=python_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    [request] = requests
    assert request.args == {"name": "calc.add"}
    assert result.stdout == (f"remove-listener accepted (nonce {request.nonce}): "
                             '{"listeners":2}\n')


def test_oob_send_json(serving, db_path: Path):
    pair, requests = serving
    result = run(["pump", "oob", "send", "hot-reload", "--key", str(pair.private_path), "--json"],
                 db_path)
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"ok": True, "nonce": requests[0].nonce,
                                         "result": {"listeners": 2}}


def test_oob_send_refused_exits_1(serving, db_path: Path, tmp_path: Path):
    stranger = oob.generate_keys(tmp_path / "stranger")
    result = run(["pump", "oob", "send", "hot-reload", "--key", str(stranger.private_path)], db_path)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: hot-reload refused (bad_signature): signature: "
                                    "no authorized key made it")
    as_json = run(["pump", "oob", "send", "hot-reload", "--key", str(stranger.private_path), "--json"],
                  db_path)
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout)["error"] == "bad_signature"
    assert serving[1] == []


def test_oob_send_usage_and_connection_errors(db_path: Path, tmp_path: Path):
    pair = oob.generate_keys(tmp_path / "keys")
    key = ["--key", str(pair.private_path)]
    assert run(["pump", "oob", "send", "shutdown", *key], db_path).exit_code == 2
    bad_args = run(["pump", "oob", "send", "hot-reload", "[1]", *key], db_path)
    assert bad_args.exit_code == 2
    assert "ARGS" in bad_args.stderr and "must be a JSON object" in bad_args.stderr
    assert run(["pump", "oob", "send", "hot-reload", "{", *key], db_path).exit_code == 2
    nobody = run(["pump", "oob", "send", "hot-reload", *key], db_path)
    assert nobody.exit_code == 1
    assert nobody.stderr.startswith(f"Error: oob socket {db_path.parent / 'oob.sock'}: "
                                    "nobody is listening")


# --- bus pump run / send ------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "organism.yaml"


@pytest.fixture
def example_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE.parent))


def test_pump_send_then_run_until_idle_then_read_the_reply(db_path: Path, example_importable):
    sent = run(["pump", "send", str(EXAMPLE), "<add><a>1.5</a><b>2</b></add>", "--to",
                "calculator", "--json"], db_path)
    assert sent.exit_code == 0, sent.output
    request = json.loads(sent.stdout)
    assert (request["seq"], request["client"]) == (1, "console")
    ran = run(["pump", "run", str(EXAMPLE), "--until-idle", "--no-oob"], db_path)
    assert (ran.exit_code, ran.stdout) == (0, "pump example: booted; 1 replied\n")
    again = run(["pump", "run", str(EXAMPLE), "--until-idle", "--no-oob", "--json"], db_path)
    assert json.loads(again.stdout) == {"organism": "example", "outcomes": {}, "steps": 1,
                                        "booted": False}
    with Bus.open(db_path) as bus:
        reply = bus.list_messages(after=1)[-1]
    assert (reply.from_agent, reply.to_agent, reply.correlation_id, reply.in_reply_to) == (
        "calculator", "@example", request["thread"], request["id"])
    assert "<sum><value>3.5</value></sum>" in reply.payload["xml"]


def test_pump_send_refuses_bad_xml_and_envelopes(db_path: Path):
    bad = run(["pump", "send", str(EXAMPLE), "<add><a>1</a>"], db_path)
    assert bad.exit_code == 1 and "not well-formed" in bad.stderr
    forged = run(["pump", "send", str(EXAMPLE), '<m:message xmlns:m="urn:agentbus:envelope:1"/>'],
                 db_path)
    assert forged.exit_code == 2
    assert last_error(forged.stderr) == bad_value(
        "XML", "is an envelope; send the payload only: the pump stamps <from> and <thread> itself")


@pytest.mark.parametrize("name", ["doctype_utf16.xml", "entity_utf16.xml", "entity_utf32.xml"])
def test_pump_send_refuses_a_doctype_in_utf16_and_utf32(db_path: Path, name: str):
    xml = Path(__file__).parent.parent / "data" / "xml" / name
    result = CliRunner().invoke(main, ["--db", str(db_path), "pump", "send", str(EXAMPLE), "-"],
                                input=xml.read_bytes(), env={"BUS_DB": None},
                                catch_exceptions=False)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: line ")
    assert "a DOCTYPE (DTD) is not accepted" in result.stderr
    with Bus.open(db_path) as bus:
        assert bus.last_seq() == 0  # nothing reached the bus


def test_pump_send_wait_times_out_with_exit_1(db_path: Path):
    result = run(["pump", "send", str(EXAMPLE), "<add><a>1</a><b>2</b></add>", "--wait",
                  "--timeout", "0.2"], db_path)
    assert result.exit_code == 1
    assert "no reply on thread" in result.stderr and "bus pump run" in result.stderr


def test_pump_run_names_the_key_of_a_broken_organism(db_path: Path, tmp_path: Path):
    organism = tmp_path / "organism.yaml"
    organism.write_text("listeners:\n  - name: calc\n    root_tag: plus\n"
                        "    payload: tests.support.pump_tools:Add\n    handler: tests.support.pump_tools:add\n")
    result = run(["pump", "run", str(organism), "--until-idle"], db_path)
    assert result.exit_code == 1
    assert "listeners[0].root_tag: is 'plus', but tests.support.pump_tools:Add is the XML element " \
           "<add>" in result.stderr


def send_through_a_real_pump(db_path: Path, bus_command: list[str], python_env: dict,
                             *send_args: str) -> subprocess.CompletedProcess:
    """`bus pump send EXAMPLE ...` while `bus pump run EXAMPLE` runs in another process,
    which must then stop cleanly on SIGTERM."""
    env = dict(python_env, PYTHONPATH=f"{EXAMPLE.parent}:{python_env['PYTHONPATH']}")
    pump = subprocess.Popen([*bus_command, "--db", str(db_path), "pump", "run", str(EXAMPLE),
                             "--no-oob"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        sent = subprocess.run([*bus_command, "--db", str(db_path), "pump", "send", str(EXAMPLE),
                               *send_args], env=env, capture_output=True, text=True, timeout=60)
    finally:
        pump.terminate()
        _, stderr = pump.communicate(timeout=30)
    assert pump.returncode == 0, stderr
    return sent


def test_pump_send_wait_through_a_real_pump_process(db_path: Path, bus_command: list[str],
                                                    python_env):
    sent = send_through_a_real_pump(db_path, bus_command, python_env,
                                    "<search><query>q</query></search>", "--wait",
                                    "--replies", "2")
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.splitlines() == [
        "search.fast -> console: <search-result><source>fast</source>"
        "<text>a quick guess about 'q'</text></search-result>",
        "search.slow -> console: <search-result><source>slow</source>"
        "<text>a thorough answer about 'q'</text></search-result>"]


def test_pump_send_wait_exits_3_on_a_huh_through_a_real_pump(db_path: Path, bus_command,
                                                             python_env):
    sent = send_through_a_real_pump(db_path, bus_command, python_env,
                                    "<add><a>one</a><b>2</b></add>", "--to", "calculator",
                                    "--wait")
    assert sent.returncode == 3, sent.stderr
    line, = sent.stdout.splitlines()
    assert line.startswith("calculator -> console: <huh ") and 'code="payload-invalid"' in line


def test_pump_send_as_a_reserved_id_exits_2(db_path: Path):
    result = run(["pump", "send", str(EXAMPLE), "<boot/>", "--from", "system"], db_path)
    assert result.exit_code == 2
    assert last_error(result.stderr).startswith(
        "Error: Invalid value for '--from': 'system' is reserved")


def test_pump_run_verbose_prints_each_unit_and_counts_what_clients_saw(
        db_path: Path, example_importable):
    for xml in ("<add><a>1</a><b>2</b></add>", "<add><a>one</a><b>2</b></add>",
                "<nothing-takes-this/>"):
        assert run(["pump", "send", str(EXAMPLE), xml, "--to", "calculator"], db_path) \
            .exit_code == 0
    ran = run(["pump", "run", str(EXAMPLE), "--until-idle", "--no-oob", "-v"], db_path)
    assert ran.exit_code == 0, ran.output
    assert ran.stdout == "pump example: booted; 1 huh, 1 no-route, 1 replied\n"
    lines = sorted(ran.stderr.splitlines())
    assert len(lines) == 2
    assert lines[0].startswith("unit ")
    assert lines[0].endswith(" calculator <- #1 from console: replied")
    assert lines[1].endswith(" calculator <- #2 from console: huh")
    as_json = run(["pump", "run", str(EXAMPLE), "--until-idle", "--no-oob", "-v", "--json"],
                  db_path)
    assert as_json.stderr == "" and json.loads(as_json.stdout)["outcomes"] == {}
