"""`bus xml`: check an XML message against a payload class, print a payload's XSD.

Neither command opens the bus. MODULE:Class names an ``@xmlify`` dataclass;
the current directory is importable, as with ``python -m``.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from typing import Any

import click
import orjson
from lxml import etree

from bus.xml import Envelope
from bus.xml import Huh
from bus.xml import check_payload
from bus.xml import listener_pipeline
from bus.xml import run
from bus.xml import spec_of
from bus.xml import write_schema
from bus.xml.errors import XmlifyUnsupported

CHECK_LISTENER = "check"  # the pipeline's listener name; a Huh never shows it


class PayloadClass(click.ParamType):
    """MODULE:Class of an @xmlify dataclass, imported."""

    name = "MODULE:Class"

    def convert(self, value: Any, param: Any, ctx: Any) -> type:
        if isinstance(value, type):
            return value
        module_name, _, class_name = str(value).partition(":")
        if not module_name or not class_name:
            self.fail(f"{value!r} is not MODULE:Class, e.g. myagents.calc:CalculatorAdd",
                      param, ctx)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as exc:
            self.fail(f"cannot load {value}: {exc}", param, ctx)
        try:
            spec_of(cls)
        except XmlifyUnsupported as exc:
            self.fail(str(exc), param, ctx)
        return cls


schema_option = click.option("--schema", "cls", required=True, type=PayloadClass(),
                             help="The payload class, MODULE:Class (an @xmlify dataclass).")


@click.group("xml")
def xml_group() -> None:
    """Validate XML messages and show payload schemas.

    \b
    Example:
      bus xml check --schema myagents.calc:CalculatorAdd message.xml
      bus xml schema myagents.calc:CalculatorAdd
    """


@xml_group.command()
@schema_option
@click.option("--payload", "bare", is_flag=True,
              help="FILE holds the payload element alone, without an envelope.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.argument("file", type=click.File("rb"))
@click.pass_context
def check(ctx: click.Context, cls: type, bare: bool, as_json: bool, file: Any) -> None:
    """Run FILE (- for stdin) through the pipeline for a payload class.

    Prints the parsed message (exit 0), or the <huh> the sender would get
    (exit 1). Repairs made on the way are listed.

    Example: bus xml check --schema myagents.calc:CalculatorAdd message.xml
    """
    raw = file.read()
    result = check_payload(cls, raw) if bare else run(listener_pipeline(CHECK_LISTENER, cls), raw)
    if isinstance(result, Huh):
        if as_json:
            _echo_json({"huh": dataclasses.asdict(result)})
        else:
            click.echo(etree.tostring(result.to_element()).decode())
        ctx.exit(1)
    if as_json:
        _echo_json(_envelope_json(result))
        return
    if not bare:
        click.echo(f"from {result.sender} to {result.to or '*'} thread {result.thread}")
    click.echo(repr(result.payload))
    for change in result.repairs:
        click.echo(f"repaired line {change.line} column {change.column}: {change.kind} "
                   f"{change.detail!r}")


@xml_group.command()
@click.argument("cls", metavar="MODULE:Class", type=PayloadClass())
@click.option("--example", is_flag=True, help="Print an example payload instead.")
@click.option("--usage", is_flag=True, help="Print the usage text (a tool description) instead.")
@click.option("--write", "directory", type=click.Path(file_okay=False),
              help="Also write DIRECTORY/LISTENER/ROOT/v1.xsd.")
@click.option("--listener", help="The listener name for --write.")
def schema(cls: type, example: bool, usage: bool, directory: str | None,
           listener: str | None) -> None:
    """Print the XSD derived from an @xmlify payload class.

    Example: bus xml schema myagents.calc:CalculatorAdd --write schemas --listener calculator
    """
    spec = spec_of(cls)
    if directory is not None:
        if listener is None:
            raise click.UsageError("--write needs --listener")
        click.echo(f"wrote {write_schema(cls, listener, directory)}", err=True)
    if usage:
        click.echo(spec.usage)
    else:
        click.echo((spec.example if example else spec.xsd).decode().rstrip())


def _envelope_json(envelope: Envelope) -> dict[str, Any]:
    return {"from": envelope.sender or None, "to": envelope.to, "thread": envelope.thread or None,
            "root": envelope.root_tag, "payload": envelope.payload,
            "repairs": [dataclasses.asdict(r) for r in envelope.repairs]}


def _echo_json(obj: Any) -> None:
    # default=str: Decimal, which orjson does not serialize, as its exact text
    click.echo(orjson.dumps(obj, default=str).decode())


COMMANDS = [xml_group]
