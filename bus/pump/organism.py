"""organism.yaml: the listeners, agents and privileges of one organism.

    name: my-org                       # optional; default: the file's stem
    max_pending: 10000                 # requests and units waiting before sends are refused
    listeners:
      - name: calc.add                 # letters, digits, _ . - ('.' is fine)
        root_tag: add                  # the payload's XML root element
        payload: tools.calc:Add        # module:Class, the payload dataclass
        handler: tools.calc:add        # module:function (async or sync)
        namespace: https://example.org/ns/calc/v1
        peers: [websearch]             # listeners it may call (older spelling: tools)
        timeout: 30                    # seconds per handler call (default 300)
        concurrency: 2                 # handler calls at once (default 1)
        max_attempts: 5                # before the input is a dead letter (default 5)
        inline: false                  # a fast plain-def handler: see below
    agents:
      - name: researcher               # the model behind the listener of that name
        type: llm
        model: claude-sonnet-4
        visible_tools: [calc.add]      # what it sees and may call: some of its peers
    meta:
      allow_list_capabilities: admin   # admin, all or none
      allow_schema_requests: admin
    oob:
      authorized_keys: [keys/oob_ed25519.pub]   # relative to this file
      socket: oob.sock                 # relative to the bus file's directory
      window_s: 60

`load_organism(path)` reads it with PyYAML's safe loader (plus a refusal of
duplicate keys, which YAML would otherwise resolve silently) and returns a
frozen `Organism`; every error is an `OrganismInvalid` whose `field` is the
key path (``listeners[2].handler``) and whose message says the fix.
References (`handler`, `payload`) are checked for shape at load time and
imported only by `check_references` (what `bus pump organism check` runs), so
loading never runs handler code.

`inline: true` declares a plain `def` handler fast: the pump runs it on its
database thread, in the transaction that takes the request from the inbox
and writes its replies (no lease, no work unit; see bus/pump/inline.py). Its
`timeout` defaults to INLINE_DEFAULT_TIMEOUT_S and may not exceed
INLINE_TIMEOUT_MAX_S: every other write of the pump waits for it.
"""

from __future__ import annotations

import inspect
import math
import re
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import Any
from typing import Mapping

import yaml

from bus.pump import modules
from bus.pump.errors import OrganismInvalid

NAME_MAX = 128
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
# XML element names without the colon (NCName), ASCII only.
_ROOT_TAG = re.compile(r"[A-Za-z_][A-Za-z0-9._-]*")
_REFERENCE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# Privileged commands travel on the OOB channel only: no listener may take
# their root tags, so one leaked onto the main path routes nowhere.
PRIVILEGED_ROOT_TAGS = frozenset({"add-listener", "remove-listener", "hot-reload"})
SYSTEM_ROOT_TAGS = frozenset({"huh"})  # the pump's own error replies
# The organism's questions about itself, answered by the pump (bus/pump/meta.py).
LIST_CAPABILITIES = "list-capabilities"
SCHEMA_REQUEST = "schema-request"
META_ROOT_TAGS = frozenset({LIST_CAPABILITIES, SCHEMA_REQUEST})
_RESERVED_ROOT_TAGS = PRIVILEGED_ROOT_TAGS | SYSTEM_ROOT_TAGS | META_ROOT_TAGS
PRIVILEGE_LEVELS = ("admin", "all", "none")
DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_MAX_S = 86_400.0
DEFAULT_CONCURRENCY = 1
CONCURRENCY_MAX = 1024
DEFAULT_MAX_ATTEMPTS = 5
# Backpressure: a client's send is refused (Backpressure, exit 75) while this many
# inbox rows and pending units wait. Counting them costs up to this many index
# entries per send, so the ceiling stays moderate.
DEFAULT_MAX_PENDING = 10_000
MAX_PENDING_MAX = 1_000_000
INLINE_DEFAULT_TIMEOUT_S = 0.5
INLINE_TIMEOUT_MAX_S = 5.0
DEFAULT_WINDOW_S = 60.0
WINDOW_MAX_S = 3600.0
DEFAULT_SOCKET = "oob.sock"


