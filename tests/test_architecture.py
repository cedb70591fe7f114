"""The layout is the architecture: a module's part is its folder, and parts import one way.

The top-level packages, lowest first: `blobs/` (imports nothing of ours), `bus/`,
`workers/`; each imports only the ones before it, so nothing in `bus` imports
`workers` (the MCP server finds the worker tools through an entry point).
Inside `bus/`, lowest first: its top (only the schema files, installed as
`bus.migrations`); `storage/` (the database file, its schema, the errors);
`log/` (messages, cursors, waking, export, search); `coordination/` (tasks,
claims, reservations, heartbeats, tokens, the workers table); `channels/`,
`xml/` and `history/` beside each other; the facade (`bus/api.py`, which
`bus/__init__.py` exposes: the one part that is not a folder, because it gathers
the rooms below and the engine that everything above builds on); `harness/`
(the agents' clients' hooks); `pump/`, `replica/` (Litestream) and `mirror/`
(NATS JetStream) beside each other; `views/`; `mcpserver/`; `cli/`.
A module imports its own part or a lower one, never a part
beside or above it, and no import cycle exists between modules, whether the
import is at the top of the file, inside a function or under TYPE_CHECKING.
docs/architecture.md explains each part.
"""

from __future__ import annotations

import ast
import functools
import os
import shutil
import subprocess
import sys
import threading
import venv
from pathlib import Path

import orjson
import pytest

from bus import Bus

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("blobs", "bus", "workers")  # lowest first
# Folders installed under another name (setup.cfg's package_dir): the schema files.
INSTALLED_AS = {"bus.migrations": ROOT / "migrations" / "__init__.py"}
# Inside bus/, lowest first: "" is the top of bus/ (bus.migrations), "api" the facade.
BUS_LAYERS = (("",), ("storage",), ("log",), ("coordination",), ("channels", "xml", "history"),
              ("api",), ("harness",), ("pump", "replica", "mirror"), ("views",), ("mcpserver",),
              ("cli",))
FACADE = {"bus", "bus.api"}


