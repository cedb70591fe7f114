"""organism.yaml (bus/pump/organism.py): a good file, then one test per kind of error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from bus.storage.errors import OrganismInvalid
from bus.pump import organism as org
from bus.pump.organism import AgentSpec
from bus.pump.organism import ListenerSpec
from bus.pump.organism import MetaSpec
from bus.pump.organism import OobSpec

GOOD = """\
name: demo-org
listeners:
  - name: calc.add
    root_tag: add
    payload: demo_tools:Add
    handler: demo_tools:add
    namespace: https://example.org/ns/calc/v1
    description: Add two numbers.
    timeout: 2.5
    concurrency: 4
    max_attempts: 3
  - name: researcher
    capability: llm.researcher
    root_tag: research-query
    payload: demo_tools:Query
    handler: demo_tools:Agent.research
    peers: [calc.add, websearch]
  - name: websearch
    root_tag: search
    payload: demo_tools:Query
    handler: demo_tools:search
agents:
  - name: researcher
    type: llm
    model: claude-sonnet-4
    system_prompt: You are a research assistant.
    visible_tools: [calc.add]
meta:
  allow_list_capabilities: all
oob:
  authorized_keys: [keys/admin.pub]
  socket: ctl.sock
  window_s: 30
"""

TOOLS = """\
from dataclasses import dataclass

@dataclass
class Add:
    a: float
    b: float

@dataclass
class Query:
    text: str

async def add(msg, ctx):
    return None

def search(msg, ctx):
    return None

class Agent:
    @staticmethod
    async def research(msg, ctx):
        return None

