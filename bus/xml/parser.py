"""Hardened XML parsing, the honest repair step, and C14N 2.0.

`parse(data)` is the one way bytes become an lxml tree on the bus: no DTD is
loaded, no entity is resolved, nothing is fetched from the network or the
file system, and a DOCTYPE is refused outright (so billion laughs and
quadratic blowup are refused, never expanded). Limits are libxml2's own
non-huge limits (depth 256, text nodes of 10,000,000 bytes), each reported
as a named error, plus a size limit checked before parsing.

`repair(data)` runs only when the strict parse fails. It escapes a stray
``&`` or ``<`` and strips prose around one root element, and it reports
every change it made. It never guesses: lxml's ``recover=True`` silently
drops data (``<a>x & y</a>`` becomes ``<a>x  y</a>``, a second root vanishes),
so it is not used at all; what cannot be repaired losslessly is an error.
"""

from __future__ import annotations

import codecs
import copy
import re
import threading
from dataclasses import dataclass
from typing import NamedTuple

from lxml import etree

from bus.xml.errors import XmlDoctypeRefused
from bus.xml.errors import XmlEmpty
from bus.xml.errors import XmlEncodingInvalid
from bus.xml.errors import XmlMalformed
from bus.xml.errors import XmlMultipleRoots
from bus.xml.errors import XmlRejected
from bus.xml.errors import XmlTextTooLong
from bus.xml.errors import XmlTooDeep
from bus.xml.errors import XmlTooLarge

MAX_BYTES = 16 * 1024 * 1024
# libxml2's limits without XML_PARSE_HUGE (huge_tree=False): fixed, not settable.
MAX_DEPTH = 256
MAX_TEXT_BYTES = 10_000_000

_ERR_DOCUMENT_EMPTY = 4
_ERR_DOCUMENT_END = 5  # "Extra content at the end of the document"
_ERR_RESOURCE_LIMIT = 114
_QUOTE = 40  # characters of stripped prose quoted in a Repair
# UTF-32 first: its little-endian mark starts with UTF-16's. The "-sig"/BOM codecs drop the mark.
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"),
         (codecs.BOM_UTF8, "utf-8-sig"))

# Regions whose '&' and '<' are literal, so repair must leave them alone.
_PROTECTED = r"<!\[CDATA\[.*?\]\]>|<!--.*?-->|<\?.*?\?>"
_STRAY = re.compile(
    _PROTECTED + r"|(&)(?!#[0-9]+;|#x[0-9A-Fa-f]+;|[A-Za-z_:][\w.:-]*;)|(<)(?![^\W\d]|[_:/!?])",
    re.DOTALL)
_PROTECTED_RE = re.compile(_PROTECTED, re.DOTALL)
_DECLARATION = re.compile(r"<\?xml\s[^>]*\?>")
_ROOT_START = re.compile(r"<([^\W\d][\w.:-]*)", re.UNICODE)
_MARKUP = re.compile(r"<[^\W\d/!?]|</|<!|<\?", re.UNICODE)


class _DenyResolver(etree.Resolver):
    """Answers every entity or DTD lookup with nothing: no file, no socket."""

    def resolve(self, url, pubid, context):  # noqa: D102 - lxml's interface
        return self.resolve_string("", context)


# lxml parsers and schemas are not to be shared between threads: a schema's
# error_log is per object, so two threads validating at once read each other's.
_local = threading.local()


def _parser() -> etree.XMLParser:
    try:
        return _local.parser
    except AttributeError:  # this thread's first parse
        pass
    parser = etree.XMLParser(
        resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
        huge_tree=False, remove_comments=True, remove_pis=True, collect_ids=False)
    parser.resolvers.add(_DenyResolver())
    _local.parser = parser
    return parser


def compiled_schema(xsd: bytes) -> etree.XMLSchema:
    """The XSD document `xsd` compiled once per thread (pass the same bytes object)."""
    cache = _local.__dict__.setdefault("schemas", {})
    schema = cache.get(xsd)
    if schema is None:
        schema = cache[xsd] = etree.XMLSchema(parse(xsd))
    return schema