@functools.cache
def module_files() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the three packages and bus.migrations."""
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found | INSTALLED_AS


def owning_module(name: str, modules: dict[str, Path]) -> str | None:
    """The module an imported name lives in: `bus.storage.db.connect` -> `bus.storage.db`."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(tree: ast.AST) -> list[str]:
    """Every dotted name a file imports, anywhere in it (functions, TYPE_CHECKING too)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.extend(f"{node.module}.{alias.name}" for alias in node.names)
    return names


@functools.cache
def syntax_tree(name: str) -> ast.Module:
    """A module's parsed source, parsed once for every check that reads it."""
    path = module_files()[name]
    return ast.parse(path.read_text(), str(path))


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """module -> the modules of the three packages it imports (itself excluded)."""
    modules = module_files()
    graph = {}
    for name in modules:
        tree = syntax_tree(name)
        targets = {owning_module(imported, modules) for imported in imported_names(tree)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def part_of(module: str) -> str:
    """The folder a module sits in (`bus.pump.pump` -> `bus.pump`), or `bus.api` for the facade."""
    if module in FACADE:
        return "bus.api"
    if module in INSTALLED_AS:
        return module.rpartition(".")[0]
    path = module_files().get(module)
    is_package = path is not None and path.name == "__init__.py"
    return module if is_package else module.rpartition(".")[0] or module


def rank_of(part: str) -> tuple[int, int]:
    """(the top-level package's place, the place inside bus/): higher imports lower."""
    package, _, inner = part.partition(".")
    if package != "bus":
        return PACKAGES.index(package), 0
    return PACKAGES.index("bus"), next(i for i, layer in enumerate(BUS_LAYERS) if inner in layer)


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a part beside or above the importer's own, as text."""
    wrong = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = part_of(module), part_of(target)
            if mine != theirs and rank_of(theirs) >= rank_of(mine):
                wrong.append(f"{module} ({mine}) imports {target} ({theirs})")
    return wrong


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path (first module repeated at the end), or None."""
    state: dict[str, str] = {}  # "open" while on the DFS stack, "done" after
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_architecture_graph_sees_every_package_and_real_edges():
    graph = import_graph()
    assert {"bus.api", "bus.channels.engine", "bus.pump.threads", "bus.cli",
            "workers.cli", "blobs.store", "bus.migrations"} <= set(graph)
    assert graph["bus.storage.migration_files"] == {"bus.migrations"}
    assert "bus.channels.store" in graph["bus.channels.engine"]
    assert "bus.api" in graph["bus.pump.pump"]


def test_architecture_no_import_cycle():
    assert find_cycle(import_graph()) is None


def test_architecture_find_cycle_reports_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_architecture_lower_part_never_imports_a_higher_or_sibling_part():
    assert wrong_way(import_graph()) == []


def test_architecture_wrong_way_names_the_cycles_it_forbids():
    """The edges that once made cycles between packages are each reported."""
    graph = {"bus.mcpserver.session": {"workers.lifecycle"}, "blobs.store": {"bus.storage.errors"},
             "bus.channels.engine": {"bus.xml.parser", "bus.api"},
             "bus.storage.db": {"bus.pump.pump"},
             "workers.cli": {"bus.cli.context", "bus.api", "blobs.files"}}
    assert wrong_way(graph) == [
        "blobs.store (blobs) imports bus.storage.errors (bus.storage)",
        "bus.channels.engine (bus.channels) imports bus.api (bus.api)",
        "bus.channels.engine (bus.channels) imports bus.xml.parser (bus.xml)",
        "bus.mcpserver.session (bus.mcpserver) imports workers.lifecycle (workers)",
        "bus.storage.db (bus.storage) imports bus.pump.pump (bus.pump)"]


def test_architecture_blobs_imports_nothing_of_ours():
    """The lowest package: bus imports blobs, never the other way round."""
    outside = {f"{module} imports {target}" for module, targets in import_graph().items()
               if part_of(module) == "blobs" for target in targets if part_of(target) != "blobs"}
    assert outside == set()


def test_architecture_nothing_in_bus_imports_workers():
    inside = {f"{module} imports {target}" for module, targets in import_graph().items()
              if module.startswith("bus") for target in targets if target.startswith("workers")}
    assert inside == set()


def test_architecture_parts_are_the_folders():
    assert part_of("bus.migrations") == "bus"
    assert part_of("bus.storage.db") == part_of("bus.storage.errors") == "bus.storage"
    assert part_of("bus.log.messages") == part_of("bus.log.checkpoints") == "bus.log"
    assert part_of("bus.coordination.claims") == "bus.coordination"
    assert part_of("bus.harness.claude_code") == "bus.harness"
    assert part_of("bus.channels") == part_of("bus.channels.topics") == "bus.channels"
    assert part_of("bus.api") == part_of("bus") == "bus.api"
    assert part_of("bus.pump.threads") == "bus.pump"
    assert part_of("bus.views.status") == part_of("bus.views") == "bus.views"
    assert part_of("bus.cli.context") == part_of("bus.cli.agents") == "bus.cli"
    assert part_of("workers.cli") == part_of("workers.lifecycle") == part_of("workers") == "workers"
    assert part_of("blobs") == part_of("blobs.store") == part_of("blobs.errors") == "blobs"
    assert part_of("bus.mcpserver") == part_of("bus.mcpserver.server") == "bus.mcpserver"
    assert part_of("bus.history") == part_of("bus.history.job") == "bus.history"
    assert rank_of("blobs") < rank_of("bus") < rank_of("bus.storage") < rank_of("bus.log")
    assert rank_of("bus.log") < rank_of("bus.coordination") < rank_of("bus.channels")
    assert rank_of("bus.channels") == rank_of("bus.xml") == rank_of("bus.history")
    assert rank_of("bus.api") < rank_of("bus.harness") < rank_of("bus.pump")
    assert rank_of("bus.xml") < rank_of("bus.api") < rank_of("bus.pump") < rank_of("bus.views")
    assert rank_of("bus.pump") == rank_of("bus.replica") == rank_of("bus.mirror")
    assert rank_of("bus.views") < rank_of("bus.mcpserver") < rank_of("bus.cli") < rank_of("workers")


def dataclasses_by_name() -> dict[str, list[str]]:
    """Each dataclass name in the library -> the modules that define a dataclass by it."""
    found: dict[str, list[str]] = {}
    for module in module_files():
        for node in syntax_tree(module).body:
            if isinstance(node, ast.ClassDef) and any(
                    "dataclass" in ast.unparse(decorator) for decorator in node.decorator_list):
                found.setdefault(node.name, []).append(module)
    return found


def test_architecture_each_read_model_is_defined_once():
    """A read model (a dataclass) is defined once: the part that owns the data defines it
    and every reader composes it, and two different things get names that tell them apart."""
    twice = {name: modules for name, modules in dataclasses_by_name().items()
             if len(modules) > 1}
    assert twice == {}
    assert "ChannelSummary" in dataclasses_by_name()  # the walk sees the library's dataclasses


def test_architecture_click_only_in_the_cli_modules():
    """click is imported only by a module named cli or inside a cli folder."""
    outside = []
    for name in module_files():
        tree = syntax_tree(name)
        uses_click = any(n == "click" or n.startswith("click.") for n in imported_names(tree))
        if uses_click and "cli" not in name.split("."):
            outside.append(name)
    assert outside == []


# The parts that hold a connection: storage opens it, the log writes and reads through it,
# and the facade (`bus/api.py`) keeps one per thread and hands it out through its doors.
CONNECTION_OWNERS = ("bus.storage", "bus.log", "bus.api")
# The log's inserts: every other part writes a message through `messages.append`.
LOG_INSERTS = {"_insert_row", "_insert_rows", "insert_row", "insert_rows"}


def reaches_around_the_doors(source: str, filename: str) -> list[str]:
    """`file:line` of each connection taken past the bus's doors (`.conn` read on anything
    but `self`: `bus.conn`, `self.bus.conn`, `batch.conn`) and of each use of the log's
    inserts (imported, called or named)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Attribute) and node.attr == "conn" \
                and isinstance(node.ctx, ast.Load) \
                and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Attribute) and node.attr in LOG_INSERTS \
                or isinstance(node, ast.Name) and node.id in LOG_INSERTS:
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, (ast.ImportFrom, ast.Import)):
            found.extend((node.lineno, f"import {alias.name}") for alias in node.names
                         if alias.name.rpartition(".")[2] in LOG_INSERTS)
    return [f"{filename}:{line}: {what}" for line, what in sorted(found)]


