"""The running pump's routing table: root tag -> {listener: pipeline, handler}.

Built from an `Organism`; replaced whole (never edited in place) by the
out-of-band commands, so the pump's threads read one consistent table:

    table = RoutingTable(load_organism("organism.yaml"))
    table.routes.targets("add", to=None)      # every listener of <add>
    table.dispatch(request)                   # OobServer's dispatcher

An OOB root tag (`add-listener`, ...) can never be in the table: the
organism loader refuses it as a listener's root tag, so sent on the main
path it routes nowhere.
"""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from dataclasses import replace
from typing import Any
from typing import Callable
from typing import Iterable
from typing import Mapping

from bus.pump import meta
from bus.pump import modules
from bus.pump.errors import OrganismInvalid
from bus.pump.handlers import Tool
from bus.pump.oob import OobRequest
from bus.pump.organism import LIST_CAPABILITIES
from bus.pump.organism import ListenerSpec
from bus.pump.organism import META_ROOT_TAGS
from bus.pump.organism import Organism
from bus.pump.organism import load_organism
from bus.pump.organism import parse_listener
from bus.pump.organism import resolve_handler
from bus.pump.organism import resolve_payload
from bus.xml.payload import XmlSpec
from bus.xml.payload import is_xmlified
from bus.xml.payload import spec_of
from bus.xml.pipeline import HUH
from bus.xml.pipeline import Pipeline
from bus.xml.pipeline import listener_pipeline


@dataclass(frozen=True)
class Listener:
    """A listener ready to run: its spec, pipeline and imported handler."""

    spec: ListenerSpec
    pipeline: Pipeline
    handler: Callable[..., Any]
    # Its agent entry, as its handler's context shows it: the tools it may see and call
    # (visible_tools; all its peers without an agent entry), model and system_prompt.
    tools: tuple[Tool, ...] = ()
    visible: tuple[str, ...] | None = None  # the agent's visible_tools; None: no agent
    model: str | None = None
    system_prompt: str | None = None
    # The payload classes of the answers it may get from the peers it calls, by tag:
    # every @xmlify class of the organism's modules (see `_answer_specs`).
    answers: Mapping[str, XmlSpec] | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def tag(self) -> str:
        """The payload's root tag as envelopes carry it: ``{namespace}root`` or ``root``."""
        return self.pipeline.spec.tag


class Routes:
    """An immutable routing table."""

    def __init__(self, listeners: Mapping[str, Listener]) -> None:
        self.listeners = dict(listeners)
        by_tag: dict[str, list[Listener]] = {}
        for listener in self.listeners.values():
            by_tag.setdefault(listener.tag, []).append(listener)
        self.by_tag = {tag: tuple(found) for tag, found in by_tag.items()}
        self.has_inline = any(item.spec.inline for item in self.listeners.values())

    def targets(self, root_tag: str, to: str | None) -> tuple[Listener, ...]:
        """Who receives a `root_tag` payload: listener `to`, or all of the tag; () if none.

        A `<huh>` goes to the one listener it names, whatever its tag: the pump
        routes it to a caller whose call failed.
        """
        if to is None:
            return self.by_tag.get(root_tag, ())
        listener = self.listeners.get(to)
        if listener is None or listener.tag != root_tag and root_tag != HUH:
            return ()
        return (listener,)

    def caller(self, to: str) -> tuple[Listener, ...]:
        """Who receives an answer to listener `to` (the calling handler), whatever the
        answer's root tag: the listener, or () when it is gone (removed by OOB)."""
        listener = self.listeners.get(to)
        return () if listener is None else (listener,)


def build_listener(spec: ListenerSpec, organism: Organism, path: str) -> Listener:
    """Import a listener's handler and payload class; OrganismInvalid names the key."""
    handler = resolve_handler(spec, organism, path)
    payload = resolve_payload(spec, organism, path)
    try:
        root = spec_of(payload).root
    except Exception as exc:  # XmlifyUnsupported: say which key to fix
        raise OrganismInvalid(organism.source, f"{path}.payload", f"{spec.payload}: {exc}") \
            from None
    if root != spec.root_tag:
        raise OrganismInvalid(organism.source, f"{path}.root_tag", (
            f"is {spec.root_tag!r}, but {spec.payload} is the XML element <{root}>; "
            f"set root_tag: {root} or @xmlify(root={spec.root_tag!r})"))
    namespace = spec_of(payload).namespace
    if namespace != spec.namespace:
        raise OrganismInvalid(organism.source, f"{path}.namespace", (
            f"is {spec.namespace!r}, but {spec.payload} is in namespace {namespace!r}; "
            f"make them the same (@xmlify(namespace=...) or the listener's namespace key)"))
    return Listener(spec, listener_pipeline(spec.name, payload), handler)


