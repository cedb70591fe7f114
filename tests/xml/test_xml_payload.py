"""`@xmlify`: round trips for every supported type, the derived XSD, refusals."""

from __future__ import annotations

import enum
import math
import re
import shutil
import subprocess
import typing
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timedelta
from datetime import timezone
from decimal import Decimal
from pathlib import Path
from typing import Optional

import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from bus.xml import canonicalize
from bus.xml import from_xml
from bus.xml import parse
from bus.xml import spec_of
from bus.xml import to_element
from bus.xml import to_xml
from bus.xml import write_schema
from bus.xml import xmlify
from bus.xml.errors import XmlInvalid
from bus.xml.errors import XmlRejected
from bus.xml.errors import XmlUnrepresentable
from bus.xml.errors import XmlValueInvalid
from bus.xml.errors import XmlifyUnsupported
from tests.support.properties import scaled_settings


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.Enum):
    LOW = 1
    HIGH = 10


@dataclass
class Inner:
    x: int
    note: Optional[str] = None


def single(name: str, hint: object) -> type:
    """An @xmlify dataclass with one field `v` of type `hint`."""
    cls = dataclass(type(name, (), {"__annotations__": {"v": hint}, "__module__": __name__}))
    globals()[name] = cls  # so that get_type_hints can resolve it like a module-level class
    return xmlify(cls)


# XML 1.0 characters: everything but C0 controls other than tab/LF/CR, surrogates, FFFE/FFFF.
XML_CHARS = st.characters(blacklist_categories=("Cs",)).filter(
    lambda c: (c >= " " or c in "\t\n\r") and c not in "\ufffe\uffff")
TRICKY = st.sampled_from(["", " ", " x ", "007", "true", "false", "0", "None", "\r\n", "\r",
                          "]]>", "<a>&amp;</a>", "\t tab", "日本語", "😀", "\n\n"])
TEXTS = TRICKY | st.text(XML_CHARS, max_size=30)
ZONES = st.none() | st.integers(-14 * 60, 14 * 60).map(
    lambda m: timezone(timedelta(minutes=m)))
CASES = [
    ("str", str, TEXTS),
    ("int", int, st.integers() | st.sampled_from([0, -1, 10 ** 40])),
    ("float", float, st.floats(allow_nan=False)),
    ("bool", bool, st.booleans()),
    ("decimal", Decimal, st.decimals(allow_nan=False, allow_infinity=False,
                                     min_value=Decimal("-1e20"), max_value=Decimal("1e20"))),
    ("datetime", datetime, st.datetimes(timezones=ZONES)),
    ("enum_str", Color, st.sampled_from(Color)),
    ("enum_int", Level, st.sampled_from(Level)),
    ("optional_str", Optional[str], st.none() | TEXTS),
    ("optional_int", Optional[int], st.none() | st.integers()),
    ("list_str", list[str], st.lists(TEXTS, max_size=5)),
    ("list_float", list[float], st.lists(st.floats(allow_nan=False), max_size=5)),
    ("nested", Inner, st.builds(Inner, st.integers(), st.none() | TEXTS)),
    ("optional_nested", Optional[Inner], st.none() | st.builds(Inner, st.integers())),
    ("list_nested", list[Inner], st.lists(st.builds(Inner, st.integers(), TEXTS), max_size=3)),
    ("list_list", list[list[int]], st.lists(st.lists(st.integers(), max_size=3), max_size=3)),
]
CLASSES = {name: single(f"V_{name}", hint) for name, hint, _ in CASES}


@pytest.mark.parametrize("name, values", [(name, values) for name, _, values in CASES],
                         ids=[c[0] for c in CASES])
def test_payload_round_trip_and_xsd(name: str, values: st.SearchStrategy) -> None:
    cls = CLASSES[name]
    spec = spec_of(cls)

    @given(values)
    def check(value: object) -> None:
        obj = cls(value)
        data = to_xml(obj)
        assert spec.schema.validate(etree.fromstring(data)), spec.schema.error_log
        back = from_xml(cls, data)
        assert back == obj
        assert type(back.v) is type(value)

    check()


