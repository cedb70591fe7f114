"""`bus organism` and `bus oob`: check organism.yaml, keys and signed control requests."""

from __future__ import annotations

import click

from bus.cli.output import echo_json
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


COMMANDS = (organism,)
