"""Hardened parsing and repair against the hostile corpus in tests/data/xml/.

Every input either gives its specific named error or a repair that lists
each change; none reads a file, opens a connection or runs longer than a
second (a SIGALRM guard, a bound on blowups, not a benchmark).
"""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest
from hypothesis import example
from hypothesis import given
from hypothesis import strategies as st
from lxml import etree

from bus.xml import canonicalize
from bus.xml import parse
from bus.xml import repair
from bus.xml.errors import XmlDoctypeRefused
from bus.xml.errors import XmlEmpty
from bus.xml.errors import XmlEncodingInvalid
from bus.xml.errors import XmlMalformed
from bus.xml.errors import XmlMultipleRoots
from bus.xml.errors import XmlRejected
from bus.xml.errors import XmlTextTooLong
from bus.xml.errors import XmlTooDeep
from bus.xml.errors import XmlTooLarge
from bus.xml.parser import MAX_TEXT_BYTES
from bus.xml.parser import _parser
from bus.xml.parser import parse_or_repair

CORPUS = Path(__file__).parent.parent / "data" / "xml"
SECRET = "agentbus-secret-7f3a9c"


def corpus(name: str) -> bytes:
    return (CORPUS / name).read_bytes()


class TookTooLong(Exception):
    pass


@pytest.fixture(autouse=True)
def within_a_second():
    """Fail any test here that runs longer than one second (an entity blowup would)."""
    def expire(signum, frame):
        raise TookTooLong("the input took more than a second")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def listening_port():
    """A port on 127.0.0.1 that listens but never accepts: a connection would queue."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


def assert_no_connection(server: socket.socket) -> None:
    # The kernel completes a TCP handshake into the backlog without accept(),
    # so any connection attempted during the (synchronous) parse is waiting here.
    with pytest.raises(BlockingIOError):
        server.accept()


# --- the hostile corpus ---------------------------------------------------------


@pytest.mark.parametrize("name, error", [
    ("billion_laughs.xml", XmlDoctypeRefused),
    ("quadratic_blowup.xml", XmlDoctypeRefused),
    ("doctype.xml", XmlDoctypeRefused),
    ("doctype_utf16.xml", XmlDoctypeRefused),
    ("doctype_utf32.xml", XmlDoctypeRefused),
    ("entity_utf16.xml", XmlDoctypeRefused),
    ("entity_utf32.xml", XmlDoctypeRefused),
    ("deep_nesting.xml", XmlTooDeep),
    ("invalid_utf8.xml", XmlEncodingInvalid),
    ("two_roots.xml", XmlMultipleRoots),
    ("empty.xml", XmlEmpty),
    ("undefined_entity.xml", XmlMalformed),
    ("unclosed.xml", XmlMalformed),
])
def test_parse_hostile_input_gives_named_error(name: str, error: type) -> None:
    with pytest.raises(error) as raised:
        parse_or_repair(corpus(name))
    assert type(raised.value) is error  # the specific error, not a broader one
    assert ";" in raised.value.reason  # the problem; then the fix


def test_parse_error_positions_and_codes() -> None:
    cases = {
        "deep_nesting.xml": ("too-deep", 1),
        "invalid_utf8.xml": ("encoding", 1),
        "two_roots.xml": ("multiple-roots", 2),
        "unclosed.xml": ("malformed", 1),
        "doctype.xml": ("doctype", 1),
        "doctype_utf16.xml": ("doctype", 1),  # positions in characters, not UTF-16 bytes
        "entity_utf32.xml": ("doctype", 2),
    }
    for name, (code, line) in cases.items():
        with pytest.raises(XmlRejected) as raised:
            parse_or_repair(corpus(name))
        assert (raised.value.code, raised.value.line) == (code, line), name
        assert raised.value.column >= 1, name


def test_parse_invalid_utf8_names_the_byte() -> None:
    with pytest.raises(XmlEncodingInvalid) as raised:
        parse_or_repair(corpus("invalid_utf8.xml"))
    assert raised.value.offset == 9
    assert (raised.value.line, raised.value.column) == (1, 10)


def test_parse_nesting_of_256_is_accepted() -> None:
    root = parse(corpus("deep_nesting_ok.xml"))
    assert sum(1 for _ in root.iter()) == 256


def test_parse_text_node_over_10_mb_is_refused() -> None:
    data = b"<a>" + b"x" * (MAX_TEXT_BYTES + 1) + b"</a>"
    with pytest.raises(XmlTextTooLong) as raised:
        parse(data)
    assert raised.value.code == "text-too-long"
    assert raised.value.limit == MAX_TEXT_BYTES


def test_parse_size_limit_is_checked_before_parsing() -> None:
    with pytest.raises(XmlTooLarge) as raised:
        parse(b"<a>" + b"x" * 100 + b"</a>", max_bytes=50)
    assert (raised.value.size, raised.value.limit) == (107, 50)


def test_parse_whitespace_only_is_empty() -> None:
    with pytest.raises(XmlEmpty):
        parse_or_repair(b" \n\t ")


def test_xxe_local_file_is_never_read(tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text(SECRET)
    data = (CORPUS / "xxe_file.xml.tmpl").read_text().format(path=secret).encode()
    with pytest.raises(XmlDoctypeRefused) as raised:
        parse_or_repair(data)
    assert SECRET not in str(raised.value)
    # The parser underneath does not load the entity either, even before the refusal.
    tree = etree.fromstring(data, _parser())
    assert SECRET not in etree.tostring(tree).decode()
    assert SECRET not in (tree.text or "")


@pytest.mark.parametrize("template", ["xxe_url.xml.tmpl", "xxe_dtd_url.xml.tmpl"])
def test_xxe_url_opens_no_connection(listening_port: socket.socket, template: str) -> None:
    port = listening_port.getsockname()[1]
    data = (CORPUS / template).read_text().format(port=port).encode()
    with pytest.raises(XmlDoctypeRefused):
        parse_or_repair(data)
    etree.fromstring(data, _parser())  # the raw hardened parser alone fetches nothing
    assert_no_connection(listening_port)


def test_lxml_recover_mode_loses_data_so_repair_does_not_use_it() -> None:
    """Why repair() exists: recover=True drops the '&' and the second root silently."""
    recover = etree.XMLParser(recover=True)
    assert etree.fromstring(b"<a>x & y</a>", recover).text == "x  y"
    assert etree.tostring(etree.fromstring(b"<a/><b/>", recover)) == b"<a/>"


# --- repair: lossless and reported ------------------------------------------------


def test_repair_strips_prose_and_reports_it() -> None:
    parsed = parse_or_repair(corpus("prose_wrapped.xml"))
    assert etree.tostring(parsed.root) == b"<note><to>ops</to><body>disk is full</body></note>"
    assert [(r.kind, r.line, r.column) for r in parsed.repairs] == [
        ("stripped-prose", 1, 1), ("stripped-prose", 5, 1)]
    assert parsed.repairs[0].detail == "Sure! Here is the message you asked for:"
    assert parsed.root.sourceline == 3  # line numbers still match the input


def test_repair_escapes_bare_ampersands() -> None:
    parsed = parse_or_repair(corpus("bare_ampersand.xml"))
    assert parsed.root.findtext("body") == "R&D needs a fix & soon"
    assert [(r.kind, r.line, r.column) for r in parsed.repairs] == [
        ("escaped-ampersand", 1, 14), ("escaped-ampersand", 1, 29)]


def test_repair_escapes_bare_less_than() -> None:
    parsed = parse_or_repair(corpus("bare_less_than.xml"))
    assert parsed.root.findtext("body") == "if 1 < 2 then x <= 3"
    assert [r.kind for r in parsed.repairs] == ["escaped-less-than", "escaped-less-than"]


def test_repair_leaves_cdata_and_comments_alone() -> None:
    parsed = parse_or_repair(b"<a><![CDATA[x & <y>]]><!-- a & b --> & z</a>")
    assert parsed.root.text == "x & <y> & z"
    assert len(parsed.repairs) == 1


def test_repair_keeps_references_and_reports_the_declaration() -> None:
    result = repair(b'<?xml version="1.0"?><a>&amp; &#38; &#x26; &lt; & </a>')
    assert [r.kind for r in result.repairs] == ["dropped-declaration", "escaped-ampersand"]
    assert parse(result.data).text == "& & & < & "


def test_repair_is_not_run_on_well_formed_input() -> None:
    assert parse_or_repair(b"<a>x &amp; y</a>").repairs == ()


def test_repair_refuses_markup_after_the_root() -> None:
    with pytest.raises(XmlMultipleRoots) as raised:
        parse_or_repair(b"<a>1</a> and then <b>2</b>")
    assert (raised.value.line, raised.value.column) == (1, 19)


def test_repair_refuses_doctype_in_malformed_input() -> None:
    with pytest.raises(XmlDoctypeRefused):
        parse_or_repair(b'<!DOCTYPE a [<!ENTITY e "x">]><a>& &e;</a>')


def test_repair_of_unrepairable_input_reports_what_it_could_not_fix() -> None:
    with pytest.raises(XmlMalformed) as raised:
        parse_or_repair(b"<a>\n<b>x & y</a>")
    assert raised.value.line == 2
    assert "mismatch" in raised.value.detail


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\r"),
               max_size=40).filter(lambda s: not any(ord(c) < 32 and c not in "\t\n" or
                                                     c in "\ufffe\uffff" for c in s))


@given(TEXT)
@example("<!DOCTYPE")  # found by Hypothesis: refused as a DOCTYPE, not as malformed
@example("</a>")  # ... and as a second root after the first one closed
def test_repair_never_changes_text_it_escapes(text: str) -> None:
    """Property: escape-only repairs give back exactly the characters sent."""
    raw = "<a>" + text.replace("&", "& ").replace("]]>", "") + "</a>"
    expected = raw[3:-4]
    try:
        parsed = parse_or_repair(raw.encode())
    except (XmlMalformed, XmlDoctypeRefused, XmlMultipleRoots):
        return  # e.g. '<b' inside the text: looks like markup, refused, never guessed
    assert (parsed.root.text or "") == expected


# --- C14N ---------------------------------------------------------------------------

C14N_SAMPLES = [
    b'<a xmlns="urn:x" b="2" a="1"><c xmlns="">t&#13;&amp;&lt;&gt;"</c>'
    b'<x:d xmlns:x="urn:y" x:q="a&#9;b&#10;&#13;"/></a>',
    b'<r xml:lang="en"><s>x</s></r>',
    b'<r><![CDATA[a<b]]> <e/></r>',
    b'<p:r xmlns:p="urn:p" xmlns:q="urn:q" xmlns:unused="urn:u"><q:s q:k="1"/></p:r>',
    b'<r xmlns="urn:d"><s xmlns=""><t xmlns="urn:d"/></s></r>',
]


@pytest.mark.parametrize("sample", C14N_SAMPLES)
def test_canonicalize_equals_lxml_c14n2(sample: bytes) -> None:
    root = parse(sample)
    assert canonicalize(root) == etree.tostring(root, method="c14n2")
    for child in root:
        detached = etree.tostring(etree.fromstring(etree.tostring(child)), method="c14n2")
        assert canonicalize(child) == detached


def test_canonicalize_does_not_change_the_tree() -> None:
    root = parse(C14N_SAMPLES[0])
    before = etree.tostring(root)
    canonicalize(root[0])
    assert etree.tostring(root) == before and root[0].getparent() is root