def test_architecture_parts_reach_the_connection_only_through_the_doors():
    """Outside storage, the log and the facade (in `bus` and in the packages built on
    it), a part takes its connection from `bus.read()` or `bus.write()` (an object that
    lives for one transaction is handed it, as `self.conn`) and writes a message through
    `messages.append` only."""
    outside = []
    for name, path in sorted(module_files().items()):
        if part_of(name) not in CONNECTION_OWNERS:  # the workers and the blobs too
            outside.extend(reaches_around_the_doors(path.read_text(),
                                                    str(path.relative_to(ROOT))))
    assert outside == []


def test_architecture_the_door_check_names_what_goes_around_it():
    """The check above fails on each way around the doors, and passes what goes through."""
    around = (
        "def f(bus, batch, self):\n"
        "    bus.conn.execute('SELECT 1')\n"
        "    batch.conn\n"
        "    self.bus.conn\n"
        "    self._bus.conn\n"
        "    messages._insert_row(c, r, 1)\n"
        "from bus.log.messages import _insert_rows\n"
    )
    assert [hit.split(": ")[0] for hit in reaches_around_the_doors(around, "part.py")] == [
        "part.py:2", "part.py:3", "part.py:4", "part.py:5", "part.py:6", "part.py:7"]
    through = (
        "class Batch:\n"
        "    def __init__(self, conn):\n"
        "        self.conn = conn\n"
        "    def read(self, bus):\n"
        "        with bus.read() as conn:\n"
        "            return self.conn.execute('SELECT 1'), conn\n"
        "messages.append(conn, rows, payloads)\n"
    )
    assert reaches_around_the_doors(through, "part.py") == []


# What `Bus` itself offers: the log. Every other part is a facade reached from it.
BUS_LOG = {
    # the file
    "open", "close", "conn", "read", "write", "path", "durability", "durable", "blobs", "payloads",
    "blob_threshold", "max_payload_bytes", "schema_version",
    # writing and reading the log
    "publish", "publish_many", "poll", "reply_to", "answer", "recipient_warning",
    "list_messages", "message_for", "last_messages", "last_seq", "message_count",
    # cursors and acks
    "ack", "ack_if_next", "cursor", "set_cursor", "delete_cursor", "list_cursors",
    "start_at_latest",
    # delivery receipts
    "record_delivered", "receipt",
    # waiting for a commit
    "wait_for", "wait_for_change",
    # search, export, retention
    "search", "enable_search", "disable_search", "export_jsonl", "export_path",
    "export_partition_by", "exporter", "compact", "gc_blobs",
}
BUS_FACADES = {"channels", "tasks", "claims", "reservations", "heartbeats", "tokens"}


