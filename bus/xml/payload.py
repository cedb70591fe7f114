"""`@xmlify`: dataclasses as XML payloads, with an XSD derived from the type hints.

    @xmlify
    @dataclass
    class CalculatorAdd:
        '''Add two numbers and return the sum.'''
        a: float
        b: float = 0.0

    to_xml(CalculatorAdd(1.5, 2))    # b'<calculator_add><a>1.5</a><b>2.0</b></calculator_add>'
    from_xml(CalculatorAdd, data)    # validates against the XSD, then builds the object

The mapping: the root element is named after the class (snake_case, or
``@xmlify(root="add")``); each field is a child element of the same name, in
any order (``xs:all``). str, int, float, bool, Decimal, datetime and Enum
(str or int values) are text; a nested dataclass is an element with its own
children; ``list[T]`` is a wrapper element holding one ``<item>`` per value,
so an empty list (``<tags/>``) differs from None. ``Optional[T]`` and fields
with a default may be left out (None or the default). Strings are exact:
``"007"``, ``"true"`` and ``" x "`` come back as the same strings, and
``""`` (an empty element) differs from None (no element). Characters XML 1.0
cannot carry (most C0 controls, lone surrogates, U+FFFE/U+FFFF) are refused
by `to_xml` with `XmlUnrepresentable`, never dropped.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lxml import etree

from bus.xml.codecs import SCALARS
from bus.xml.codecs import Scalar
from bus.xml.codecs import check_type
from bus.xml.codecs import enum_scalar
from bus.xml.errors import XmlInvalid
from bus.xml.errors import XmlUnrepresentable
from bus.xml.errors import XmlValueInvalid
from bus.xml.errors import XmlifyUnsupported
from bus.xml.parser import compiled_schema
from bus.xml.parser import parse

XS = "http://www.w3.org/2001/XMLSchema"
ITEM = "item"  # the element of each value in a list
SCHEMA_VERSION = "v1"
_NCNAME = re.compile(r"[^\W\d][\w.-]*", re.UNICODE)
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")
_MISSING = dataclasses.MISSING

__all__ = ["xmlify", "to_xml", "to_element", "from_xml", "from_element", "spec_of",
           "is_xmlified", "write_schema", "XmlSpec"]


# --- the mapping: codecs for records and lists ------------------------------


@dataclass(frozen=True)
class _Field:
    name: str
    codec: Any  # Scalar | _ListOf | _Record
    optional: bool  # Optional[T]: None is written as no element
    default: Any = _MISSING
    factory: Any = _MISSING

    @property
    def required(self) -> bool:
        return not self.optional and self.default is _MISSING and self.factory is _MISSING

    def missing_value(self) -> Any:
        if self.default is not _MISSING:
            return self.default
        if self.factory is not _MISSING:
            return self.factory()
        return None


@dataclass(frozen=True)
class _ListOf:
    item: Any

    @property
    def label(self) -> str:
        return f"list of {self.item.label}"


@dataclass(frozen=True)
class _Record:
    cls: type
    fields: tuple[_Field, ...]
    by_name: dict[str, _Field] = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        self.by_name.update((f.name, f) for f in self.fields)

    @property
    def label(self) -> str:
        return self.cls.__name__


def _record(cls: type, owner: str, seen: frozenset[type]) -> _Record:
    if not dataclasses.is_dataclass(cls):
        raise XmlifyUnsupported(owner, "", f"{cls.__name__} is not a dataclass; put @dataclass "
                                           "below @xmlify")
    if cls in seen:
        raise XmlifyUnsupported(owner, "", f"{cls.__name__} contains itself; recursive "
                                           "payloads have no finite schema")
    try:
        hints = typing.get_type_hints(cls)
    except Exception as exc:  # NameError for a forward reference that is not importable
        raise XmlifyUnsupported(cls.__name__, "", f"type hints do not resolve ({exc})") from None
    fields = []
    for f in dataclasses.fields(cls):
        if not _NCNAME.fullmatch(f.name):
            raise XmlifyUnsupported(cls.__name__, f.name, "is not a valid XML element name")
        codec, optional = _codec(hints[f.name], cls.__name__, f.name, seen | {cls})
        fields.append(_Field(f.name, codec, optional, f.default, f.default_factory))
    return _Record(cls, tuple(fields))


def _codec(hint: Any, owner: str, field: str, seen: frozenset[type]) -> tuple[Any, bool]:
    """The codec for a type hint, and whether it was Optional."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) != 1 or len(args) != 2:
            raise XmlifyUnsupported(owner, field, f"{hint} is a union; only Optional[T] "
                                                  "(T | None) is supported")
        return _codec(rest[0], owner, field, seen)[0], True
    return _plain_codec(hint, owner, field, seen), False