def test_payload_strings_stay_strings() -> None:
    cls = CLASSES["str"]
    for text in ["007", "true", " x ", "", "1e5", "\r\n"]:
        assert from_xml(cls, to_xml(cls(text))).v == text


def test_payload_empty_string_differs_from_none() -> None:
    cls = CLASSES["optional_str"]
    assert to_xml(cls("")) == b"<v_optional_str><v></v></v_optional_str>"
    assert to_xml(cls(None)) == b"<v_optional_str/>"
    assert from_xml(cls, to_xml(cls(""))).v == ""
    assert from_xml(cls, to_xml(cls(None))).v is None


def test_payload_empty_list_differs_from_none() -> None:
    @xmlify
    @dataclass
    class Tags:
        tags: Optional[list[str]] = None

    assert from_xml(Tags, to_xml(Tags([]))).tags == []
    assert from_xml(Tags, to_xml(Tags(None))).tags is None


def test_payload_float_specials() -> None:
    cls = CLASSES["float"]
    assert to_xml(cls(float("inf"))) == b"<v_float><v>INF</v></v_float>"
    assert math.isnan(from_xml(cls, to_xml(cls(float("nan")))).v)
    assert math.copysign(1, from_xml(cls, to_xml(cls(-0.0))).v) == -1


@pytest.mark.parametrize("text", ["\x00", "a\x01b", "\x1f", "\ufffe", "\ud800", "x\uffff"])
def test_to_xml_refuses_characters_xml_cannot_carry(text: str) -> None:
    with pytest.raises(XmlUnrepresentable) as raised:
        to_xml(CLASSES["str"](text))
    assert raised.value.field == "v_str.v"
    assert f"U+{ord(text.strip('ax')[0]):04X}" in str(raised.value)


def test_to_xml_refuses_unrepresentable_values() -> None:
    with pytest.raises(XmlUnrepresentable, match="finite Decimal"):
        to_xml(CLASSES["decimal"](Decimal("NaN")))
    odd = timezone(timedelta(minutes=5, seconds=30))
    with pytest.raises(XmlUnrepresentable, match="convert the value to UTC"):
        to_xml(CLASSES["datetime"](datetime(2026, 1, 1, tzinfo=odd)))
    with pytest.raises(XmlUnrepresentable, match="expected int, got bool"):
        to_xml(CLASSES["int"](True))
    with pytest.raises(XmlUnrepresentable) as raised:
        to_xml(CLASSES["list_nested"]([Inner(1), "x"]))
    assert raised.value.field == "v_list_nested.v[1]"


@pytest.mark.parametrize("text, reason", [
    ("2026-01-01T00:00:00.1234567", "microsecond"),
    ("10000-01-01T00:00:00", "outside Python's datetime"),
    ("2026-01-01T24:00:00", "outside Python's datetime"),
])
def test_from_xml_refuses_datetimes_python_cannot_hold(text: str, reason: str) -> None:
    with pytest.raises(XmlValueInvalid, match=reason) as raised:
        from_xml(CLASSES["datetime"], f"<v_datetime><v>{text}</v></v_datetime>")
    assert raised.value.field == "v_datetime.v"


def test_from_xml_accepts_xsd_lexical_forms() -> None:
    assert from_xml(CLASSES["bool"], "<v_bool><v> 1 </v></v_bool>").v is True
    assert from_xml(CLASSES["int"], "<v_int><v>+007</v></v_int>").v == 7
    assert from_xml(CLASSES["datetime"], "<v_datetime><v>2026-01-01T00:00:00Z</v></v_datetime>"
                    ).v == datetime(2026, 1, 1, tzinfo=timezone.utc)


def test_from_xml_schema_errors_name_the_line() -> None:
    cls = CLASSES["nested"]
    with pytest.raises(XmlInvalid) as raised:
        from_xml(cls, "<v_nested>\n<v>\n<x>one</x>\n</v>\n</v_nested>")
    assert (raised.value.code, raised.value.line) == ("payload-invalid", 3)
    assert "'x'" in str(raised.value)
    with pytest.raises(XmlInvalid, match="Missing child element"):
        from_xml(cls, "<v_nested><v/></v_nested>")
    with pytest.raises(XmlInvalid, match="attribute"):
        from_xml(cls, '<v_nested><v x="1"><x>1</x></v></v_nested>')


