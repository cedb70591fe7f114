"""The organism describing itself (its `meta` listener): its tools and their schemas.

    <list-capabilities/>                              -> <capabilities><tool .../>...
    <schema-request><listener>calc.add</listener></schema-request>
                                                      -> <schema listener=..><xsd>..</xsd>...

The pump answers these itself, from the routing table it runs: on the main
path when organism.yaml's `meta` allows `all`, over the signed out-of-band
channel when it allows `admin` or `all`, and nowhere when it says `none`.
A refusal is `MetaDenied` (a `<huh code="meta-denied">` on the main path).
No listener may take these root tags (organism.yaml refuses them).
"""

from __future__ import annotations

from typing import Any
from typing import Mapping

import orjson
from lxml import etree

from bus.storage.errors import ValidationFailed
from bus.pump.organism import LIST_CAPABILITIES
from bus.pump.organism import SCHEMA_REQUEST
from bus.pump.organism import MetaSpec

# Listeners are bus.pump.routing.Listener, taken untyped: routing imports this module.
# root tag -> the MetaSpec switch that allows it
SWITCHES = {LIST_CAPABILITIES: "allow_list_capabilities",
            SCHEMA_REQUEST: "allow_schema_requests"}


class MetaDenied(ValidationFailed):
    """organism.yaml's `meta` does not allow this request by this route."""

    error_code = "denied"

    def __init__(self, root_tag: str, level: str) -> None:
        fix = ("it is allowed to nobody" if level == "none" else
               f"ask over the out-of-band channel (bus pump oob send {root_tag})")
        super().__init__("meta", f"<{root_tag}> is allowed to {level} in organism.yaml's meta"
                                 f" ({SWITCHES[root_tag]}); {fix}")
        self.root_tag = root_tag


def check_allowed(meta: MetaSpec, root_tag: str, privileged: bool) -> None:
    """Raise MetaDenied unless `meta` allows `root_tag` (`privileged`: a signed OOB request)."""
    level = getattr(meta, SWITCHES[root_tag])
    if level == "all" or (level == "admin" and privileged):
        return
    raise MetaDenied(root_tag, level)


def capabilities(listeners: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every listener as a tool: name, root tag, capability and usage text."""
    return [tool_of(listener) for listener in listeners.values()]


def tool_of(listener: Any) -> dict[str, Any]:
    spec = listener.spec
    return {"name": spec.name, "root_tag": spec.root_tag, "capability": spec.capability,
            "usage": listener.pipeline.spec.usage}


def schema(listeners: Mapping[str, Any], name: str) -> dict[str, str]:
    """A listener's payload XSD, example and usage; ValidationFailed for an unknown name."""
    listener = listeners.get(name)
    if listener is None:
        raise ValidationFailed("listener", f"no listener is named {name!r}; listeners:"
                                           f" {', '.join(listeners)}")
    spec = listener.pipeline.spec
    return {"listener": name, "root_tag": listener.spec.root_tag, "xsd": spec.xsd.decode(),
            "example": spec.example.decode(), "usage": spec.usage}


# The listeners a running pump serves, for clients that cannot ask it (the MCP server's
# organism_capabilities): written at every pump start into `meta`, as other small
# per-bus state is, so it needs no schema version of its own.
_CAPABILITIES_KEY = "organism_capabilities:"
_PUT_SQL = ("INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value")
_GET_SQL = "SELECT value FROM meta WHERE key = ?"


def record_capabilities(conn: Any, organism: str, listeners: Mapping[str, Any]) -> None:
    """Store each listener's tool entry, payload XSD and example under the organism's name."""
    entries = [{**tool_of(listener), **schema(listeners, name)}
               for name, listener in listeners.items()]
    conn.execute(_PUT_SQL, (_CAPABILITIES_KEY + organism, orjson.dumps(entries).decode()))


def recorded_capabilities(conn: Any, organism: str) -> list[dict[str, Any]] | None:
    """What the organism's pump recorded at its last start; None if it never did."""
    row = conn.execute(_GET_SQL, (_CAPABILITIES_KEY + organism,)).fetchone()
    return None if row is None else orjson.loads(row[0])


def answer_element(listeners: Mapping[str, Any], request: etree._Element) -> etree._Element:
    """The payload answering a main-path meta request (allowed already)."""
    if request.tag == LIST_CAPABILITIES:
        answer = etree.Element("capabilities")
        for tool in capabilities(listeners):
            item = etree.SubElement(answer, "tool", name=tool["name"], root_tag=tool["root_tag"])
            if tool["capability"]:
                item.set("capability", tool["capability"])
            item.text = tool["usage"]
        return answer
    found = schema(listeners, (request.findtext("listener") or "").strip())
    answer = etree.Element("schema", listener=found["listener"], root_tag=found["root_tag"])
    for key in ("xsd", "example", "usage"):
        etree.SubElement(answer, key).text = found[key]
    return answer