def _plain_codec(hint: Any, owner: str, field: str, seen: frozenset[type]) -> Any:
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint) or (None,)
        if item is None:
            raise XmlifyUnsupported(owner, field, "a bare list; say list[T]")
        codec, optional = _codec(item, owner, field, seen)
        if optional:
            raise XmlifyUnsupported(owner, field, "list items cannot be Optional; leave the "
                                                  "None values out of the list")
        return _ListOf(codec)
    if hint in SCALARS:
        return SCALARS[hint]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        codec = enum_scalar(hint)
        if isinstance(codec, str):
            raise XmlifyUnsupported(owner, field, f"Enum {hint.__name__} {codec}")
        return codec
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _record(hint, owner, seen)
    raise XmlifyUnsupported(owner, field, f"type {hint!r} is not supported; use str, int, float, "
                                          "bool, Decimal, datetime, an Enum, a dataclass, "
                                          "list[T] or Optional[T]")


# --- XSD --------------------------------------------------------------------


def _xs(parent: etree._Element | None, tag: str, **attrs: str) -> etree._Element:
    name = f"{{{XS}}}{tag}"
    if parent is None:
        return etree.Element(name, attrs, nsmap={"xs": XS})
    return etree.SubElement(parent, name, attrs)


def _schema_tree(root: str, record: _Record, summary: str,
                 namespace: str | None) -> etree._Element:
    schema = _xs(None, "schema")
    if namespace is not None:  # every element of the payload is in it, nested ones too
        schema.set("targetNamespace", namespace)
        schema.set("elementFormDefault", "qualified")
    if summary:
        _xs(_xs(schema, "annotation"), "documentation").text = summary
    _declare(schema, root, record, {})
    return schema


def _declare(parent: etree._Element, name: str, codec: Any, occurs: dict[str, str]) -> None:
    element = _xs(parent, "element", name=name, **occurs)
    if isinstance(codec, Scalar):
        if codec.values:
            restriction = _xs(_xs(element, "simpleType"), "restriction", base=f"xs:{codec.xs_type}")
            for value in codec.values:
                _xs(restriction, "enumeration", value=value)
        else:
            element.set("type", f"xs:{codec.xs_type}")
    elif isinstance(codec, _ListOf):
        sequence = _xs(_xs(element, "complexType"), "sequence")
        _declare(sequence, ITEM, codec.item, {"minOccurs": "0", "maxOccurs": "unbounded"})
    else:
        complex_type = _xs(element, "complexType")
        if codec.fields:
            group = _xs(complex_type, "all")
            for f in codec.fields:
                _declare(group, f.name, f.codec, {} if f.required else {"minOccurs": "0"})


# --- encoding ---------------------------------------------------------------


def _encode(parent: etree._Element | None, name: str, codec: Any, value: Any,
            path: str, namespace: str | None = None) -> etree._Element:
    element = _new_element(parent, name, namespace)
    if isinstance(codec, Scalar):
        check_type(codec, value, path)
        element.text = codec.encode(value, path)
    elif isinstance(codec, _ListOf):
        if not isinstance(value, list):
            raise XmlUnrepresentable(path, f"expected a list, got {type(value).__name__}")
        for index, item in enumerate(value):
            _encode(element, ITEM, codec.item, item, f"{path}[{index}]", namespace)
    else:
        if not isinstance(value, codec.cls):
            raise XmlUnrepresentable(path, f"expected {codec.cls.__name__}, got "
                                           f"{type(value).__name__}")
        for f in codec.fields:
            item = getattr(value, f.name)
            if item is None and f.optional:
                continue
            _encode(element, f.name, f.codec, item, f"{path}.{f.name}", namespace)
    return element