def public_names(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_architecture_bus_keeps_the_log_and_reaches_each_part_through_a_facade(bus):
    """One door per part: a method of tasks, claims, reservations, heartbeats or tokens
    flattened onto `Bus` again fails here; it belongs on the part's facade."""
    assert public_names(bus) == BUS_LOG | BUS_FACADES
    assert public_names(type(bus)) <= BUS_LOG | BUS_FACADES  # the instance adds only state


def test_architecture_each_facade_is_one_object_per_bus(bus, db_path):
    """A facade is made once per Bus and shared by its threads (each call takes the calling
    thread's connection), as `bus.channels` is."""
    from_another_thread = {}
    worker = threading.Thread(target=lambda: from_another_thread.update(
        {name: getattr(bus, name) for name in BUS_FACADES}))
    worker.start()
    worker.join()
    with Bus.open(db_path) as other:
        for name in sorted(BUS_FACADES):
            facade = getattr(bus, name)
            assert facade is getattr(bus, name) is from_another_thread[name], name
            assert getattr(other, name) is not facade, name  # another Bus, another facade
            assert type(facade).__module__.rpartition(".")[0] in {
                "bus.coordination", "bus.channels"}, name


def copy_sources(dest: Path) -> Path:
    """What a wheel is built from, copied so the build writes nothing into the repo."""
    keep = ("bus", "workers", "blobs", "migrations", "setup.cfg", "pyproject.toml", "README.md")
    for name in keep:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.slow
def test_architecture_wheel_installs_every_package(tmp_path):
    """A non-editable install (a wheel in a fresh venv) imports every part and runs `bus`."""
    source = copy_sources(tmp_path / "src")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "-w", str(wheels), str(source)], check=True, cwd=tmp_path)
    fresh = tmp_path / "fresh"
    venv.create(fresh, with_pip=True)
    python = fresh / "bin" / "python"
    wheel = next(wheels.glob("agentbus-*.whl"))
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    str(wheel)], check=True, cwd=tmp_path)
    # The dependencies come from the test's own environment, appended after the
    # fresh site-packages: a plain path line, so the editable install's finder
    # there is never loaded and `bus` can only come from the wheel.
    deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and p.is_dir())
    fresh_site = next((fresh / "lib").glob("python*/site-packages"))
    (fresh_site / "zz_test_dependencies.pth").write_text(f"{deps}\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    check = ("import bus, bus.channels, bus.history, bus.pump, bus.views, bus.xml, bus.mcpserver,"
             " workers, blobs,"
             " bus.migrations;"
             "from bus import Bus; print(bus.__file__)")
    shown = subprocess.run([str(python), "-c", check], capture_output=True, text=True,
                           cwd=tmp_path, env=env, check=True)
    assert shown.stdout.strip().startswith(str(fresh_site))
    # The migrations are found in the one place, the installed bus.migrations package.
    found = subprocess.run([str(python), "-c", "from bus.storage import migration_files as m;"
                            " print(m.MIGRATIONS_DIR); print(m.supported_version())"],
                           capture_output=True, text=True, cwd=tmp_path, env=env, check=True)
    count = len(list((ROOT / "migrations").glob("*.sql")))
    assert found.stdout == f"{(fresh_site / 'bus' / 'migrations').resolve()}\n{count}\n"
    # The web page's own files ship in the wheel (bus serve works offline).
    assert (fresh_site / "bus" / "views" / "static" / "index.html").is_file()
    assert (fresh_site / "bus" / "views" / "static" / "app.js").is_file()
    helped = subprocess.run([str(fresh / "bin" / "bus"), "--help"], capture_output=True,
                            text=True, cwd=tmp_path, env=env)
    assert helped.returncode == 0, helped.stderr
    assert "channel" in helped.stdout and "pump" in helped.stdout
    created = subprocess.run([str(fresh / "bin" / "bus"), "--db", str(tmp_path / "b.db"), "init"],
                             capture_output=True, text=True, cwd=tmp_path, env=env)
    assert created.returncode == 0, created.stderr  # migrations and the XSD are in the wheel
    # The worker tools reach `bus mcp` through the wheel's entry point, not an import in bus.
    listed = subprocess.run([str(fresh / "bin" / "bus"), "--db", str(tmp_path / "b.db"), "mcp",
                             "--agent", "w1", "--tools", "workers,pump", "--list", "--json"],
                            capture_output=True, text=True, cwd=tmp_path, env=env)
    assert listed.returncode == 0, listed.stderr
    assert {"worker_start", "pump_send_and_wait"} <= {t["name"] for t in
                                                        orjson.loads(listed.stdout)["tools"]}
    # The history job ships too: spark-submit is given the installed file.
    located = subprocess.run([str(fresh / "bin" / "bus"), "history", "--job-path"],
                             capture_output=True, text=True, cwd=tmp_path, env=env)
    assert located.returncode == 0, located.stderr
    assert located.stdout == f"{fresh_site / 'bus' / 'history' / 'job.py'}\n"
    assert (fresh_site / "bus" / "history" / "charts.py").is_file()


