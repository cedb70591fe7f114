"""The XML side of agentbus: hardened parsing, envelopes, `@xmlify` payloads, pipelines.

    from dataclasses import dataclass
    from bus.xml import xmlify, listener_pipeline, run, Huh

    @xmlify(root="add")
    @dataclass
    class Add:
        '''Add two numbers.'''
        a: float
        b: float

    result = run(listener_pipeline("calculator", Add), raw_bytes)
    if isinstance(result, Huh):
        ...  # result.to_element() is the <huh> for the sender
    else:
        result.payload  # Add(a=..., b=...)

Modules: `parser` (hardened parse, limits, repair, C14N), `envelope`
(envelope.xsd, `Envelope`, `build_envelope`), `payload` (`@xmlify`),
`pipeline` (`Pipeline`, `run`, `Huh`), `errors`.
"""

from __future__ import annotations

from bus.xml.envelope import ENVELOPE_NS
from bus.xml.envelope import Envelope
from bus.xml.envelope import build_envelope
from bus.xml.envelope import reply_envelope
from bus.xml.errors import XmlRejected
from bus.xml.errors import XmlifyUnsupported
from bus.xml.parser import Repair
from bus.xml.parser import canonicalize
from bus.xml.parser import parse
from bus.xml.parser import repair
from bus.xml.payload import from_element
from bus.xml.payload import from_xml
from bus.xml.payload import spec_of
from bus.xml.payload import to_element
from bus.xml.payload import to_xml
from bus.xml.payload import write_schema
from bus.xml.payload import xmlify
from bus.xml.pipeline import Boot
from bus.xml.pipeline import Huh
from bus.xml.pipeline import Pipeline
from bus.xml.pipeline import check_payload
from bus.xml.pipeline import listener_pipeline
from bus.xml.pipeline import run
from bus.xml.pipeline import system_pipeline

__all__ = [
    "ENVELOPE_NS", "Boot", "Envelope", "Huh", "Pipeline", "Repair", "XmlRejected",
    "XmlifyUnsupported", "build_envelope", "canonicalize", "check_payload", "from_element",
    "from_xml", "listener_pipeline", "parse", "repair", "reply_envelope", "run", "spec_of",
    "system_pipeline", "to_element", "to_xml", "write_schema", "xmlify",
]