def test_xmlify_defaults_fill_missing_fields() -> None:
    @xmlify(root="job")
    @dataclass
    class Job:
        """Run a job.

        Longer text that is not part of the summary.
        """
        name: str
        retries: int = 3
        tags: list[str] = field(default_factory=lambda: ["x"])
        color: Color = Color.GREEN

    assert from_xml(Job, "<job><name>a</name></job>") == Job("a", 3, ["x"], Color.GREEN)
    spec = spec_of(Job)
    assert spec.usage.splitlines()[:6] == [
        "<job>: Run a job.", "Fields:", "  name (str, required)",
        "  retries (int, optional, default 3)", "  tags (list of str, optional)",
        "  color (one of red|green, optional, default 'green')"]
    assert from_xml(Job, spec.example) == Job("text", 1, ["text"], Color.RED)


def test_xmlify_root_defaults_to_snake_case() -> None:
    @xmlify
    @dataclass
    class CalculatorAdd:
        a: float

    assert spec_of(CalculatorAdd).root == "calculator_add"
    assert spec_of(CalculatorAdd).usage.startswith("<calculator_add>\n")


@dataclass
class Loop:
    next: Optional[Loop] = None


class NotData:
    x: int


@pytest.mark.parametrize("hint, message", [
    (tuple[int, int], "is not supported"),
    (dict[str, int], "is not supported"),
    (int | str, "only Optional"),
    (list[Optional[int]], "cannot be Optional"),
    (list, r"list\[T\]"),
    (typing.List, r"say list\[T\]"),
    (Loop, "contains itself"),
    (NotData, "is not supported"),
    (enum.Enum("Mixed", {"A": 1, "B": "b"}), "all str or all int"),
])
def test_xmlify_refuses_unsupported_types(hint: object, message: str) -> None:
    with pytest.raises(XmlifyUnsupported, match=message):
        single("Unsupported", hint)


def test_xmlify_refuses_non_dataclass_and_bad_root() -> None:
    with pytest.raises(XmlifyUnsupported, match="put @dataclass below @xmlify"):
        xmlify(NotData)
    with pytest.raises(XmlifyUnsupported, match="not an XML name"):
        xmlify(root="1bad")(Inner)
    with pytest.raises(XmlifyUnsupported, match="decorate it with @xmlify"):
        to_element(Inner(1))


def test_write_schema_path_and_refusals(tmp_path: Path) -> None:
    cls = CLASSES["nested"]
    path = write_schema(cls, "calculator", tmp_path / "schemas")
    assert path == tmp_path / "schemas" / "calculator" / "v_nested" / "v1.xsd"
    assert path.read_bytes() == spec_of(cls).xsd
    for bad in ["..", ".hidden", "a/b", ""]:
        with pytest.raises(XmlifyUnsupported, match="safe directory name"):
            write_schema(cls, bad, tmp_path / "schemas")
    assert sorted(p.name for p in (tmp_path / "schemas").iterdir()) == ["calculator"]