NOT_CALLABLE = 3
"""


@pytest.fixture
def organism_dir(tmp_path: Path) -> Path:
    """A directory with organism.yaml and the module its references name.

    The module name is unique per test so that imports from earlier tests'
    directories (cached in sys.modules) cannot stand in for this one.
    """
    module = f"demo_tools_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(TOOLS)
    (tmp_path / "organism.yaml").write_text(GOOD.replace("demo_tools", module))
    return tmp_path


def parse(text: str) -> org.Organism:
    return org.parse_organism(textwrap.dedent(text), "o.yaml")


def refused(text: str) -> OrganismInvalid:
    with pytest.raises(OrganismInvalid) as info:
        parse(text)
    assert info.value.source == "o.yaml"
    assert str(info.value) == f"o.yaml: {info.value.field}: {info.value.reason}"
    return info.value


def listener(**fields: object) -> str:
    """One listener entry as YAML flow text, good unless `fields` say otherwise."""
    entry = {"name": "calc", "root_tag": "add", "payload": "m:Add", "handler": "m:add"}
    entry.update(fields)
    items = ", ".join(f"{k}: {v}" for k, v in entry.items() if v is not None)
    return "{" + items + "}"


def listeners(*entries: str) -> str:
    return "listeners:\n" + "".join(f"  - {e}\n" for e in entries)


# --- a good file --------------------------------------------------------------------


def test_load_organism_reads_every_field(organism_dir):
    loaded = org.load_organism(organism_dir / "organism.yaml")
    module = next(p.stem for p in organism_dir.glob("demo_tools_*.py"))
    assert loaded.name == "demo-org"
    assert loaded.listeners[0] == ListenerSpec(
        name="calc.add", root_tag="add", payload=f"{module}:Add", handler=f"{module}:add",
        namespace="https://example.org/ns/calc/v1", description="Add two numbers.",
        timeout_s=2.5, concurrency=4, max_attempts=3)
    assert loaded.listeners[1].peers == ("calc.add", "websearch")
    assert loaded.listeners[1].capability == "llm.researcher"
    assert (loaded.listeners[2].timeout_s, loaded.listeners[2].concurrency,
            loaded.listeners[2].max_attempts) == (300.0, 1, 5)
    assert loaded.agents == (AgentSpec("researcher", "llm", "claude-sonnet-4",
                                       "You are a research assistant.", ("calc.add",)),)
    assert loaded.meta == MetaSpec(allow_list_capabilities="all", allow_schema_requests="admin")
    assert loaded.oob == OobSpec((organism_dir / "keys/admin.pub",), "ctl.sock", 30.0)
    assert (loaded.source, loaded.base_dir) == (str(organism_dir / "organism.yaml"),
                                                organism_dir)


def test_organism_routes_and_listener_lookup(organism_dir):
    loaded = org.load_organism(organism_dir / "organism.yaml")
    assert loaded.routes == {"add": ("calc.add",), "research-query": ("researcher",),
                             "search": ("websearch",)}
    assert loaded.listener("calc.add").root_tag == "add"
    assert loaded.listener("calc") is None


def test_check_references_imports_handlers_and_payloads(organism_dir):
    loaded = org.load_organism(organism_dir / "organism.yaml")
    org.check_references(loaded)
    handler = org.resolve_handler(loaded.listeners[1], loaded)
    assert handler.__qualname__ == "Agent.research"
    assert org.resolve_payload(loaded.listeners[0], loaded).__name__ == "Add"


def test_minimal_file_takes_defaults_and_the_file_name(tmp_path):
    path = tmp_path / "tiny-org.yaml"
    path.write_text(listeners(listener()))
    loaded = org.load_organism(path)
    assert loaded.name == "tiny-org"
    assert (loaded.agents, loaded.meta, loaded.oob) == ((), MetaSpec(), OobSpec())


def test_seed_spelling_tools_means_peers():
    loaded = parse(listeners(listener(name="a", tools="[b]"), listener(name="b")))
    assert loaded.listeners[0].peers == ("b",)


def test_listeners_may_share_a_root_tag_for_broadcast():
    loaded = parse(listeners(listener(name="google", root_tag="search", namespace="urn:s"),
                             listener(name="bing", root_tag="search", namespace="urn:s")))
    assert loaded.routes == {"search": ("google", "bing")}


def test_with_and_without_listener_are_checked():
    loaded = parse(listeners(listener(name="a", peers="[b]"), listener(name="b")))
    added = loaded.with_listener(org.parse_listener({"name": "c", "root_tag": "sub",
                                                     "payload": "m:S", "handler": "m:s"}))
    assert [s.name for s in added.listeners] == ["a", "b", "c"]
    assert [s.name for s in added.without_listener("a").listeners] == ["b", "c"]
    with pytest.raises(OrganismInvalid) as info:
        added.without_listener("b")  # a still names b as a peer
    assert info.value.field == "listeners[0].peers[0]"
    with pytest.raises(OrganismInvalid) as info:
        added.with_listener(added.listeners[0])
    assert info.value.field == "listeners[3].name"
    with pytest.raises(OrganismInvalid) as info:
        added.without_listener("zz")
    assert "no listener is named 'zz'" in info.value.reason


def test_parse_listener_names_the_request_fields():
    with pytest.raises(OrganismInvalid) as info:
        org.parse_listener({"name": "x", "root_tag": "t", "payload": "m:P"}, "oob", "args")
    assert (info.value.source, info.value.field) == ("oob", "args.handler")


# --- one test per kind of error -------------------------------------------------------------


@pytest.mark.parametrize("text, field, fragment", [
    ("", "(top level)", "the file is empty"),
    ("- a\n- b\n", "(top level)", "must be a mapping of keys, got a list"),
    ("listeners: [\n", "line 2, column 1", "not valid YAML"),
    ("listeners: []\nlisteners: []\n", "line 2, column 1", "duplicate key 'listeners'"),
    ("!!python/object:os.system {}\n", "line 1, column 1", "not valid YAML"),
    ("name: org\n", "listeners", "is required"),
    ("listeners: {a: 1}\n", "listeners", "must be a list, got a dict"),
    ("listeners: []\n", "listeners", "at least one listener"),
    ("listeners: [7]\n", "listeners[0]", "must be a mapping of keys, got an int (7)"),
    (listeners(listener()) + "colour: red\n", "colour", "unknown key; accepted keys: name,"),
    (listeners(listener()) + "name: my org\n", "name", "'my org' is not a name"),
])
def test_file_level_errors(text, field, fragment):
    error = refused(text)
    assert error.field == field
    assert fragment in error.reason


def test_default_name_must_be_a_name_too(tmp_path):
    path = tmp_path / "my organism.yaml"
    path.write_text(listeners(listener()))
    with pytest.raises(OrganismInvalid) as info:
        org.load_organism(path)
    assert info.value.field == "name"
    assert "the default (file name) 'my organism'" in info.value.reason


def test_missing_file_is_named(tmp_path):
    with pytest.raises(OrganismInvalid) as info:
        org.load_organism(tmp_path / "nope.yaml")
    assert info.value.field == "(file)"
    assert "cannot be read" in info.value.reason


def test_file_that_is_not_utf8_is_refused(tmp_path):
    path = tmp_path / "organism.yaml"
    path.write_bytes(b"listeners: [\xff]\n")
    with pytest.raises(OrganismInvalid) as info:
        org.load_organism(path)
    assert info.value.field == "(file)"


@pytest.mark.parametrize("fields, field, fragment", [
    ({"name": None}, "listeners[0].name", "is required"),
    ({"name": "'a b'"}, "listeners[0].name", "'a b' is not a name"),
    ({"name": "calc/add"}, "listeners[0].name", "is not a name"),
    ({"name": ".hidden"}, "listeners[0].name", "not starting with . or -"),
    ({"root_tag": None}, "listeners[0].root_tag", "is required"),
    ({"root_tag": "'a:b'"}, "listeners[0].root_tag", "is not an XML element name"),
    ({"root_tag": "1st"}, "listeners[0].root_tag", "is not an XML element name"),
    ({"root_tag": "xml-thing"}, "listeners[0].root_tag", "not starting with 'xml'"),
    ({"root_tag": "add-listener"}, "listeners[0].root_tag", "is reserved"),
    ({"root_tag": "hot-reload"}, "listeners[0].root_tag", "is reserved"),
    ({"root_tag": "huh"}, "listeners[0].root_tag", "is reserved"),
    ({"handler": None}, "listeners[0].handler", "is required"),
    ({"handler": "m.add"}, "listeners[0].handler", "is not a reference like 'module:function'"),
    ({"handler": "'m:'"}, "listeners[0].handler", "is not a reference"),
    ({"handler": "'1m:f'"}, "listeners[0].handler", "is not a reference"),
    ({"payload": "Add"}, "listeners[0].payload", "is not a reference like 'module:Class'"),
    ({"hanlder": "m:add"}, "listeners[0].hanlder", "unknown key; accepted keys: name, root_tag,"
     " payload, handler, namespace, description, capability, peers, tools, timeout,"),
    ({"namespace": "[]"}, "listeners[0].namespace", "must be a non-empty string"),
    ({"peers": "calc"}, "listeners[0].peers", "must be a list"),
    ({"peers": "['a b']"}, "listeners[0].peers[0]", "is not a listener name"),
    ({"peers": "[calc, ghost]"}, "listeners[0].peers[1]", "no listener is named 'ghost'"),
    ({"peers": "[calc]", "tools": "[calc]"}, "listeners[0].tools", "not both"),
    ({"timeout": 0}, "listeners[0].timeout", "must be a number of seconds > 0"),
    ({"timeout": -1}, "listeners[0].timeout", "> 0"),
    ({"timeout": ".inf"}, "listeners[0].timeout", "> 0"),
    ({"timeout": ".nan"}, "listeners[0].timeout", "> 0"),
    ({"timeout": "true"}, "listeners[0].timeout", "got True"),
    ({"timeout": "'10'"}, "listeners[0].timeout", "got '10'"),
    ({"timeout": 100000}, "listeners[0].timeout", "<= 86400"),
    ({"concurrency": 0}, "listeners[0].concurrency", "an integer from 1 to 1024"),
    ({"concurrency": 1.5}, "listeners[0].concurrency", "got 1.5"),
    ({"concurrency": 2000}, "listeners[0].concurrency", "from 1 to 1024"),
    ({"max_attempts": 0}, "listeners[0].max_attempts", "an integer from 1"),
])
def test_listener_errors(fields, field, fragment):
    error = refused(listeners(listener(**fields)))
    assert error.field == field
    assert fragment in error.reason


def test_duplicate_listener_names_name_the_second():
    error = refused(listeners(listener(), listener(root_tag="sub")))
    assert error.field == "listeners[1].name"
    assert "'calc' is also the name of listeners[0]; names must be unique" in error.reason


def test_shared_root_tag_needs_one_namespace():
    error = refused(listeners(listener(name="a", namespace="urn:x"),
                              listener(name="b", namespace="urn:y")))
    assert error.field == "listeners[1].namespace"
    assert "give them the same namespace" in error.reason


@pytest.mark.parametrize("agent, field, fragment", [
    ("{name: ghost, type: llm}", "agents[0].name", "no listener is named 'ghost'"),
    ("{name: calc}", "agents[0].type", "is required"),
    ("{name: calc, type: llm, visible_tools: [calc]}", "agents[0].visible_tools[0]",
     "is not among the peers of listeners[0] (none)"),
    ("{name: calc, type: llm, temperature: 2}", "agents[0].temperature", "unknown key"),
    ("{name: calc, type: llm, visible_tools: calc}", "agents[0].visible_tools",
     "must be a list"),
])
def test_agent_errors(agent, field, fragment):
    error = refused(listeners(listener()) + f"agents:\n  - {agent}\n")
    assert error.field == field
    assert fragment in error.reason


def test_duplicate_agents_are_refused():
    error = refused(listeners(listener()) + "agents: [{name: calc, type: llm}, "
                                            "{name: calc, type: llm}]\n")
    assert error.field == "agents[1].name"


@pytest.mark.parametrize("section, field, fragment", [
    ("meta: {allow_schema_requests: root}", "meta.allow_schema_requests",
     "'root' is not one of: admin, all, none"),
    ("meta: [admin]", "meta", "must be a mapping"),
    ("oob: {authorized_keys: [7]}", "oob.authorized_keys[0]", "the path of a public key file"),
    ("oob: {authorized_keys: key.pub}", "oob.authorized_keys", "must be a list"),
    ("oob: {window_s: 7200}", "oob.window_s", "<= 3600"),
    ("oob: {socket: ''}", "oob.socket", "must be a non-empty string"),
    ("oob: {port: 9000}", "oob.port", "unknown key; accepted keys: authorized_keys, socket,"),
])
def test_meta_and_oob_errors(section, field, fragment):
    error = refused(listeners(listener()) + section + "\n")
    assert error.field == field
    assert fragment in error.reason


# --- references (imported by check_references only) --------------------------------------


@pytest.mark.parametrize("handler, payload, field, fragment", [
    ("no_such_module_xyz:f", "{m}:Add", "listeners[0].handler", "module 'no_such_module_xyz' "
     "not found"),
    ("{m}:missing", "{m}:Add", "listeners[0].handler", "has no attribute 'missing'"),
    ("{m}:NOT_CALLABLE", "{m}:Add", "listeners[0].handler", "is an int, not a function"),
    ("{m}:add", "{m}:add", "listeners[0].payload", "is a function, not a class"),
    ("{m}:add", "{m}:Missing.x", "listeners[0].payload", "has no attribute 'Missing.x'"),
    ("{broken}:f", "{m}:Add", "listeners[0].handler", "failed: ZeroDivisionError"),
])
def test_check_references_errors(tmp_path, handler, payload, field, fragment):
    module = f"refs_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{module}.py").write_text(TOOLS)
    (tmp_path / f"{module}_broken.py").write_text("1 / 0\n")
    path = tmp_path / "organism.yaml"
    fill = {"m": module, "broken": f"{module}_broken"}
    path.write_text(listeners(listener(handler=handler.format(**fill),
                                       payload=payload.format(**fill))))
    loaded = org.load_organism(path)  # loading imports nothing
    with pytest.raises(OrganismInvalid) as info:
        org.check_references(loaded)
    assert info.value.field == field
    assert fragment in info.value.reason