def _new_element(parent: etree._Element | None, name: str,
                 namespace: str | None) -> etree._Element:
    """A payload element; with a namespace, qualified, declared once as the default."""
    if namespace is None:
        return etree.Element(name) if parent is None else etree.SubElement(parent, name)
    tag = f"{{{namespace}}}{name}"
    if parent is None:
        return etree.Element(tag, nsmap={None: namespace})
    return etree.SubElement(parent, tag)


# --- decoding ---------------------------------------------------------------
# Decoding assumes an element the XSD accepted (the pipeline and from_element
# validate first), so it does not re-check what the XSD already did (no text
# between elements, no attributes); it still refuses unknown or repeated
# children. Paths for messages are built only when something is wrong.


def _decode(element: etree._Element, codec: Any, path: str) -> Any:
    if type(codec) is Scalar:
        try:
            return codec.decode(element.text or "", "")
        except XmlValueInvalid as exc:
            raise XmlValueInvalid(path, exc.reason.partition(": ")[2], element.sourceline) \
                from None
    if type(codec) is _ListOf:
        return [_decode(child, codec.item, f"{path}[{index}]")
                for index, child in enumerate(element)]
    return _decode_record(element, codec, path)


def _decode_record(element: etree._Element, record: _Record, path: str) -> Any:
    values: dict[str, Any] = {}
    for child in element:
        name = child.tag
        if name[0] == "{":  # a namespaced payload: the XSD has checked the namespace
            name = name.rpartition("}")[2]
        field = record.by_name.get(name)
        if field is None or name in values:
            raise XmlValueInvalid(f"{path}.{name}", "is unexpected or repeated; send each "
                                  f"field once: {', '.join(record.by_name)}", child.sourceline)
        codec = field.codec
        if type(codec) is Scalar:  # inlined: the common case, on the hot path
            try:
                values[name] = codec.decode(child.text or "", "")
                continue
            except XmlValueInvalid as exc:
                raise XmlValueInvalid(f"{path}.{name}", exc.reason.partition(": ")[2],
                                      child.sourceline) from None
        values[name] = _decode(child, codec, f"{path}.{name}")
    if len(values) < len(record.fields):
        _fill_missing(element, record, path, values)
    return record.cls(**values)


def _fill_missing(element: etree._Element, record: _Record, path: str,
                  values: dict[str, Any]) -> None:
    for f in record.fields:
        if f.name not in values:
            if f.required:
                raise XmlValueInvalid(f"{path}.{f.name}", "is missing; add the element",
                                      element.sourceline)
            values[f.name] = f.missing_value()


# --- the plain form ---------------------------------------------------------
# The pipeline's hot path: a record of str, int, float and bool fields, written
# as `to_xml` writes it (fields in declaration order, no attributes, numbers
# without surrounding whitespace), is read from the message's C14N bytes with
# one regular expression instead of the XSD (2.5-3.5 us on a fresh document)
# and a walk of the tree. Each pattern is a subset of its XSD type's lexical
# space, so a plain payload is a valid one (tests/xml/test_xml_payload.py checks
# that against the XSD); for anything else the XSD decides.

def _unescape(text: bytes) -> str:
    """The text of C14N character data (which escapes exactly these four)."""
    if b"&" in text:  # &amp; last, so that "&amp;lt;" stays "&lt;"
        text = text.replace(b"&lt;", b"<").replace(b"&gt;", b">").replace(
            b"&#xD;", b"\r").replace(b"&amp;", b"&")
    return text.decode()


# By codec: the pattern of a field's C14N text, and a decoder that gives what
# the codec gives for such a text. Enums, Decimal and datetime are never plain.
_PLAIN_TEXT = {
    # No possessive quantifiers (Python 3.11+); each repeat starts with "&", which
    # [^<&] cannot match, so there is one way to match and backtracking stays linear.
    SCALARS[str]: (rb"([^<&]*(?:&(?:amp|lt|gt|#xD);[^<&]*)*)", _unescape),
    SCALARS[int]: (rb"(-?[0-9]{1,18})", int),
    # repr() writes up to 17 significant digits, after up to 3 zeros below 1e-3
    # (0.000123...; smaller values get an exponent): 20 digits after the point.
    SCALARS[float]: (rb"(-?[0-9]{1,17}(?:\.[0-9]{1,20})?(?:[eE][+-]?[0-9]{1,3})?)", float),
    SCALARS[bool]: (rb"(true|false|1|0)", lambda text: text in (b"true", b"1")),
}


