"""hot-reload takes new listener code: a real `bus pump run` process, its handler
module written beside organism.yaml, edited on disk, then a signed hot-reload over
the OOB socket (seed 000).

A module is imported again only when its source changed; one that fails to import
again changes nothing, and the pump goes on with the code it had.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from bus import Bus
from bus.storage.errors import OrganismInvalid
from bus.pump import client
from bus.pump import oob
from bus.pump.oob import OobRequest
from bus.pump.organism import load_organism
from bus.pump.routing import RoutingTable

pytestmark = pytest.mark.slow

# Each module notes its imports in imports.log beside it, so a test can count them.
CALC = '''\
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bus.pump import Context
from bus.pump import Reply
from bus.xml import xmlify

with open(Path(__file__).with_name("imports.log"), "a") as log:
    log.write(__name__ + "\\n")


@xmlify(root="add")
@dataclass
class Add:
    """Add two numbers."""

    a: float
    b: float


@xmlify(root="mul")
@dataclass
class Mul:
    """Multiply two numbers."""

    a: float
    b: float


@xmlify(root="sum")
@dataclass
class Sum:
    value: float


def add(msg: Add, ctx: Context) -> Reply:
    return Reply(Sum(msg.a + msg.b))


def mul(msg: Mul, ctx: Context) -> Reply:
    return Reply(Sum(msg.a * msg.b))
'''
ADD_100 = CALC.replace("Sum(msg.a + msg.b)", "Sum(msg.a + msg.b + 100)").replace(
    "Sum(msg.a * msg.b)", "Sum(msg.a * msg.b * 10)")
ECHO = '''\
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bus.pump import Reply
from bus.xml import xmlify

with open(Path(__file__).with_name("imports.log"), "a") as log:
    log.write(__name__ + "\\n")


@xmlify(root="echo")
@dataclass
class Echo:
    text: str


def echo(msg: Echo, ctx: object) -> Reply:
    return Reply(Echo(msg.text))
'''
ORGANISM = """\
name: org
listeners:
  - name: calc.add
    root_tag: add
    payload: {calc}:Add
    handler: {calc}:add
  - name: calc.mul          # the same module as calc.add
    root_tag: mul
    payload: {calc}:Mul
    handler: {calc}:mul
  - name: echo
    root_tag: echo
    payload: {echo}:Echo
    handler: {echo}:echo
oob:
  authorized_keys: [keys/oob_ed25519.pub]
