"""`bus pump ...` and `bus xml ...`: the message pump, and the XML messages it carries.

`bus pump` checks organism.yaml, runs the pump, sends requests into it, lists its
threads and dead units, keys and signed control requests (`bus pump oob`).
`bus xml` checks an XML message against a payload class and prints a payload's
XSD; neither xml command opens the bus. MODULE:Class names an ``@xmlify``
dataclass; the current directory is importable, as with ``python -m``.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click
import orjson
from lxml import etree

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.cli.output import echo_listing
from bus.log.messages import iso_utc
from bus.pump import client
from bus.pump import oob as channel
from bus.pump import organism as organisms
from bus.pump import threads as registry
from bus.pump import work
from bus.pump.commit import Finished
from bus.pump.pump import DEFAULT_COMMIT_BATCH
from bus.pump.pump import DEFAULT_LEASE_MS
from bus.pump.pump import DEFAULT_MAX_IN_FLIGHT
from bus.pump.pump import Pump
from bus.xml import Envelope
from bus.xml import Huh
from bus.xml import check_payload
from bus.xml import listener_pipeline
from bus.xml import run
from bus.xml import spec_of
from bus.xml import write_schema
from bus.xml.errors import XmlifyUnsupported
from bus.xml.pipeline import HUH

HUH_EXIT = 3  # `bus pump send --wait`: the reply was a <huh>


@click.group()
def organism() -> None:
    """organism.yaml: the pump's listeners, agents and privileges."""


@organism.command("check")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the checked organism as JSON.")
def organism_check(file: str, as_json: bool) -> None:
    """Check FILE without running anything but imports: keys, names, peers, handlers, payloads.

    Handler and payload modules are imported (the file's directory first on
    the path); exit 1 with the key path of the first problem.

    Example: bus pump organism check organism.yaml
    """
    checked = organisms.load_organism(file)
    organisms.check_references(checked)
    if as_json:
        echo_json({"ok": True, "organism": checked.name, "source": checked.source,
                   "listeners": [spec.name for spec in checked.listeners],
                   "agents": [agent.name for agent in checked.agents],
                   "routes": {tag: list(names) for tag, names in checked.routes.items()}})
        return
    click.echo(f"{checked.source}: organism {checked.name} is valid:"
               f" {_count(len(checked.listeners), 'listener')},"
               f" {_count(len(checked.agents), 'agent')}")
    for tag, names in checked.routes.items():
        click.echo(f"  <{tag}> -> {', '.join(names)}")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@click.group()
def pump() -> None:
    """The message pump: run an organism, send it requests, inspect its threads.

    \b
    Example:
      bus pump organism check examples/organism.yaml
      bus pump run examples/organism.yaml
      bus pump send examples/organism.yaml '<add><a>1</a><b>2</b></add>' --wait
      bus pump threads --status open
    """


@pump.command("run")
@click.argument("organism_file", metavar="ORGANISM", type=click.Path(dir_okay=False))
@click.option("--until-idle", is_flag=True,
              help="Stop once nothing is pending (else run until SIGINT/SIGTERM).")
@click.option("--lease-ms", default=DEFAULT_LEASE_MS, show_default=True,
              type=click.IntRange(100, 3_600_000),
              help="Lease on a work unit; renewed while its handler runs.")
@click.option("--max-in-flight", default=DEFAULT_MAX_IN_FLIGHT, show_default=True,
              type=click.IntRange(1, 4096), help="Handler calls at once, all listeners.")
@click.option("--batch", default=DEFAULT_COMMIT_BATCH, show_default=True,
              type=click.IntRange(1, 4096), help="Finished units committed per transaction.")
@click.option("--no-oob", is_flag=True, help="Do not serve the out-of-band control socket.")
@click.option("-v", "--verbose", is_flag=True,
              help="Print a line per committed unit on stderr (a JSON object with --json).")