def test_generated_xsd_validates_with_xmllint(tmp_path: Path) -> None:
    xmllint = shutil.which("xmllint")
    if xmllint is None:
        pytest.skip("xmllint is not installed (Debian: apt-get install libxml2-utils; "
                    "`make test` installs it when it can)")
    for name, cls in CLASSES.items():
        spec = spec_of(cls)
        schema = tmp_path / f"{name}.xsd"
        schema.write_bytes(spec.xsd)
        example = tmp_path / f"{name}.xml"
        example.write_bytes(spec.example)
        done = subprocess.run([xmllint, "--noout", "--schema", str(schema), str(example)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, (name, done.stderr)
        assert "validates" in done.stderr
    bad = tmp_path / "bad.xml"
    bad.write_bytes(b"<v_int><v>x</v></v_int>")
    done = subprocess.run([xmllint, "--noout", "--schema", str(tmp_path / "int.xsd"), str(bad)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode != 0 and "fails to validate" in done.stderr


@xmlify(root="call")
@dataclass
class Call:
    name: str
    count: int
    ratio: float
    flag: bool
    limit: Optional[int] = None
    label: str = "x"


# Raw XML text: every way a character can be written (escapes, character
# references, CR, CDATA, comments), and the lexical edge cases of xs:integer,
# xs:double and xs:boolean.
RAW_TEXTS = st.lists(st.sampled_from([
    "0", "7", "-", "+", ".", "5", "e", "E", "+3", "-2", "INF", "NaN", "true", "1", " ", "\t",
    "\n", "\r\n", "a", "&amp;", "&lt;", "&gt;", "&#xD;", "&#13;", "&quot;", "&apos;", "&#x41;",
    ">", "'", '"', "日本", "<![CDATA[<x>]]>", "<!--c-->", "]]", "&amp;lt;"]), max_size=6).map("".join)
DIGITS = st.text("0123456789", min_size=1, max_size=20)
INTEGERS = st.integers(-10 ** 6, 10 ** 6).map(str) | st.integers().map(str)
NUMBERS = st.one_of(
    INTEGERS, st.floats().map(repr),
    st.tuples(st.sampled_from(["", "-", "+"]), DIGITS, st.sampled_from(["", ".", "."]),
              st.text("0123456789", max_size=20), st.sampled_from(["", "e", "E-", "e+"]),
              st.text("0123456789", max_size=4)).map("".join),
    st.sampled_from(["1e999", "-1e-999", "1.5e+308", "9" * 18, "9" * 19, "-0", "00.50", "0x1",
                     "1_000", "١٢", " 1", "1 ", "inf", "-INF", "+INF"]))
ODD_TEXTS = st.one_of(RAW_TEXTS, NUMBERS, st.sampled_from(["True", " true", "yes", "", "01"]))


@st.composite
def call_documents(draw: st.DrawFn) -> bytes:
    """A payload as to_xml writes it, mostly; then one odd text, order, repeat or start tag."""
    texts = {"name": draw(RAW_TEXTS), "count": draw(INTEGERS),
             "ratio": draw(st.floats(allow_nan=False).map(repr) | INTEGERS),
             "flag": draw(st.sampled_from(["true", "false", "1", "0"])),
             "limit": draw(st.none() | INTEGERS), "label": draw(st.none() | RAW_TEXTS)}
    if draw(st.booleans()):
        texts[draw(st.sampled_from(list(texts)))] = draw(ODD_TEXTS)
    names = [name for name, text in texts.items() if text is not None]
    if draw(st.integers(0, 4)) == 0:
        names = draw(st.permutations(names))
    if draw(st.integers(0, 4)) == 0:
        names = [*names, draw(st.sampled_from(names))]
    if draw(st.integers(0, 4)) == 0:
        names.remove(draw(st.sampled_from(names)))
    start = draw(st.sampled_from(["<call>"] * 6 + ['<call a="1">', "<call >"]))
    children = "".join(f"<{n}>{texts[n]}</{n}>" for n in names)
    return f"{start}{children}</call>".encode()


def plain_match(data: bytes) -> tuple[etree._Element, re.Match | None] | None:
    """The parsed payload and the match of its plain form (None if `data` does not parse)."""
    try:
        root = parse(data)
    except XmlRejected:
        return None
    return root, re.compile(spec_of(Call).plain + rb"\Z").search(canonicalize(root))


def test_plain_payload_is_valid_and_decodes_like_the_tree() -> None:
    """The plain form (a regex over C14N bytes) accepts only what the XSD accepts, and reads it alike."""
    spec = spec_of(Call)
    hits = []
    examples = scaled_settings(max_examples=1000)

    @examples
    @given(call_documents())
    def check(data: bytes) -> None:
        parsed = plain_match(data)
        if parsed is None or parsed[1] is None:
            return
        hits.append(data)
        root, found = parsed
        assert spec.schema.validate(root), (data, spec.schema.error_log)
        assert spec.decode_plain(found.groups()) == spec.decode(root)

    check()
    # the strategy reaches the plain form: the test is not vacuous
    assert len(hits) > examples.max_examples // 10  # about one in four reaches it


@example(Call("", 0, 0.007705337909260689, False, None, ""))  # 18 digits after the point
@example(Call("", 0, 0.00012345678901234567, False, None, ""))  # the most: 20
@given(st.builds(Call, TEXTS, st.integers(-10 ** 18 + 1, 10 ** 18 - 1), st.floats(allow_nan=False, allow_infinity=False),
                 st.booleans(), st.none() | st.integers(0, 10), TEXTS))
def test_plain_payload_is_what_to_xml_writes(call: Call) -> None:
    root, found = plain_match(to_xml(call))
    assert found is not None
    assert spec_of(Call).decode_plain(found.groups()) == call


def test_plain_form_only_for_flat_scalar_records() -> None:
    assert spec_of(Call).plain is not None
    for name in ("str", "int", "float", "bool", "optional_str", "optional_int"):
        assert spec_of(CLASSES[name]).plain is not None, name
    for name in ("decimal", "datetime", "enum_str", "enum_int", "list_str", "nested",
                 "optional_nested"):
        assert spec_of(CLASSES[name]).plain is None, name


# --- namespaced payloads -------------------------------------------------------

NS = "https://example.org/ns/search/v1"


@dataclass
class NsWindow:
    start: int
    size: int = 10


@xmlify(root="search", namespace=NS)
@dataclass
class NsSearch:
    """Search the web."""

    query: str
    limit: int = 10
    tags: Optional[list[str]] = None
    window: Optional[NsWindow] = None


def test_namespaced_payload_round_trips_with_a_default_namespace() -> None:
    value = NsSearch("lxml", 3, ["a", "b"], NsWindow(20, 5))
    data = to_xml(value)
    assert data.startswith(f'<search xmlns="{NS}"><query>lxml</query>'.encode())
    assert from_xml(NsSearch, data) == value
    assert etree.QName(to_element(value)).namespace == NS
    assert all(etree.QName(e).namespace == NS for e in to_element(value).iter())


def test_namespaced_xsd_targets_the_namespace_with_qualified_elements() -> None:
    spec = spec_of(NsSearch)
    schema = etree.fromstring(spec.xsd)
    assert (schema.get("targetNamespace"), schema.get("elementFormDefault")) == (NS, "qualified")
    assert spec.tag == f"{{{NS}}}search" and spec.plain is None
    assert from_xml(NsSearch, spec.example) == NsSearch("text", 1, ["text"], NsWindow(1, 1))


@pytest.mark.parametrize("data", [
    b"<search><query>q</query></search>",  # no namespace
    b'<search xmlns="urn:other"><query>q</query></search>',  # another namespace
    f'<search xmlns="{NS}"><query xmlns="">q</query></search>'.encode(),  # unqualified child
])
def test_namespaced_payload_in_the_wrong_namespace_is_invalid(data: bytes) -> None:
    with pytest.raises(XmlInvalid) as raised:
        from_xml(NsSearch, data)
    assert raised.value.code == "payload-invalid"


@pytest.mark.parametrize("namespace", ["", "has space", 7])
def test_xmlify_refuses_a_namespace_that_is_not_a_uri(namespace) -> None:
    with pytest.raises(XmlifyUnsupported, match="is not a namespace URI"):
        @xmlify(namespace=namespace)
        @dataclass
        class Bad:
            x: int


def test_namespaced_xsd_validates_with_xmllint(tmp_path: Path) -> None:
    xmllint = shutil.which("xmllint")
    if xmllint is None:
        pytest.skip("xmllint is not installed (Debian: apt-get install libxml2-utils)")
    spec = spec_of(NsSearch)
    (tmp_path / "s.xsd").write_bytes(spec.xsd)
    (tmp_path / "s.xml").write_bytes(to_xml(NsSearch("q", tags=["x"])))
    done = subprocess.run([xmllint, "--noout", "--schema", str(tmp_path / "s.xsd"),
                           str(tmp_path / "s.xml")], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "validates" in done.stderr, done.stderr
