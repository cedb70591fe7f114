"""`bus organism` and `bus oob`: check organism.yaml, keys and signed control requests."""

from __future__ import annotations

from pathlib import Path

import click
import orjson

from bus.cli.context import BusContext
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.pump import oob as channel
from bus.pump import organism as organisms


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

    Example: bus organism check organism.yaml
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

    Example: bus oob keygen --out ~/.agentbus
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
              help="Private key file from `bus oob keygen`.")
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False),
              help=f"The pump's OOB socket (default: {organisms.DEFAULT_SOCKET} beside the bus).")
@click.option("--json", "as_json", is_flag=True, help="Print the server's response as JSON.")
@pass_bus_context
def oob_send(obj: BusContext, command: str, args: str, key_file: str, socket_path: str | None,
             as_json: bool) -> None:
    """Sign COMMAND with ARGS (a JSON object) and send it to the pump; exit 1 if refused.

    Example: bus oob send remove-listener '{"name": "calc.add"}' --key .worker-state/oob_ed25519
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


COMMANDS = (organism, oob)