def build_routes(organism: Organism) -> Routes:
    built = {spec.name: build_listener(spec, organism, f"listeners[{i}]")
             for i, spec in enumerate(organism.listeners)}
    answers = _answer_specs(built.values())
    return Routes({name: replace(_with_agent(organism, listener, built), answers=answers)
                   for name, listener in built.items()})


def _answer_specs(listeners: Iterable[Listener]) -> dict[str, XmlSpec]:
    """The @xmlify classes a calling listener may get answers in, by tag: the listeners'
    payload classes, then every @xmlify class at the top of their handler and payload
    modules (where a peer's reply classes live). The first class of a tag wins."""
    found: dict[str, XmlSpec] = {}
    for listener in listeners:
        found.setdefault(listener.tag, listener.pipeline.spec)
    for listener in listeners:
        for module_name in (getattr(listener.handler, "__module__", None),
                            listener.pipeline.payload.__module__):
            module = sys.modules.get(module_name or "")
            for value in vars(module).values() if module is not None else ():
                spec = getattr(value, "__xmlify__", None) if isinstance(value, type) else None
                if spec is not None and is_xmlified(value) and spec.cls is value:
                    found.setdefault(spec.tag, spec)
    return found


def _with_agent(organism: Organism, listener: Listener,
                built: Mapping[str, Listener]) -> Listener:
    """`listener` with its agent entry: the agent's `visible_tools` (none if it lists
    none), model and system prompt; a listener without an agent entry sees all its peers."""
    agent = next((a for a in organism.agents if a.name == listener.name), None)
    if agent is None:
        return replace(listener, tools=_tools(listener.spec.peers, built))
    return replace(listener, tools=_tools(agent.visible_tools, built),
                   visible=agent.visible_tools, model=agent.model,
                   system_prompt=agent.system_prompt)


def _tools(names: tuple[str, ...], built: Mapping[str, Listener]) -> tuple[Tool, ...]:
    return tuple(Tool(**meta.tool_of(built[name])) for name in names)


class RoutingTable:
    """The current organism and routes; `dispatch` applies OOB commands to them."""

    def __init__(self, organism: Organism) -> None:
        self.organism = organism
        self.routes = build_routes(organism)
        self._lock = threading.Lock()  # one OOB change at a time

    def dispatch(self, request: OobRequest) -> dict[str, Any]:
        """Apply an accepted OOB request; the result for the client (OobServer calls this)."""
        with self._lock:
            if request.command == "add-listener":
                spec = parse_listener(request.args, "request", "args")
                organism = self.organism.with_listener(spec)
            elif request.command == "remove-listener":
                organism = self.organism.without_listener(request.args["name"])
            elif request.command in META_ROOT_TAGS:
                return self._meta(request)
            else:  # hot-reload: organism.yaml and the code it names, again
                return self._hot_reload()
            routes = build_routes(organism)  # raises before anything changes
            self.organism, self.routes = organism, routes
        return _routes_result(routes)

    def _hot_reload(self) -> dict[str, Any]:
        """organism.yaml again, from the file the pump started with, and the modules it
        names whose source changed; on any error, the routes and modules stay as they were."""
        organism = self._reload()
        with modules.reimported(_code_references(organism), organism.source,
                                organism.base_dir) as reimported:
            routes = build_routes(organism)
        self.organism, self.routes = organism, routes
        return dict(_routes_result(routes), reimported=reimported)

    def _meta(self, request: OobRequest) -> dict[str, Any]:
        """A signed meta request: allowed to admin (that is what a signature proves) or all."""
        meta.check_allowed(self.organism.meta, request.command, privileged=True)
        if request.command == LIST_CAPABILITIES:
            return {"tools": meta.capabilities(self.routes.listeners)}
        return meta.schema(self.routes.listeners, request.args["listener"])

    def _reload(self) -> Organism:
        """organism.yaml re-read, for the organism the pump runs."""
        organism = load_organism(self.organism.source)
        if organism.name != self.organism.name:
            raise OrganismInvalid(organism.source, "name", (
                f"is {organism.name!r}, but the pump runs organism {self.organism.name!r}; "
                "an organism cannot be renamed while it runs: restart the pump instead"))
        return organism


def _routes_result(routes: Routes) -> dict[str, Any]:
    """What an OOB client learns of the routes a command left."""
    return {"listeners": list(routes.listeners),
            "routes": {tag: [item.name for item in found]
                       for tag, found in routes.by_tag.items()}}


def _code_references(organism: Organism) -> dict[str, str]:
    """The modules `organism` names, each with the first key naming it (a handler key if
    any: that is the code people edit). Payload modules come first, so a handler module
    that imports its payload classes binds the new ones."""
    payloads: dict[str, str] = {}
    handlers: dict[str, str] = {}
    for i, spec in enumerate(organism.listeners):
        payloads.setdefault(spec.payload.partition(":")[0], f"listeners[{i}].payload")
        handlers.setdefault(spec.handler.partition(":")[0], f"listeners[{i}].handler")
    return {name: handlers.get(name) or payloads[name] for name in {**payloads, **handlers}}