def _plain_form(root: str, record: _Record) -> tuple[bytes | None, tuple]:
    """The regex source of the plain payload in C14N form and a decoder per group; or None."""
    def tag(name: str, end: str = "") -> bytes:
        return re.escape(f"<{end}{name}>".encode())

    parts = [tag(root)]
    fields = []
    for f in record.fields:
        if type(f.codec) is not Scalar or f.codec not in _PLAIN_TEXT:
            return None, ()
        pattern, decode = _PLAIN_TEXT[f.codec]
        element = tag(f.name) + pattern + tag(f.name, "/")
        parts.append(element if f.required else b"(?:" + element + b")?")
        fields.append((f.name, decode, f))
    parts.append(tag(root, "/"))
    return b"".join(parts), tuple(fields)


# --- the decorator and the public API ----------------------------------------


@dataclass(frozen=True)
class XmlSpec:
    """What `@xmlify` derived for a class, stored on it as ``__xmlify__``."""

    cls: type
    root: str
    record: _Record
    xsd: bytes  # the XSD document, pretty-printed
    example: bytes  # an example payload that validates
    usage: str  # summary line, fields, example: a tool description for an LLM
    plain: bytes | None = None  # regex source of the plain form (see _plain_form)
    plain_decoders: tuple[tuple[str, Any, _Field], ...] = ()  # name, decoder, field per group
    namespace: str | None = None  # the payload's XML namespace, if it has one

    @property
    def tag(self) -> str:
        """The root element's tag as lxml spells it: ``{namespace}root`` or ``root``."""
        return self.root if self.namespace is None else f"{{{self.namespace}}}{self.root}"

    @property
    def schema(self) -> etree.XMLSchema:
        """The compiled XSD (once per thread: lxml schemas must not be shared)."""
        return compiled_schema(self.xsd)

    def validate(self, element: etree._Element) -> None:
        """Raise `XmlInvalid` ("payload-invalid") with the first error's line."""
        schema = compiled_schema(self.xsd)
        if not schema(element):
            first = schema.error_log[0]
            raise XmlInvalid("payload", first.message, first.line, first.column)

    def decode(self, element: etree._Element) -> Any:
        """The typed object of a validated payload element."""
        return _decode_record(element, self.record, self.root)

    def decode_plain(self, texts: tuple[bytes | None, ...]) -> Any:
        """The typed object of a plain payload: the groups of a match of `plain`, in C14N form."""
        values = {}
        for (name, decode, field), text in zip(self.plain_decoders, texts):
            values[name] = field.missing_value() if text is None else decode(text)
        return self.cls(**values)


def xmlify(cls: type | None = None, *, root: str | None = None,
           namespace: str | None = None) -> Any:
    """Derive an XML payload schema for a dataclass; ``@xmlify`` or ``@xmlify(root="add")``.

    With ``namespace="https://example.org/ns/calc/v1"`` the payload's
    elements are in that namespace (the XSD's targetNamespace, elements
    qualified) and `to_xml` declares it as the default namespace.

    Raises `XmlifyUnsupported` for a field type outside the mapping (see the
    module docstring). The XSD, example and usage text are built once, here.
    """
    def decorate(target: type) -> type:
        name = root or re.sub(r"(?<!^)(?=[A-Z])", "_", target.__name__).lower()
        if not _NCNAME.fullmatch(name):
            raise XmlifyUnsupported(target.__name__, "", f"root {name!r} is not an XML name; "
                                                         "pass root='a_name'")
        if namespace is not None and (not isinstance(namespace, str) or not namespace.strip()
                                      or any(c.isspace() for c in namespace)):
            raise XmlifyUnsupported(target.__name__, "", f"namespace {namespace!r} is not a "
                                    "namespace URI; pass one like 'https://example.org/ns/v1'")
        target.__xmlify__ = _build_spec(target, name, namespace)
        return target

    return decorate if cls is None else decorate(cls)