"""


class Organism:
    """Its files in a directory: organism.yaml, the calc and echo modules."""

    def __init__(self, directory: Path, calc: str = "reload_calc",
                 echo: str = "reload_echo") -> None:
        self.directory, self.calc, self.echo = directory, calc, echo
        self.path = directory / "organism.yaml"
        self.path.write_text(ORGANISM.format(calc=calc, echo=echo))
        self.write_calc(CALC)
        (directory / f"{echo}.py").write_text(ECHO)
        self.keys = oob.generate_keys(directory / "keys")

    def write_calc(self, code: str) -> None:
        (self.directory / f"{self.calc}.py").write_text(code)

    def imports(self) -> list[str]:
        return (self.directory / "imports.log").read_text().splitlines()


@pytest.fixture
def organism(tmp_path: Path) -> Organism:
    return Organism(tmp_path)


@pytest.fixture
def pump_process(organism: Organism, db_path: Path, python_env, tmp_path: Path):
    """`bus pump run` serving the organism and its OOB socket; `control(command)` signs
    and sends an OOB request to it."""
    Bus.open(db_path).close()
    stderr = tmp_path / "pump.stderr"
    with open(stderr, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "bus.cli", "--db", str(db_path), "pump",
                                 "run", str(organism.path)], env=python_env,
                                stdout=subprocess.DEVNULL, stderr=err)
    socket_path = oob.socket_path_for(db_path)
    deadline = time.monotonic() + 60
    while not socket_path.exists():
        assert proc.poll() is None, f"the pump exited: {stderr.read_text()}"
        assert time.monotonic() < deadline, "the pump never opened its OOB socket"
        time.sleep(0.02)
    key = oob.load_private_key(organism.keys.private_path)
    yield lambda command: oob.send_request(socket_path, key, command, {})
    proc.terminate()
    try:
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr.read_text()


def answer(bus: Bus, xml: str) -> str:
    """The payload of the one reply to a request `xml` of a new conversation."""
    sent = client.send(bus, "org", xml)
    got = client.wait_replies(bus, sent, timeout=60)
    assert len(got) == 1, f"no reply to {xml} within 60 s"
    return got[0].payload_xml


def test_a_handler_edited_on_disk_and_hot_reloaded_answers_with_the_new_code(
        bus, organism, pump_process):
    control = pump_process
    assert answer(bus, "<add><a>5</a><b>2</b></add>") == "<sum><value>7.0</value></sum>"
    organism.write_calc(ADD_100)
    reloaded = control("hot-reload")
    assert reloaded["ok"], reloaded
    assert answer(bus, "<add><a>5</a><b>2</b></add>") == "<sum><value>107.0</value></sum>"
    assert reloaded["result"]["reimported"] == ["reload_calc"]
    # calc.mul shares the module: the same new code, imported once
    assert answer(bus, "<mul><a>5</a><b>2</b></mul>") == "<sum><value>100.0</value></sum>"
    assert answer(bus, "<echo><text>hi</text></echo>") == "<echo><text>hi</text></echo>"
    assert organism.imports() == ["reload_calc", "reload_echo", "reload_calc"]

    unchanged = control("hot-reload")  # nothing edited: nothing imported again
    assert unchanged["ok"] and unchanged["result"]["reimported"] == []
    assert organism.imports() == ["reload_calc", "reload_echo", "reload_calc"]
    assert answer(bus, "<add><a>5</a><b>2</b></add>") == "<sum><value>107.0</value></sum>"


FAILED_AGAIN = ("importing 'reload_calc' again failed: {}",
                "the pump goes on with the code it had: fix the module and send hot-reload again")


@pytest.mark.parametrize("broken, error, fix", [
    (ADD_100.replace("def add(msg: Add, ctx: Context)", "def add(msg: Add, ctx: Context"),
     FAILED_AGAIN[0].format("SyntaxError: "), FAILED_AGAIN[1]),
    (ADD_100 + "\nraise RuntimeError('half-written')\n",
     FAILED_AGAIN[0].format("RuntimeError: half-written"), FAILED_AGAIN[1]),
    (ADD_100 + "\nimport sys\nsys.exit(3)\n", FAILED_AGAIN[0].format("SystemExit: 3"),
     FAILED_AGAIN[1]),
    (None, "the source of 'reload_calc' cannot be read again ([Errno 2]",
     "the pump goes on with the code it had: put the file back and send hot-reload again")])
def test_a_module_that_fails_to_import_again_leaves_the_old_code_running(
        bus, organism, pump_process, broken, error, fix):
    control = pump_process
    if broken is None:
        (organism.directory / "reload_calc.py").unlink()
    else:
        organism.write_calc(broken)
    refused = control("hot-reload")
    assert (refused["ok"], refused["error"]) == (False, "failed")
    assert refused["message"].startswith(f"{organism.path}: listeners[0].handler: {error}")
    assert refused["message"].endswith(fix)
    assert answer(bus, "<add><a>5</a><b>2</b></add>") == "<sum><value>7.0</value></sum>"

    organism.write_calc(ADD_100)
    assert control("hot-reload")["ok"]
    assert answer(bus, "<add><a>5</a><b>2</b></add>") == "<sum><value>107.0</value></sum>"


def test_a_reload_whose_new_code_the_routes_refuse_puts_the_old_module_back(tmp_path):
    """The module imported again, but its payload no longer matches organism.yaml: the
    routes and `sys.modules` stay as they were, so the next hot-reload tries again."""
    name = f"reload_calc_{uuid.uuid4().hex}"  # this process's sys.modules: a name of its own
    organism = Organism(tmp_path, calc=name, echo=f"reload_echo_{uuid.uuid4().hex}")
    try:
        table = RoutingTable(load_organism(organism.path))
        before = sys.modules[name]
        organism.write_calc(ADD_100.replace('@xmlify(root="add")', '@xmlify(root="plus")'))
        with pytest.raises(OrganismInvalid, match=r"listeners\[0\]\.root_tag: is 'add', but "):
            table.dispatch(OobRequest("hot-reload", {}, "n1", 1, "key"))
        assert sys.modules[name] is before
        assert table.routes.listeners["calc.add"].handler is before.add

        organism.write_calc(ADD_100)
        result = table.dispatch(OobRequest("hot-reload", {}, "n2", 1, "key"))
        assert result["reimported"] == [name]
        assert sys.modules[name] is not before
        assert table.routes.listeners["calc.add"].handler is sys.modules[name].add
    finally:
        sys.modules.pop(name, None)
        sys.modules.pop(organism.echo, None)


def test_a_handler_module_imported_again_binds_the_new_payload_classes(tmp_path):
    """Payload modules are imported again before the handler modules that import them."""
    payloads, handlers = (f"reload_{kind}_{uuid.uuid4().hex}" for kind in ("payloads", "tools"))
    (tmp_path / f"{payloads}.py").write_text(CALC)
    handler_code = f"from {payloads} import Add, Sum\n\n\ndef add(msg, ctx):\n    return Sum(0)\n"
    (tmp_path / f"{handlers}.py").write_text(handler_code)
    (tmp_path / "organism.yaml").write_text(
        f"name: org\nlisteners:\n  - name: calc.add\n    root_tag: add\n"
        f"    payload: {payloads}:Add\n    handler: {handlers}:add\n")
    try:
        table = RoutingTable(load_organism(tmp_path / "organism.yaml"))
        (tmp_path / f"{payloads}.py").write_text(ADD_100)
        (tmp_path / f"{handlers}.py").write_text(handler_code + "# edited\n")
        result = table.dispatch(OobRequest("hot-reload", {}, "n1", 1, "key"))
        assert result["reimported"] == [payloads, handlers]
        assert sys.modules[handlers].Sum is sys.modules[payloads].Sum
        assert table.routes.listeners["calc.add"].pipeline.spec.cls is sys.modules[payloads].Add
    finally:
        sys.modules.pop(payloads, None)
        sys.modules.pop(handlers, None)