def test_architecture_errors_live_with_their_part_and_bus_errors_still_exports_them():
    """bus.storage.errors keeps the old import path of the errors that moved up, without importing up."""
    import bus.storage.errors
    for module, names in bus.storage.errors.RAISED_ABOVE.items():
        assert rank_of(part_of("bus.storage.errors")) < rank_of(part_of(module)) < rank_of("workers")
        for name in names:
            error = getattr(bus.storage.errors, name)
            assert error.__module__ == module and issubclass(error, bus.storage.errors.BusError), name
            assert name in dir(bus.storage.errors)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchError'"):
        bus.storage.errors.NoSuchError  # noqa: B018 - the lookup is the test
    # A fresh process: the pump's errors load only when someone asks for one.
    loaded = ("import sys; from bus.storage.errors import BusError; print('bus.pump' in sys.modules);"
              " from bus.storage.errors import ThreadNotFound; print(ThreadNotFound.__module__)")
    shown = subprocess.run([sys.executable, "-c", loaded], capture_output=True, text=True,
                           check=True, cwd=ROOT)
    assert shown.stdout == "False\nbus.pump.errors\n"


# The tests mirror the rooms: a folder per part under tests/, named as the part (the MCP
# server's tests are tests/mcp, the replica's and the mirror's tests/replication), the
# helpers in tests/support/, and beside them only the journeys (the built wheel, end to
# end) and the project's own checks (the docs, the extras). This file stays at the top:
# it checks the layout of everything, tests/ included.
TESTS = ROOT / "tests"
TEST_FOLDER_OF = {"bus.mcpserver": "mcp", "bus.replica": "replication", "bus.mirror": "replication"}
OTHER_TEST_FOLDERS = {"journeys", "project", "support"}
TOP_TESTS = {"test_architecture.py"}
NOT_PYTHON = {"clients", "data"}  # the real clients' npm pins, the XML corpus


def folders_of_tests() -> set[str]:
    """tests/'s folders of Python modules (not the npm pins or the data)."""
    return {path.name for path in TESTS.iterdir()
            if path.is_dir() and path.name not in NOT_PYTHON | {"__pycache__"}}


def python_files_of_tests() -> list[Path]:
    return [path for path in TESTS.rglob("*.py")
            if path.relative_to(TESTS).parts[0] not in NOT_PYTHON]


def test_architecture_every_part_has_its_test_folder():
    parts = {part_of(module) for module in module_files()} - {"bus", "bus.api"}
    expected = {TEST_FOLDER_OF.get(part, part.rpartition(".")[2]) for part in parts}
    assert expected - folders_of_tests() == set()
    assert folders_of_tests() - expected - OTHER_TEST_FOLDERS == set()


def test_architecture_every_test_file_lives_in_a_parts_folder():
    misplaced = [str(path.relative_to(ROOT)) for path in python_files_of_tests()
                 if path.name.startswith("test_") and path.parent == TESTS
                 and path.name not in TOP_TESTS]
    assert misplaced == []
    in_support = [str(path.relative_to(ROOT)) for path in (TESTS / "support").glob("test_*.py")]
    assert in_support == []


def test_architecture_every_helper_lives_in_support():
    """A module that is not a test, a conftest or a package marker is a helper: tests/support/."""
    helpers = [path for path in python_files_of_tests()
               if not path.name.startswith("test_")
               and path.name not in ("conftest.py", "__init__.py")]
    outside = [str(path.relative_to(ROOT)) for path in helpers if path.parent != TESTS / "support"]
    assert outside == []
    assert len(helpers) > 20  # the walk sees the helpers


def test_architecture_test_folders_are_packages():
    """tests/ and each folder are packages, so a module is tests.<part>.<name> however it
    is imported; a bare tests/xml or tests/mcp on sys.path would hide the stdlib's xml and
    the SDK's mcp."""
    missing = [folder for folder in {".", *folders_of_tests()}
               if not (TESTS / folder / "__init__.py").is_file()]
    assert missing == []
