"""`bus xml check` and `bus xml schema` through CliRunner, one real subprocess."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from bus.cli import main
from bus.xml import ENVELOPE_NS
from bus.xml import spec_of
from bus.xml import xmlify

TARGET = "tests.xml.test_xml_cli:Add"


@xmlify(root="add")
@dataclass
class Add:
    """Add two numbers."""
    a: float
    b: Decimal


def envelope(payload: str) -> str:
    return (f'<env:message xmlns:env="{ENVELOPE_NS}"><env:from>planner</env:from>'
            f"<env:thread>root</env:thread>{payload}</env:message>")


def invoke(args: list[str], input: str | None = None):
    return CliRunner().invoke(main, args, input=input, env={"BUS_DB": None})


def test_xml_check_prints_the_parsed_message(tmp_path: Path) -> None:
    path = tmp_path / "m.xml"
    path.write_text(envelope("<add><a>1</a><b>2.50</b></add>"))
    result = invoke(["xml", "check", "--schema", TARGET, str(path)])
    assert (result.exit_code, result.output) == (
        0, "from planner to * thread root\nAdd(a=1.0, b=Decimal('2.50'))\n")


def test_xml_check_json_lists_repairs() -> None:
    raw = "Here:\n" + envelope("<add><a>1</a><b>2.50</b></add>")
    result = invoke(["xml", "check", "--json", "--schema", TARGET, "-"], input=raw)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "from": "planner", "to": None, "thread": "root", "root": "add",
        "payload": {"a": 1.0, "b": "2.50"},
        "repairs": [{"kind": "stripped-prose", "line": 1, "column": 1, "detail": "Here:"}]}


def test_xml_check_prints_the_huh_and_exits_1() -> None:
    result = invoke(["xml", "check", "--schema", TARGET, "-"],
                    input=envelope("<add><a>x</a><b>1</b></add>"))
    assert result.exit_code == 1
    assert result.output.startswith('<huh step="payload" code="payload-invalid" line="1" '
                                    "column=\"0\">the payload does not match its schema: "
                                    "Element 'a': 'x' is not a valid value")
    result = invoke(["xml", "check", "--json", "--payload", "--schema", TARGET, "-"],
                    input="<add><a>1</a>")
    assert result.exit_code == 1
    assert json.loads(result.output)["huh"]["code"] == "malformed"


@pytest.mark.parametrize("name", ["doctype_utf16.xml", "doctype_utf32.xml", "entity_utf16.xml",
                                  "entity_utf32.xml"])
def test_xml_check_refuses_a_doctype_in_utf16_and_utf32(name: str) -> None:
    path = Path(__file__).parent.parent / "data" / "xml" / name
    result = invoke(["xml", "check", "--json", "--payload", "--schema", TARGET, str(path)])
    assert result.exit_code == 1, result.output
    assert json.loads(result.output)["huh"]["code"] == "doctype"


def test_xml_schema_prints_xsd_example_usage(tmp_path: Path) -> None:
    spec = spec_of(Add)
    assert invoke(["xml", "schema", TARGET]).output == spec.xsd.decode()
    assert invoke(["xml", "schema", TARGET, "--example"]).output == spec.example.decode()
    assert invoke(["xml", "schema", TARGET, "--usage"]).output == spec.usage + "\n"
    result = invoke(["xml", "schema", TARGET, "--write", str(tmp_path), "--listener", "calc"])
    assert result.exit_code == 0
    assert (tmp_path / "calc" / "add" / "v1.xsd").read_bytes() == spec.xsd


def test_xml_bad_class_is_a_usage_error() -> None:
    for target, message in [("nocolon", "is not MODULE:Class"),
                            ("tests.xml.test_xml_cli:Missing", "has no attribute 'Missing'"),
                            ("tests.xml.test_xml_cli:envelope", "is not an @xmlify class")]:
        result = invoke(["xml", "schema", target])
        assert result.exit_code == 2, target
        assert message in result.output, target
    result = invoke(["xml", "schema", TARGET, "--write", "x"])
    assert result.exit_code == 2 and "--write needs --listener" in result.output


def test_xml_check_in_a_real_process(tmp_path: Path, bus_command: list[str],
                                     python_env: dict[str, str]) -> None:
    path = tmp_path / "m.xml"
    path.write_text(envelope("<sub/>"))
    done = subprocess.run([*bus_command, "xml", "check", "--schema", TARGET, str(path)],
                          capture_output=True, text=True, env=python_env, timeout=60,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith('<huh step="extract" code="unknown-root" line="1"')