@json_option
@pass_bus_context
def pump_run(obj: BusContext, organism_file: str, until_idle: bool, lease_ms: int,
             max_in_flight: int, batch: int, no_oob: bool, verbose: bool,
             as_json: bool) -> None:
    """Run the organism's listeners on the bus: route, dispatch, commit replies.

    A restarted pump resumes what a killed one left (nothing is lost or
    sent twice); <boot/> goes out on the organism's first start only. The
    summary counts committed units by outcome (replied, huh, ...) and
    requests no listener takes (no-route).

    Example: bus pump run examples/organism.yaml --until-idle -v
    """
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    organism = organisms.load_organism(organism_file)  # before the bus: a typo creates no file
    running = Pump(obj.open(create=True), organism,
                   lease_ms=lease_ms, max_in_flight=max_in_flight, commit_batch=batch,
                   oob=not no_oob, on_unit=_unit_printer(as_json) if verbose else None)
    # Signal handlers only set the pump's stop flag; only the main thread may install them.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, lambda *_: running.stop())
                for sig in (signal.SIGINT, signal.SIGTERM) if main_thread}
    try:
        stats = running.run(until_idle=until_idle)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if as_json:
        echo_json({"organism": running.name, **stats.to_json_dict()})
        return
    done = ", ".join(f"{n} {outcome}" for outcome, n in sorted(stats.outcomes.items()))
    click.echo(f"pump {running.name}: {'booted' if stats.booted else 'resumed'};"
               f" {done or 'nothing to do'}")


def _unit_printer(as_json: bool):
    """`-v`: one line per committed unit, on stderr (the summary keeps stdout)."""
    def report(done: Finished, outcome: str) -> None:
        unit, message = done.unit, done.input
        if as_json:
            click.echo(orjson.dumps({"unit": unit.id, "listener": unit.listener,
                                     "kind": unit.kind, "input": message.seq,
                                     "from": message.from_agent, "attempt": unit.attempts,
                                     "outcome": outcome}).decode(), err=True)
        else:
            click.echo(f"unit {unit.id} {unit.listener} <- #{message.seq} from"
                       f" {message.from_agent}: {outcome}", err=True)
    return report


@pump.command("send")
@click.argument("organism_file", metavar="ORGANISM", type=click.Path(dir_okay=False))
@click.argument("xml")
@click.option("--to", "to",
              help="The listener to send to (default: every listener of the root tag).")
@click.option("--from", "client_id", default=client.DEFAULT_CLIENT, show_default=True,
              help="Your client id: replies come back to it.")
@click.option("--wait", is_flag=True, help="Wait for the reply and print it.")
@click.option("--replies", default=1, show_default=True, type=click.IntRange(1, 1000),
              help="With --wait: how many replies to wait for (a broadcast has several).")
@click.option("--timeout", default=30.0, show_default=True, type=click.FloatRange(0, 86_400),
              help="With --wait: seconds to wait.")
@json_option
@pass_bus_context
def pump_send(obj: BusContext, organism_file: str, xml: str, to: str | None, client_id: str,
              wait: bool, replies: int, timeout: float, as_json: bool) -> None:
    """Send the payload XML (or - for stdin) into the organism as client --from.

    The pump stamps <from> and <thread>; a final answer or a <huh> ends --wait
    early. Exit 1 when --wait saw no reply in time, 3 when a reply is a <huh>
    (the request was refused or failed: the <huh> says why), 75 when the
    organism's queue holds max_pending requests and units already (retry later).

    \b
    Example:
      bus pump send examples/organism.yaml '<add><a>1</a><b>2</b></add>' \\
          --to calculator --wait
    """
    organism = organisms.load_organism(organism_file)
    payload = sys.stdin.buffer.read() if xml == "-" else xml.encode()
    bus = obj.open(create=True)
    sent = client.send(bus, organism.name, payload, to=to, client=client_id,
                       max_pending=organism.max_pending)
    if not wait:
        if as_json:
            echo_json(sent.to_json_dict())
        else:
            click.echo(f"sent #{sent.seq} id {sent.id} on thread {sent.thread}")
        return
    got = client.wait_replies(bus, sent, replies, timeout)
    for reply in got:
        if as_json:
            echo_json(reply.to_json_dict())
        else:
            click.echo(f"{reply.sender} -> {reply.to}: {reply.payload_xml}")
    if not got:
        raise click.ClickException(f"no reply on thread {sent.thread} within {timeout:g} s; "
                                   "is `bus pump run` running for this organism?")
    if any(reply.root_tag == HUH for reply in got):
        click.get_current_context().exit(HUH_EXIT)