def _build_spec(cls: type, root: str, namespace: str | None = None) -> XmlSpec:
    record = _record(cls, cls.__name__, frozenset())
    summary = _summary(cls)
    tree = _schema_tree(root, record, summary, namespace)
    example = etree.tostring(_example(None, root, record, namespace), pretty_print=True)
    usage = "\n".join([f"<{root}>: {summary}" if summary else f"<{root}>", "Fields:",
                       *_field_lines(record, "  "), "Example:", example.decode().rstrip()])
    xsd = etree.tostring(tree, pretty_print=True)
    compiled_schema(xsd)  # an XSD libxml2 refuses fails here, at decoration
    # The plain fast path reads un-namespaced C14N bytes only; a namespaced payload
    # always goes through its XSD.
    plain = _plain_form(root, record) if namespace is None else (None, ())
    return XmlSpec(cls, root, record, xsd, example, usage, *plain, namespace)


def _summary(cls: type) -> str:
    doc = (cls.__doc__ or "").strip()
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclass writes when none is given
        return ""
    return doc.split("\n\n")[0].replace("\n", " ").strip()


def _example(parent: etree._Element | None, name: str, codec: Any,
             namespace: str | None = None) -> etree._Element:
    element = _new_element(parent, name, namespace)
    if isinstance(codec, Scalar):
        element.text = codec.example
    elif isinstance(codec, _ListOf):
        _example(element, ITEM, codec.item, namespace)
    else:
        for f in codec.fields:
            _example(element, f.name, f.codec, namespace)
    return element


def _field_lines(record: _Record, indent: str) -> list[str]:
    lines = []
    for f in record.fields:
        need = "required" if f.required else "optional"
        if f.default is not _MISSING and f.default is not None:
            shown = f.default.value if isinstance(f.default, enum.Enum) else f.default
            need = f"optional, default {shown!r}"
        lines.append(f"{indent}{f.name} ({f.codec.label}, {need})")
        if isinstance(f.codec, _Record):
            lines.extend(_field_lines(f.codec, indent + "  "))
    return lines


def is_xmlified(cls: Any) -> bool:
    return isinstance(getattr(cls, "__xmlify__", None), XmlSpec)


def spec_of(cls: type) -> XmlSpec:
    """The `XmlSpec` of an ``@xmlify`` class; `XmlifyUnsupported` for any other."""
    spec = getattr(cls, "__xmlify__", None)
    if not isinstance(spec, XmlSpec) or spec.cls is not cls:
        name = getattr(cls, "__name__", repr(cls))
        raise XmlifyUnsupported(name, "", "is not an @xmlify class; decorate it with @xmlify")
    return spec


def to_element(obj: Any) -> etree._Element:
    """The payload element of an ``@xmlify`` instance (a new, detached element).

    Raises `XmlUnrepresentable` naming the field when a value cannot be XML.
    """
    spec = spec_of(type(obj))
    return _encode(None, spec.root, spec.record, obj, spec.root, spec.namespace)


def to_xml(obj: Any) -> bytes:
    """`to_element` serialized as UTF-8 bytes (no XML declaration)."""
    return etree.tostring(to_element(obj))


def from_element(cls: type, element: etree._Element) -> Any:
    """Validate `element` against `cls`'s XSD and build the object.

    Raises `XmlInvalid` (code "payload-invalid") or `XmlValueInvalid`.
    """
    spec = spec_of(cls)
    spec.validate(element)
    return spec.decode(element)


def from_xml(cls: type, data: bytes | str) -> Any:
    """Parse (hardened, no repair), validate and build an instance of `cls`.

    Raises an `XmlRejected` subclass: a parse error, `XmlInvalid` or `XmlValueInvalid`.
    """
    raw = data.encode() if isinstance(data, str) else data
    return from_element(cls, parse(raw))


def write_schema(cls: type, listener: str, directory: str | Path = "schemas") -> Path:
    """Write the XSD to ``<directory>/<listener>/<root>/v1.xsd`` and return the path.

    `listener` is one path component: letters, digits and ``. _ -``, not
    starting with a dot. The file is replaced atomically.
    """
    spec = spec_of(cls)
    if not _SAFE_NAME.fullmatch(listener):
        raise XmlifyUnsupported(cls.__name__, "listener", f"{listener!r} is not a safe directory "
                                "name; use 1-128 letters, digits, '.', '_' or '-', "
                                "not starting with '.'")
    target = Path(directory) / listener / spec.root / f"{SCHEMA_VERSION}.xsd"
    target.parent.mkdir(parents=True, exist_ok=True)
    temporary = target.with_suffix(".xsd.tmp")
    temporary.write_bytes(spec.xsd)
    temporary.replace(target)
    return target