@dataclass(frozen=True)
class ListenerSpec:
    """One listener: what it receives (`root_tag`, `payload`) and who handles it."""

    name: str
    root_tag: str
    payload: str
    handler: str
    namespace: str | None = None
    description: str | None = None
    capability: str | None = None
    peers: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    concurrency: int = DEFAULT_CONCURRENCY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    inline: bool = False  # handled in the transaction that takes it (bus/pump/inline.py)


@dataclass(frozen=True)
class AgentSpec:
    """The model behind the listener of the same name."""

    name: str
    type: str
    model: str | None = None
    system_prompt: str | None = None
    visible_tools: tuple[str, ...] = ()


@dataclass(frozen=True)
class MetaSpec:
    """Who may ask the organism about itself: admin, all or none."""

    allow_list_capabilities: str = "admin"
    allow_schema_requests: str = "admin"


@dataclass(frozen=True)
class OobSpec:
    """The out-of-band channel: who may sign requests, where the socket is, the clock window."""

    authorized_keys: tuple[Path, ...] = ()
    socket: str = DEFAULT_SOCKET
    window_s: float = DEFAULT_WINDOW_S


@dataclass(frozen=True)
class Organism:
    """A checked organism.yaml. `base_dir` is the file's directory (handlers import from it)."""

    name: str
    listeners: tuple[ListenerSpec, ...]
    agents: tuple[AgentSpec, ...] = ()
    meta: MetaSpec = MetaSpec()
    oob: OobSpec = OobSpec()
    max_pending: int = DEFAULT_MAX_PENDING
    source: str = "organism.yaml"
    base_dir: Path = Path(".")

    def listener(self, name: str) -> ListenerSpec | None:
        return next((spec for spec in self.listeners if spec.name == name), None)

    @property
    def routes(self) -> dict[str, tuple[str, ...]]:
        """The routing table: root tag -> the listeners that receive it, in file order."""
        table: dict[str, tuple[str, ...]] = {}
        for spec in self.listeners:
            table[spec.root_tag] = table.get(spec.root_tag, ()) + (spec.name,)
        return table

    def with_listener(self, spec: ListenerSpec) -> Organism:
        """This organism plus `spec` (an OOB add-listener), checked like the file."""
        return check_organism(replace(self, listeners=self.listeners + (spec,)))

    def without_listener(self, name: str) -> Organism:
        """This organism without listener `name` (an OOB remove-listener), checked."""
        if self.listener(name) is None:
            raise OrganismInvalid(self.source, "name", f"no listener is named {name!r}; "
                                  f"listeners: {', '.join(s.name for s in self.listeners)}")
        kept = tuple(spec for spec in self.listeners if spec.name != name)
        return check_organism(replace(self, listeners=kept))


# --- loading ----------------------------------------------------------------------


