"""Installing only what you need: the wheel alone, and with each extra alone.

`pip install agentbus` is the embedded bus, and its commands work; a command
whose extra is not installed exits 1 naming the extra to install. One venv
for the core and one per extra: four installs in all, each made once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# The commands each extra brings, as a user types them (after `bus --db FILE`).
NEEDS = {
    "views": (("top",), ("serve", "--port", "0")),
    "mcp": (("mcp", "--agent", "planner", "--list"),),
    "spark": (("history",),),
    "nats": (("mirror", "nats", "--url", "nats://127.0.0.1:9", "--stream", "BUS"),),
    "replicate": (("replicate", "--to", "file:///nowhere/replica"),
                  ("restore", "--from", "file:///nowhere/replica", "restored.db")),
}
# What those commands import, ours and theirs (report.html draws with plotly).
USES = {
    "views": ("bus.views.top", "bus.views.serve", "plotly"),
    "mcp": ("bus.mcpserver",),
    "spark": ("pyspark.sql", "pyarrow.parquet", "matplotlib.pyplot", "plotly.graph_objects"),
    "nats": ("nats.js", "bus.mirror.jetstream"),
    "replicate": ("bus.replica.binary; bus.replica.binary.locate_litestream()",),
}


def assert_names_extra(done, argv: tuple[str, ...], extra: str) -> None:
    command = f"bus {argv[0]}"
    assert done.returncode == 1, (command, done.stdout, done.stderr)
    assert done.stderr.startswith("Error: "), (command, done.stderr)
    assert f"pip install 'agentbus[{extra}]'" in done.stderr, (command, done.stderr)
    assert "Traceback" not in done.stderr


def test_core_install_runs_the_bus_and_names_each_missing_extra(install_wheel,
                                                                tmp_path: Path) -> None:
    core = install_wheel("")
    db = str(tmp_path / "bus.db")
    for argv in (("init",),
                 ("publish", "--from", "planner", "--to", "worker-1", "--type", "task_assign",
                  "--payload", '{"task": "t1"}'),
                 ("poll", "--agent", "worker-1"),
                 ("status",)):
        done = core.run("bus", "--db", db, *argv, cwd=tmp_path)
        assert done.returncode == 0, (argv, done.stderr)
    assert '{"task":"t1"}' in core.run("bus", "--db", db, "poll", "--agent", "worker-1",
                                       cwd=tmp_path).stdout
    assert core.run("worker", "--help", cwd=tmp_path).returncode == 0
    assert core.run("worker", "--db", db, "status", cwd=tmp_path).returncode == 0
    for extra, commands in NEEDS.items():
        for argv in commands:
            assert_names_extra(core.run("bus", "--db", db, *argv, cwd=tmp_path), argv, extra)


@pytest.mark.parametrize("installed_extra", sorted(NEEDS))
def test_one_extra_installed_names_each_other_extra(install_wheel, installed_extra: str,
                                                    tmp_path: Path) -> None:
    venv = install_wheel(installed_extra)
    db = str(tmp_path / "bus.db")
    assert venv.run("bus", "--db", db, "init", cwd=tmp_path).returncode == 0
    for extra, commands in NEEDS.items():
        if extra != installed_extra:
            for argv in commands:
                assert_names_extra(venv.run("bus", "--db", db, *argv, cwd=tmp_path), argv, extra)
    # Its own commands keep running (a server, a screen): what they import is all there.
    imported = venv.run("python", "-c", "\n".join(f"import {m}" for m in USES[installed_extra]),
                        cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr


def test_mcp_extra_alone_serves_the_tools(install_wheel, tmp_path: Path) -> None:
    venv = install_wheel("mcp")
    db = str(tmp_path / "bus.db")
    assert venv.run("bus", "--db", db, "init", cwd=tmp_path).returncode == 0
    listed = venv.run("bus", "--db", db, "mcp", "--agent", "planner", "--list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "publish" in listed.stdout