@pump.command("dead")
@click.argument("organism_file", metavar="ORGANISM", type=click.Path(dir_okay=False))
@click.option("--limit", default=1000, show_default=True, type=click.IntRange(1, 1_000_000))
@json_option
@pass_bus_context
def pump_dead(obj: BusContext, organism_file: str, limit: int, as_json: bool) -> None:
    """List the organism's dead letters: inputs the pump gave up on (their senders got a <huh>).

    \b
    Example:
      bus pump dead examples/organism.yaml --json
    """
    name = organisms.load_organism(organism_file).name
    with obj.open().read() as conn:
        found = work.dead_units(conn, name, limit)
    echo_listing(found, as_json, f"no dead letters for organism {name}",
                 ["unit", "input", "sender", "listener", "attempts", "outcome", "finished_at"],
                 lambda d: (d.id, d.input_seq, d.sender or "-", d.listener, d.attempts,
                            d.outcome, iso_utc(d.finished_at_ms)))


@click.group()
def oob() -> None:
    """The out-of-band control channel: Ed25519 keys and signed requests."""


@oob.command("keygen")
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Directory for the key pair (default: the bus file's directory).")
@click.option("--json", "as_json", is_flag=True, help="Print the paths and key id as JSON.")
@pass_bus_context
def oob_keygen(obj: BusContext, out_dir: str | None, as_json: bool) -> None:
    """Create an Ed25519 key pair: oob_ed25519 (mode 0600) and oob_ed25519.pub.

    List the .pub file under oob.authorized_keys in organism.yaml.

    Example: bus pump oob keygen --out ~/.agentbus
    """
    pair = channel.generate_keys(out_dir or Path(obj.db).absolute().parent)
    if as_json:
        echo_json({"private_key": str(pair.private_path), "public_key": str(pair.public_path),
                   "key_id": pair.key_id})
        return
    click.echo(f"private key: {pair.private_path} (mode 0600, keep it secret)")
    click.echo(f"public key:  {pair.public_path} (key id {pair.key_id})")
    click.echo("list the public key under oob.authorized_keys in organism.yaml")


@oob.command("send")
@click.argument("command", type=click.Choice(channel.COMMANDS))
@click.argument("args", default="{}")
@click.option("--key", "key_file", required=True, type=click.Path(dir_okay=False),
              help="Private key file from `bus pump oob keygen`.")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False),
              help=f"The pump's OOB socket (default: {organisms.DEFAULT_SOCKET} beside the bus).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's response as JSON.")
@pass_bus_context
def oob_send(obj: BusContext, command: str, args: str, key_file: str, socket_path: str | None,
             as_json: bool) -> None:
    """Sign COMMAND with ARGS (a JSON object) and send it to the pump; exit 1 if refused.

    \b
    Example:
      bus pump oob send remove-listener '{"name": "calc.add"}' \\
          --key .worker-state/oob_ed25519
    """
    try:
        parsed = orjson.loads(args)
    except orjson.JSONDecodeError as exc:
        raise click.BadParameter(f"is not JSON ({exc})", param_hint="ARGS") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("must be a JSON object, e.g. '{}'", param_hint="ARGS")
    key = channel.load_private_key(key_file)
    path = socket_path or channel.socket_path_for(obj.db)
    response = channel.send_request(path, key, command, parsed)
    if as_json:
        echo_json(response)
        if not response.get("ok"):
            obj.ctx.exit(1)
    elif response.get("ok"):
        click.echo(f"{command} accepted (nonce {response['nonce']}): "
                   f"{orjson.dumps(response.get('result')).decode()}")
    else:
        raise click.ClickException(f"{command} refused ({response.get('error')}): "
                                   f"{response.get('message')}")


@click.command("threads")
@click.option("--status", type=click.Choice(registry.STATUSES), help="Only open or closed threads.")
@click.option("--limit", default=100, show_default=True,
              type=click.IntRange(1, registry.LIST_LIMIT_MAX), help="Show the newest N.")
@json_option
@pass_bus_context
def threads(obj: BusContext, status: str | None, limit: int, as_json: bool) -> None:
    """List threads, oldest first: UUID, path (organism/caller/.../listener), parent, status.

    Example: bus pump threads --status open --json
    """
    with obj.open().read() as conn:
        found = registry.list_threads(conn, status, limit)
    echo_listing(found, as_json, "no threads",
                 ["uuid", "path", "parent", "status", "created", "closed"],
                 lambda t: (t.uuid, registry.PATH_SEPARATOR.join(t.path), t.parent_uuid or "-",
                            t.status, iso_utc(t.created_at_ms),
                            "-" if t.closed_at_ms is None else iso_utc(t.closed_at_ms)))


for _command in (organism, oob, threads):
    pump.add_command(_command)


# --- bus xml ------------------------------------------------------------------


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


COMMANDS = [pump, xml_group]