@dataclass(frozen=True)
class Repair:
    """One change `repair` made: what (`kind`), where, and the text involved."""

    kind: str  # "escaped-ampersand", "escaped-less-than", "stripped-prose", "dropped-declaration"
    line: int
    column: int
    detail: str


@dataclass(frozen=True)
class Repaired:
    data: bytes
    repairs: tuple[Repair, ...]


class Parsed(NamedTuple):
    """A parsed document: its root and the repairs that made it parse (none if strict)."""

    root: etree._Element
    repairs: tuple[Repair, ...] = ()


def parse(data: bytes, max_bytes: int = MAX_BYTES) -> etree._Element:
    """Strict hardened parse of one document; raises an `XmlRejected` subclass.

    Comments and processing instructions are dropped (they carry no data).
    """
    if len(data) > max_bytes:
        raise XmlTooLarge(len(data), max_bytes)
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        raise _named_error(data, exc) from None
    # What the parser saw decides, not a byte pattern: in UTF-16 or UTF-32 the
    # DOCTYPE's bytes are not b"<!DOCTYPE" (about 0.5 us a message).
    docinfo = root.getroottree().docinfo
    if docinfo.internalDTD is not None or docinfo.doctype:
        raise XmlDoctypeRefused(*_doctype_position(data, docinfo.encoding))
    return root


def _doctype_position(data: bytes, declared: str) -> tuple[int, int]:
    """Line and column of the DOCTYPE, read in the document's own encoding (0, 0 if unknown)."""
    encoding = next((name for bom, name in _BOMS if data.startswith(bom)), declared)
    try:
        text = data.decode(encoding)
    except (LookupError, UnicodeDecodeError):
        return 0, 0
    return _text_position(text, max(text.find("<!DOCTYPE"), 0))


def parse_or_repair(data: bytes, max_bytes: int = MAX_BYTES) -> Parsed:
    """`parse`, and only if that fails, `repair` then `parse` the repaired text.

    The repair-free path costs one strict parse. When the repaired text does
    not parse either, the error is the first problem repair could not fix
    (its line matches the input; its column is in the repaired text).
    """
    try:
        return Parsed(parse(data, max_bytes))
    except XmlMalformed:
        return parse_repaired(data, max_bytes)


def parse_repaired(data: bytes, max_bytes: int = MAX_BYTES) -> Parsed:
    """`repair` then `parse`: the second half of `parse_or_repair`, for input `parse` refused."""
    repaired = repair(data)
    try:
        return Parsed(parse(repaired.data, max_bytes), repaired.repairs)
    except XmlMalformed as exc:
        if exc.detail.startswith("Extra content"):
            raise XmlMultipleRoots(exc.line, exc.column) from None
        raise


def _named_error(data: bytes, exc: etree.XMLSyntaxError) -> XmlRejected:
    line, column = exc.position
    message = exc.msg.split(", line ")[0]
    if exc.code == _ERR_RESOURCE_LIMIT and "depth" in message:
        return XmlTooDeep(MAX_DEPTH, line, column)
    if exc.code == _ERR_RESOURCE_LIMIT and "Text node" in message:
        return XmlTextTooLong(MAX_TEXT_BYTES, line, column)
    if exc.code == _ERR_DOCUMENT_EMPTY and not data.strip():
        return XmlEmpty()
    if b"<!DOCTYPE" in data:
        return XmlDoctypeRefused(*_position(data, data.index(b"<!DOCTYPE")))
    return XmlMalformed(message, line, column)


def repair(data: bytes) -> Repaired:
    """Repair what can be repaired losslessly and report each change.

    Escapes a stray ``&`` (one that starts no reference) as ``&amp;`` and a
    stray ``<`` (one that starts no markup, as in ``1 < 2``) as ``&lt;``, both
    outside CDATA, comments and processing instructions; strips prose before
    and after the one root element (its newlines are kept so line numbers
    still match the input); drops an XML declaration, since the result is
    UTF-8. Raises `XmlEncodingInvalid`, `XmlDoctypeRefused`, `XmlEmpty` or
    `XmlMultipleRoots` when the input cannot be repaired.
    """
    text = _decode(data)
    if "<!DOCTYPE" in text:
        raise XmlDoctypeRefused(*_position(data, data.index(b"<!DOCTYPE")))
    repairs: list[Repair] = []
    start, end = _root_span(text)
    text = _drop_declaration(text, start, repairs)
    head, body, tail = text[:start], text[start:end], text[end:]
    head = _strip_prose(head, text, 0, repairs)
    body = _escape_strays(body, text, start, repairs)
    tail = _strip_prose(tail, text, end, repairs)
    return Repaired((head + body + tail).encode(), tuple(repairs))


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise XmlEncodingInvalid(exc.start, *_position(data, exc.start)) from None