def load_organism(path: str | Path) -> Organism:
    """Read and check organism.yaml at `path`; raises OrganismInvalid."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OrganismInvalid(source, "(file)", f"cannot be read ({exc}); "
                              "pass the path of a readable UTF-8 organism.yaml") from None
    return parse_organism(text, source, path.stem, path.absolute().parent)


def parse_organism(text: str, source: str = "organism.yaml", default_name: str = "organism",
                   base_dir: Path = Path(".")) -> Organism:
    """Check organism.yaml text; `default_name` names an organism without `name:`."""
    data = _safe_load(text, source)
    if data is None:
        raise OrganismInvalid(source, "(top level)", "the file is empty; it needs at least "
                              "a `listeners:` list")
    top = _Section(source, "", data)
    organism = Organism(
        name=top.name("name", default=default_name),
        listeners=tuple(parse_listener(item, source, path)
                        for path, item in top.items("listeners", required=True)),
        agents=tuple(_parse_agent(_Section(source, path, item))
                     for path, item in top.items("agents")),
        meta=_parse_meta(top.section("meta")),
        oob=_parse_oob(top.section("oob"), base_dir),
        max_pending=top.count("max_pending", DEFAULT_MAX_PENDING, MAX_PENDING_MAX),
        source=source, base_dir=base_dir)
    top.done()
    return check_organism(organism)


def parse_listener(data: object, source: str = "request", path: str = "listener") -> ListenerSpec:
    """One listener entry (a mapping, as in organism.yaml); for OOB add-listener too."""
    s = _Section(source, path, data)
    spec = ListenerSpec(
        name=s.name("name"), root_tag=s.root_tag("root_tag"),
        payload=s.reference("payload", "module:Class"),
        handler=s.reference("handler", "module:function"),
        namespace=s.text("namespace"), description=s.text("description"),
        capability=s.text("capability"), peers=_peers(s),
        timeout_s=_timeout(s, s.data.get("inline") is True),
        concurrency=s.count("concurrency", DEFAULT_CONCURRENCY, CONCURRENCY_MAX),
        max_attempts=s.count("max_attempts", DEFAULT_MAX_ATTEMPTS, 1000),
        inline=s.flag("inline"))
    s.done()
    return spec


def _timeout(s: _Section, inline: bool) -> float:
    """`timeout`: small for an inline handler, which runs while the pump holds its write lock."""
    if not inline:
        return s.number("timeout", DEFAULT_TIMEOUT_S, TIMEOUT_MAX_S)
    return s.number("timeout", INLINE_DEFAULT_TIMEOUT_S, INLINE_TIMEOUT_MAX_S, (
        "; an inline handler runs while the pump holds its write lock: set inline: false "
        "for a slower handler"))


def _peers(s: _Section) -> tuple[str, ...]:
    """`peers`, or `tools`, its older spelling."""
    if "peers" in s.data and "tools" in s.data:
        s.fail("tools", "give `peers` or its seed spelling `tools`, not both")
    peers = s.names("tools") if "tools" in s.data else s.names("peers")
    s.used += [key for key in ("peers", "tools") if key not in s.used]
    return peers


def _parse_agent(s: _Section) -> AgentSpec:
    spec = AgentSpec(name=s.name("name"), type=s.text("type", required=True),
                     model=s.text("model"), system_prompt=s.text("system_prompt"),
                     visible_tools=s.names("visible_tools"))
    s.done()
    return spec


def _parse_meta(s: _Section) -> MetaSpec:
    spec = MetaSpec(*(s.choice(key, PRIVILEGE_LEVELS, "admin")
                      for key in ("allow_list_capabilities", "allow_schema_requests")))
    s.done()
    return spec


def _parse_oob(s: _Section, base_dir: Path) -> OobSpec:
    keys = []
    for path, item in s.items("authorized_keys"):
        if not isinstance(item, str) or not item.strip():
            raise OrganismInvalid(s.source, path, f"must be the path of a public key file "
                                  f"(from `bus pump oob keygen`), got {_kind(item)}")
        keys.append(base_dir / item)
    spec = OobSpec(authorized_keys=tuple(keys), socket=s.text("socket") or DEFAULT_SOCKET,
                   window_s=s.number("window_s", DEFAULT_WINDOW_S, WINDOW_MAX_S))
    s.done()
    return spec


# --- cross-checks -------------------------------------------------------------------


def check_organism(organism: Organism) -> Organism:
    """The rules between entries: unique names, known peers, one namespace per root tag."""
    src, listeners = organism.source, organism.listeners
    if not listeners:
        raise OrganismInvalid(src, "listeners", "must list at least one listener")
    index = _unique(src, "listeners", [spec.name for spec in listeners])
    namespaces: dict[str, tuple[int, str | None]] = {}
    for i, spec in enumerate(listeners):
        for j, peer in enumerate(spec.peers):
            if peer not in index:
                raise OrganismInvalid(src, f"listeners[{i}].peers[{j}]", _unknown(peer, index))
        first = namespaces.setdefault(spec.root_tag, (i, spec.namespace))
        if first[1] != spec.namespace:
            raise OrganismInvalid(src, f"listeners[{i}].namespace", (
                f"is {spec.namespace!r}, but listeners[{first[0]}] receives root tag "
                f"{spec.root_tag!r} in namespace {first[1]!r}; listeners sharing a root tag "
                "receive the same element, so give them the same namespace"))
    _unique(src, "agents", [agent.name for agent in organism.agents])
    for i, agent in enumerate(organism.agents):
        _check_agent(src, i, agent, index, listeners)
    return organism


def _check_agent(src: str, i: int, agent: AgentSpec, index: dict[str, int],
                 listeners: tuple[ListenerSpec, ...]) -> None:
    if agent.name not in index:
        raise OrganismInvalid(src, f"agents[{i}].name", "an agent is the model behind a "
                              f"listener, and {_unknown(agent.name, index)}")
    listener = listeners[index[agent.name]]
    for j, tool in enumerate(agent.visible_tools):
        if tool not in listener.peers:
            raise OrganismInvalid(src, f"agents[{i}].visible_tools[{j}]", (
                f"{tool!r} is not among the peers of listeners[{index[agent.name]}] "
                f"({', '.join(listener.peers) or 'none'}); add it to that listener's peers "
                "or remove it here"))


def _unique(src: str, key: str, names: list[str]) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in index:
            raise OrganismInvalid(src, f"{key}[{i}].name", (
                f"{name!r} is also the name of {key}[{index[name]}]; names must be unique"))
        index[name] = i
    return index


def _unknown(name: str, index: Mapping[str, int]) -> str:
    return f"no listener is named {name!r}; listeners: {', '.join(index)}"


# --- references -------------------------------------------------------------------------


def check_references(organism: Organism) -> None:
    """Import every handler and payload class; raises OrganismInvalid naming the key.

    Runs the modules' import-time code: `bus pump organism check` does this, loading does not.
    """
    for i, spec in enumerate(organism.listeners):
        resolve_handler(spec, organism, f"listeners[{i}]")
        resolve_payload(spec, organism, f"listeners[{i}]")


def resolve_handler(spec: ListenerSpec, organism: Organism, path: str = "listener") -> Any:
    """The listener's handler function, imported (the organism's directory first)."""
    handler = _resolve(spec.handler, organism, f"{path}.handler")
    if not callable(handler):
        raise OrganismInvalid(organism.source, f"{path}.handler", (
            f"{spec.handler} is {_a(type(handler).__name__)}, not a function; "
            "point it at `async def handler(msg, ctx)` or a plain function"))
    if spec.inline and inspect.iscoroutinefunction(handler):
        raise OrganismInvalid(organism.source, f"{path}.inline", (
            f"listener {spec.name!r} has an async handler ({spec.handler}), which cannot run "
            "inside the pump's transaction; make it a plain `def` or set inline: false"))
    return handler


def resolve_payload(spec: ListenerSpec, organism: Organism, path: str = "listener") -> type:
    """The listener's payload class, imported (the organism's directory first)."""
    payload = _resolve(spec.payload, organism, f"{path}.payload")
    if not isinstance(payload, type):
        raise OrganismInvalid(organism.source, f"{path}.payload", (
            f"{spec.payload} is {_a(type(payload).__name__)}, not a class; "
            "point it at the payload's dataclass"))
    return payload


def _resolve(reference: str, organism: Organism, field: str) -> Any:
    module_name, _, attributes = reference.partition(":")
    try:
        target = modules.import_from(module_name, organism.base_dir)
    except ModuleNotFoundError as exc:
        raise OrganismInvalid(organism.source, field, (
            f"module {module_name!r} not found ({exc}); put it beside the organism file "
            "or on PYTHONPATH, or fix the name")) from None
    except Exception as exc:  # the module's own code failed: report it, do not crash
        raise OrganismInvalid(organism.source, field, (
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}")) from None
    for attribute in attributes.split("."):
        if not hasattr(target, attribute):
            raise OrganismInvalid(organism.source, field, (
                f"{module_name} has no attribute {attributes!r}; fix the name after ':'"))
        target = getattr(target, attribute)
    return target


# --- YAML ---------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}; YAML would keep only the last one, "
                    "so remove or rename one of them", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def _safe_load(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(yaml)"
        problem = getattr(exc, "problem", None) or str(exc)
        raise OrganismInvalid(source, where, f"not valid YAML: {problem}; fix the file "
                                             "there") from None


class _Section:
    """One mapping of the file at a key path; remembers the keys it read."""

    def __init__(self, source: str, path: str, data: object) -> None:
        self.source, self.path = source, path
        if not isinstance(data, Mapping):
            self.fail(None, f"must be a mapping of keys, got {_kind(data)}")
        self.data: Mapping[Any, Any] = data
        self.used: list[str] = []

    def field(self, key: str | None) -> str:
        if key is None:
            return self.path or "(top level)"
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str | None, reason: str) -> None:
        raise OrganismInvalid(self.source, self.field(key), reason)

    def get(self, key: str, required: bool = False) -> Any:
        self.used.append(key)
        if self.data.get(key) is None and required:
            self.fail(key, "is required")
        return self.data.get(key)

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.data if k not in self.used)
        if unknown:
            self.fail(unknown[0], f"unknown key; accepted keys: {', '.join(self.used)}")

    def text(self, key: str, required: bool = False) -> str | None:
        value = self.get(key, required)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            self.fail(key, f"must be a non-empty string, got {_kind(value)}")
        return value

    def name(self, key: str, default: str | None = None) -> str:
        given = self.get(key, required=default is None)
        value = default if given is None else given
        if not isinstance(value, str) or len(value) > NAME_MAX or not _NAME.fullmatch(value):
            shown = f"{value!r}" if given is not None else f"the default (file name) {value!r}"
            self.fail(key, f"{shown} is not a name: use 1-{NAME_MAX} letters, digits and "
                           "_ . - (not starting with . or -)")
        return value

    def names(self, key: str) -> tuple[str, ...]:
        found = []
        for path, item in self.items(key):
            if not isinstance(item, str) or not _NAME.fullmatch(item):
                raise OrganismInvalid(self.source, path, f"{item!r} is not a listener name")
            found.append(item)
        return tuple(found)

    def root_tag(self, key: str) -> str:
        value = self.get(key, required=True)
        if not isinstance(value, str) or not _ROOT_TAG.fullmatch(value) \
                or value.lower().startswith("xml"):
            self.fail(key, f"{value!r} is not an XML element name: start with a letter or _, "
                           "then letters, digits, _ . - (no ':', not starting with 'xml')")
        if value in _RESERVED_ROOT_TAGS:
            reserved = ", ".join(sorted(_RESERVED_ROOT_TAGS))
            self.fail(key, f"{value!r} is reserved ({reserved}: privileged commands go over "
                           "the OOB channel, huh is the pump's error reply, the pump answers "
                           "meta requests itself); choose another tag")
        return value

    def reference(self, key: str, shape: str) -> str:
        value = self.get(key, required=True)
        if not isinstance(value, str) or not _REFERENCE.fullmatch(value):
            self.fail(key, f"{value!r} is not a reference like '{shape}' "
                           "(a dotted module path, ':', then a name)")
        return value

    def number(self, key: str, default: float, limit: float, hint: str = "") -> float:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or not 0 < value <= limit:
            self.fail(key, f"must be a number of seconds > 0 and <= {limit:g}, got {value!r}"
                           + hint)
        return float(value)

    def count(self, key: str, default: int, limit: int) -> int:
        value = self.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
            self.fail(key, f"must be an integer from 1 to {limit}, got {value!r}")
        return value

    def flag(self, key: str) -> bool:
        value = self.get(key)
        if value is not None and not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_kind(value)}")
        return bool(value)

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.get(key)
        if value is None:
            return default
        if value not in choices:
            self.fail(key, f"{value!r} is not one of: {', '.join(choices)}")
        return value

    def items(self, key: str, required: bool = False) -> list[tuple[str, Any]]:
        value = self.get(key, required)
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(key, f"must be a list, got {_kind(value)}")
        return [(f"{self.field(key)}[{i}]", item) for i, item in enumerate(value)]

    def section(self, key: str) -> _Section:
        value = self.get(key)
        return _Section(self.source, self.field(key), {} if value is None else value)


def _kind(value: object) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, str):
        return f"the string {value!r}"
    return f"{_a(type(value).__name__)} ({value!r})"[:120]


def _a(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"
