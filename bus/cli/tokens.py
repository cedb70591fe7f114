"""`bus token`: the bearer tokens that let agents elsewhere reach `bus serve --mcp`."""

from __future__ import annotations

import datetime

import click

from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.output import echo_json
from bus.coordination.tokens import parse_duration_ms


@click.group()
def token() -> None:
    """Create, list and revoke the tokens of `bus serve` (agents over HTTP).

    A token acts as one agent and as no one else. Only its hash is kept in
    the bus file: the token is printed once, when it is created.

    \b
    Example:
      bus token create --agent worker-1 --expires 30d
      bus token list
      bus token revoke tok-1a2b3c4d
    """


@token.command("create")
@click.option("--agent", required=True, help="The agent every request with this token acts as.")
@click.option("--expires", metavar="DURATION",
              help="Expire after this long: 90s, 15m, 12h or 30d (default: until revoked).")
@click.option("--read-only", is_flag=True,
              help="Allow only tools that change nothing (poll, status, search, ...).")
@json_option
@pass_bus_context
def token_create(obj: BusContext, agent: str, expires: str | None, read_only: bool,
                 as_json: bool) -> None:
    """Create a token for --agent and print it once; keep it secret.

    Example: bus token create --agent worker-1 --expires 30d --read-only
    """
    expires_ms = None if expires is None else parse_duration_ms(expires, "expires")
    new = obj.open().tokens.create(agent, expires_ms=expires_ms, read_only=read_only)
    if as_json:
        echo_json({"id": new.id, "agent": new.agent, "token": new.token})
        return
    click.echo(f"token {new.id} for {new.agent} (shown once; only its hash is kept):")
    click.echo(new.token)


@token.command("list")
@json_option
@pass_bus_context
def token_list(obj: BusContext, as_json: bool) -> None:
    """List the tokens: id, agent, created, expires, last used, read-only (never the token).

    Example: bus token list --json
    """
    found = obj.open().tokens.list()
    if as_json:
        for one in found:
            echo_json(one.to_json_dict())
        return
    if not found:
        click.echo("no tokens; create one with bus token create --agent ID")
    for one in found:
        state = ("revoked" if one.revoked_ms is not None
                 else "read-only" if one.read_only else "read-write")
        click.echo(f"{one.id}  {one.agent}  {state}  created {_when(one.created_ms)}"
                   f"  expires {_when(one.expires_ms, 'never')}"
                   f"  last used {_when(one.last_used_ms, 'never')}")


@token.command("revoke")
@click.argument("token_id", metavar="ID")
@json_option
@pass_bus_context
def token_revoke(obj: BusContext, token_id: str, as_json: bool) -> None:
    """Revoke token ID: the next request with it gets 401.

    Example: bus token revoke tok-1a2b3c4d
    """
    revoked = obj.open().tokens.revoke(token_id)
    if as_json:
        echo_json(revoked.to_json_dict())
    else:
        click.echo(f"revoked {revoked.id} ({revoked.agent})")


def _when(ms: int | None, none: str = "-") -> str:
    if ms is None:
        return none
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%SZ")


COMMANDS = [token]