def _drop_declaration(text: str, root_start: int, repairs: list[Repair]) -> str:
    """Blank out an XML declaration before the root (same length: offsets stay valid)."""
    found = _DECLARATION.search(text, 0, root_start)
    if found is None:
        return text
    line, column = _text_position(text, found.start())
    repairs.append(Repair("dropped-declaration", line, column, found.group()))
    return text[:found.start()] + " " * len(found.group()) + text[found.end():]


def _root_span(text: str) -> tuple[int, int]:
    """Start and end offsets of the first element and its matching last end tag."""
    found = _ROOT_START.search(text)
    if found is None:
        raise XmlEmpty() if not text.strip() else XmlMalformed(
            "no element found", *_text_position(text, 0))
    name = re.escape(found.group(1))
    closing = None
    for closing in re.finditer(rf"</{name}\s*>", text[found.end():]):
        pass
    if closing is not None:
        return found.start(), found.end() + closing.end()
    start_tag_end = text.find("/>", found.end())
    if start_tag_end < 0:
        raise XmlMalformed(f"element <{found.group(1)}> is never closed",
                           *_text_position(text, found.start()))
    return found.start(), start_tag_end + 2


def _strip_prose(part: str, text: str, offset: int, repairs: list[Repair]) -> str:
    bare = _PROTECTED_RE.sub("", part)
    if not bare.strip():
        return part  # whitespace, comments and PIs are allowed around the root
    markup = _MARKUP.search(bare)
    if markup is not None:
        raise XmlMultipleRoots(*_text_position(text, offset + part.find(markup.group())))
    line, column = _text_position(text, offset + len(part) - len(part.lstrip()))
    prose = part.strip()
    quoted = prose if len(prose) <= _QUOTE else prose[:_QUOTE] + "..."
    repairs.append(Repair("stripped-prose", line, column, quoted))
    return "\n" * part.count("\n")


def _escape_strays(body: str, text: str, offset: int, repairs: list[Repair]) -> str:
    def escape(found: re.Match) -> str:
        if found.group(1) is None and found.group(2) is None:
            return found.group()  # CDATA, comment or PI: literal, left alone
        char = found.group()
        line, column = _text_position(text, offset + found.start())
        kind = "escaped-ampersand" if char == "&" else "escaped-less-than"
        repairs.append(Repair(kind, line, column, char))
        return "&amp;" if char == "&" else "&lt;"

    return _STRAY.sub(escape, body)


def _text_position(text: str, offset: int) -> tuple[int, int]:
    line = text.count("\n", 0, offset) + 1
    return line, offset - (text.rfind("\n", 0, offset) + 1) + 1


def _position(data: bytes, offset: int) -> tuple[int, int]:
    line = data.count(b"\n", 0, offset) + 1
    return line, offset - (data.rfind(b"\n", 0, offset) + 1) + 1


def canonicalize(element: etree._Element) -> bytes:
    """The C14N 2.0 form of `element` (default parameters), as bytes.

    Serialized from a detached copy when `element` is not a document root,
    so the result does not depend on where the element sits. libxml2's
    exclusive C14N is used because lxml's ``method="c14n2"`` is written in
    Python (about 20x slower); for trees from `parse` (no comments, PIs, DTD
    or entity references) the two agree byte for byte, which
    tests/xml/test_xml_parser.py checks against lxml's c14n2.
    """
    if element.getparent() is not None:
        element = copy.deepcopy(element)
    return etree.tostring(element, method="c14n", exclusive=True, with_comments=False)
