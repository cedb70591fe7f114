"""`bus threads`, `bus organism check` and `bus oob` through click's CliRunner
(exit codes and whole outputs), plus `bus oob send` as a real subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bus import Bus
from bus import threads
from bus.cli import main
from tests.test_organism import GOOD
from tests.test_organism import TOOLS

T0 = 1_700_000_000_000


def run(args: list[str], db: Path | str | None = None):
    """Invoke the CLI in-process; BUS_DB / BUS_DURABILITY from the caller's shell are hidden."""
    argv = (["--db", str(db)] if db is not None else []) + args
    return CliRunner().invoke(main, argv, env={"BUS_DB": None, "BUS_DURABILITY": None},
                              catch_exceptions=False)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


# --- bus threads -----------------------------------------------------------------------


def test_threads_lists_paths_oldest_first(bus: Bus, db_path: Path):
    root = threads.initialize_root(bus.conn, "org", now=T0)
    call = threads.extend_chain(bus.conn, root.uuid, "calc.add", now=T0 + 1000)
    threads.prune_for_response(bus.conn, call.uuid, now=T0 + 2500)
    result = run(["threads"], db_path)
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
    result = run(["threads", "--json", "--status", "closed"], db_path)
    assert result.exit_code == 0
    assert json_lines(result.stdout) == [threads.get_thread(bus.conn, call.uuid).to_json_dict()]
    newest = run(["threads", "--json", "--limit", "1"], db_path)
    assert [t["uuid"] for t in json_lines(newest.stdout)] == [call.uuid]


def test_threads_on_an_empty_registry(bus: Bus, db_path: Path):
    result = run(["threads"], db_path)
    assert (result.exit_code, result.stdout) == (0, "no threads\n")


def test_threads_usage_errors_exit_2(bus: Bus, db_path: Path):
    assert run(["threads", "--status", "gone"], db_path).exit_code == 2
    assert run(["threads", "--limit", "0"], db_path).exit_code == 2


def test_threads_without_a_bus_exits_1(tmp_path: Path):
    result = run(["threads"], tmp_path / "none.db")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: no bus database at ")
    assert not (tmp_path / "none.db").exists()


# --- bus organism check ------------------------------------------------------------------


def write_organism(directory: Path, text: str = GOOD) -> Path:
    module = f"cli_tools_{abs(hash(directory)) % 10**8}"
    (directory / f"{module}.py").write_text(TOOLS)
    path = directory / "organism.yaml"
    path.write_text(text.replace("demo_tools", module))
    return path


def test_organism_check_reports_the_routes(tmp_path: Path):
    path = write_organism(tmp_path)
    result = run(["organism", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert result.stdout == (
        f"{path}: organism demo-org is valid: 3 listeners, 1 agent\n"
        "  <add> -> calc.add\n  <research-query> -> researcher\n  <search> -> websearch\n")


def test_organism_check_json(tmp_path: Path):
    path = write_organism(tmp_path)
    result = run(["organism", "check", str(path), "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {
        "ok": True, "organism": "demo-org", "source": str(path),
        "listeners": ["calc.add", "researcher", "websearch"], "agents": ["researcher"],
        "routes": {"add": ["calc.add"], "research-query": ["researcher"],
                   "search": ["websearch"]}}


def test_organism_check_names_the_key_of_a_bad_file(tmp_path: Path):
    path = write_organism(tmp_path, GOOD.replace("peers: [calc.add, websearch]",
                                                 "peers: [calc.add, bing]"))
    result = run(["organism", "check", str(path)])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr == (f"Error: {path}: listeners[1].peers[1]: no listener is named "
                             "'bing'; listeners: calc.add, researcher, websearch\n")


def test_organism_check_imports_the_references(tmp_path: Path):
    path = write_organism(tmp_path, GOOD.replace("demo_tools:search", "demo_tools:nothing"))
    result = run(["organism", "check", str(path)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: {path}: listeners[2].handler: ")
    assert "has no attribute 'nothing'" in result.stderr


def test_organism_check_of_a_missing_file_exits_1(tmp_path: Path):
    result = run(["organism", "check", str(tmp_path / "none.yaml")])
    assert result.exit_code == 1
    assert "(file): cannot be read" in result.stderr
