"""`bus` commands for agents and their clients: `mcp`, `hook`, `inbox`, `token`.

`bus mcp` serves the bus to one agent's MCP client over stdio; `bus token`
makes the bearer tokens that let agents elsewhere reach `bus serve --mcp`.

An LLM session that has finished its turn calls no tool, so it never polls.
Harnesses run hooks at their own moments; `hook` and `inbox` answer them with the
agent's waiting messages. The answers and their policy (what to show, when a
Stop goes on, what is acked) are the library's: bus/harness/claude_code.py `answer`
and bus/harness/claude_rewake.py; these commands read the event and write the output. `--agent auto`
is the worker whose worktree contains the directory, else $BUS_AGENT
(bus/log/agent_ids.py). The console script answers a hook with nothing to show
before it loads this module (bus/cli/entry.py); the command does the same
through the same functions, then shows what waits.

`bus mcp`, `bus hook` and `bus inbox` load this module alone (bus/cli/root.py
MODULE_OF): what it imports at the top is what their clients wait for, so the MCP
SDK, the server and the views are imported inside the commands.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
from pathlib import Path
from typing import Any
from typing import Callable

import click
import orjson

from blobs.files import write_atomically
from bus.api import Bus
from bus.cli.context import BusContext
from bus.cli.context import json_option
from bus.cli.context import pass_bus_context
from bus.cli.extras import import_extra
from bus.cli.extras import require_extra
from bus.cli.output import echo_json
from bus.coordination.tokens import parse_duration_ms
from bus.harness import claude_code
from bus.harness import claude_rewake
from bus.harness.inbox import BLOB_PREVIEW
from bus.harness.inbox import acknowledge
from bus.harness.inbox import pending
from bus.log import agent_ids as identity
from bus.log.agent_ids import AGENT_ENV
from bus.log.agent_ids import AUTO
from bus.log.messages import validate_agent_id
from bus.storage.errors import ValidationFailed

# --- bus hook and bus inbox ---------------------------------------------------


AGENT_HELP = ("The agent to act as; `auto`: the worker whose worktree contains the working"
              " directory (as `worker spawn` set it up), else $BUS_AGENT.")
DEFAULT_LIMIT = 20
DEFAULT_MAX_CONTINUES = claude_code.DEFAULT_MAX_CONTINUES


def resolve_agent(bus: Bus, agent: str | None, directory: str | None = None) -> str | None:
    """`agent` itself, or for `auto` the worker whose worktree holds `directory` (default:
    cwd), else $BUS_AGENT."""
    if agent is None:
        return None
    with bus.read() as conn:
        return identity.resolve_agent(conn, agent, directory if directory is not None
                                      else os.getcwd())


class NonBlockingCommand(click.Command):
    """A hook command: every failure exits 1, never 2, which Claude Code reads as "block"."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise _non_blocking(exc) from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise _non_blocking(exc) from exc


def _non_blocking(exc: click.UsageError) -> click.ClickException:
    return click.ClickException(exc.format_message())


@click.group()
def hook() -> None:
    """Answer an agent harness's hooks with the agent's messages (Claude Code, Codex).

    \b
    Example:
      bus hook install claude --agent auto --project .
      bus hook install codex --agent w1
      echo '{"hook_event_name": "Stop", "session_id": "s1"}' | bus hook claude --agent w1
    """


def answer_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a command answering a harness's hook event: who, and how much to show."""
    for option in reversed([
        click.option("--agent", required=True, help=AGENT_HELP),
        click.option("--wait", default=0.0, show_default=True, type=click.FloatRange(0),
                     help="Stop: seconds to wait for a message before letting the session stop."),
        click.option("--max-continues", default=DEFAULT_MAX_CONTINUES, show_default=True,
                     type=click.IntRange(0),
                     help="Stop: the most stops in a row this hook turns into more work (never"
                          f" more than ${claude_code.STOP_CAP_ENV}, default"
                          f" {claude_code.STOP_CAP_DEFAULT}, which Claude Code honours)."),
        click.option("--limit", default=DEFAULT_LIMIT, show_default=True,
                     type=click.IntRange(1, claude_code.LIMIT_MAX),
                     help="Most messages shown per hook call; the rest come next time."),
    ]):
        command = option(command)
    return command


@hook.command("claude", cls=NonBlockingCommand)
@answer_options
@click.option("--rewake", is_flag=True,
              help="Run as the background (asyncRewake) hook of SessionStart and Stop: wait"
                   " up to --wait s for messages, then post them to the session's inbox"
                   " socket, or write them to stderr and exit 2; either starts a turn, even"
                   " in an idle session.")
@click.option("--inbox/--no-inbox", "use_inbox", default=True, show_default=True,
              help="--rewake: post to the session's inbox socket where Claude Code has one"
                   " (2.1.224 and later; the model sees a message from a peer); --no-inbox:"
                   " always stderr and exit 2 (the model sees a system reminder).")
@json_option
@pass_bus_context
def claude(obj: BusContext, agent: str, wait: float, max_continues: int, limit: int,
           rewake: bool, use_inbox: bool, as_json: bool) -> None:
    """Read one Claude Code hook event on stdin and answer on stdout.

    SessionStart, UserPromptSubmit and PostToolUse: the waiting messages join
    the session as context. Stop: when messages wait, or arrive within --wait,
    Claude goes on with them as its next input; otherwise the session stops.
    With stop_hook_active, at most --max-continues stops in a row are turned
    into work, and never more than Claude Code honours. The agent's own
    broadcasts are not shown. Every event keeps the session's presence
    (`bus alive`): started, working, idle, and ended at SessionEnd. Other
    events: nothing. Messages shown are acknowledged. `--agent auto` outside
    every worker's worktree, with no $BUS_AGENT, answers nothing. Errors exit 1
    (Claude Code goes on), never 2.

    With --rewake (SessionStart and Stop, as an asyncRewake hook): wait in the
    background until messages come, up to --wait s, then post them to the
    session's inbox socket where it has one, else write them to stderr and
    exit 2; either wakes the session, idle or not. One waiter per session; it
    stands down in a session nobody attends (claude -p), and when the session
    ends. Messages are acknowledged once delivered.

    \b
    Example:
      bus hook claude --agent auto   (as a Stop hook)
      bus hook claude --agent auto --wait 86400 --rewake   (asyncRewake)
    """
    event = claude_code.parse_event(sys.stdin.buffer.read())
    if not event.known:
        return
    bus = obj.open()
    with bus.read() as conn:
        who = claude_code.hook_agent(conn, agent, event)
    if who is None:
        return
    if rewake:  # not an answer: the waiter keeps no presence and never lets a Stop end
        _rewake(bus, obj.db, who, event, wait, limit, use_inbox)
        return
    claude_code.answer(bus, obj.db, who, event, wait, max_continues, limit, _emit)


def _emit(output: dict[str, Any]) -> None:
    """The hook's answer on stdout, written out before its messages are acked."""
    echo_json(output)
    sys.stdout.flush()


def _rewake(bus: Bus, db: str, agent: str, event: claude_code.HookEvent, wait: float,
            limit: int, use_inbox: bool) -> None:
    """The background waiter: the messages posted to the session's inbox (exit 0) or on
    stderr (exit 2); exit 0 with nothing when the wait or the session ends."""
    session = event.session_id or os.environ.get(claude_rewake.SESSION_ENV)
    if event.name not in claude_code.REWAKE_EVENTS or claude_rewake.unattended() or not session:
        return
    claim = claude_rewake.claim_session(db, session)
    if claim is None:
        return  # the session's waiter is still waiting: it serves this turn's end too
    inbox = claude_rewake.SessionInbox.of_session(event.transcript_path) if use_inbox else None
    delivery = claude_rewake.Delivery(inbox, sys.stderr)
    delivered = claude_rewake.wait_and_deliver(bus, db, agent, limit, wait, delivery, session,
                                               claude_rewake.session_gone_fd())
    if delivered is not None:
        # Claude Code reads a background hook's output when it exits. Written, flushed and
        # acked, nothing is left to do: the interpreter's teardown (closing the bus,
        # unloading modules) took 60-120 ms of the wake, so it is skipped.
        sys.stderr.flush()
        os._exit(claude_rewake.WAKE_EXIT if delivery.route == "stderr" else 0)


@hook.command("codex", cls=NonBlockingCommand)
@answer_options
@json_option
@click.pass_context
def codex(ctx: click.Context, agent: str, wait: float, max_continues: int, limit: int,
          as_json: bool) -> None:
    """Read one Codex hook event on stdin and answer on stdout.

    Codex sends and reads the JSON of Claude Code's hooks, so this answers as
    `bus hook claude` does: SessionStart and UserPromptSubmit add the waiting
    messages as context; at Stop, Claude goes on with them as its next input.
    Messages shown are acknowledged. Errors exit 1, never 2.

    Example: bus hook codex --agent w1   (as written by bus hook install codex)
    """
    ctx.invoke(claude, agent=agent, wait=wait, max_continues=max_continues, limit=limit,
               rewake=False, as_json=as_json)


@hook.group("install")
def install() -> None:
    """Register `bus hook claude` or `bus hook codex` in a harness's settings."""


@install.command("claude")
@click.option("--agent", required=True, help=AGENT_HELP)
@click.option("--project", default=".", show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="The project whose .claude/settings.json gets the hooks.")
@click.option("--wait", default=0.0, show_default=True, type=click.FloatRange(0),
              help="The Stop hook's --wait: seconds a session waits for a message before it"
                   " stops (0 fits headless `claude -p`, which would sit out the wait).")
@click.option("--max-continues", default=DEFAULT_MAX_CONTINUES, show_default=True,
              type=click.IntRange(0),
              help="The Stop hook's --max-continues; refused above"
                   f" ${claude_code.STOP_CAP_ENV} (default {claude_code.STOP_CAP_DEFAULT}).")
@click.option("--command", "program", metavar="PROGRAM",
              help="How the hooks start bus (default: the absolute path of this one).")
@click.option("--mcp-server", default=claude_code.MCP_SERVER, show_default=True, metavar="NAME",
              help="The name `bus mcp` is registered under (.mcp.json): its tools are allowed"
                   " with a permissions.allow rule, mcp__NAME__*.")
@click.option("--local", is_flag=True,
              help="Name this checkout's own agent instead: $BUS_AGENT = --agent in"
                   " .claude/settings.local.json, read by the project's `--agent auto` hooks"
                   " and MCP server outside every worker's worktree (a lead's checkout).")
@click.option("--rewake/--no-rewake", default=True, show_default=True,
              help="Also the background hook that wakes an idle session when a message comes"
                   " (SessionStart and Stop, asyncRewake); --no-rewake removes it.")
@json_option
@pass_bus_context
def install_claude(obj: BusContext, agent: str, project: Path, wait: float, max_continues: int,
                   program: str | None, mcp_server: str, local: bool, rewake: bool,
                   as_json: bool) -> None:
    """Merge the hooks and a permission rule into PROJECT/.claude/settings.json.

    The file is created if missing. Every other setting, hook and rule is
    kept; an earlier `bus hook claude` entry is replaced, so running it twice
    gives the same file. The hooks name this bus database by its absolute
    path. The rule allows the bus's MCP tools, which `claude -p` otherwise
    denies. Beside the hooks that answer events, a background one
    (`--rewake`) wakes an idle session when a message comes. With --local,
    only the checkout's agent is written, to settings.local.json.

    \b
    Example:
      bus hook install claude --agent auto --project .
      bus hook install claude --agent lead --local
    """
    if agent != AUTO:
        validate_agent_id(agent, "agent")  # refused now, not at each hook call
    if local:
        _name_checkout_agent(project / ".claude" / "settings.local.json", agent, as_json)
        return
    claude_code.check_max_continues(max_continues)
    path = project / ".claude" / "settings.json"
    db = str(Path(obj.db).absolute())
    base = [program or _this_program(), "--db", db]
    commands = claude_code.hook_commands(base, agent, wait, max_continues)
    timeouts = {event: claude_code.DEFAULT_TIMEOUT_S for event in commands}
    timeouts[claude_code.STOP] = claude_code.stop_timeout(wait)
    allow = claude_code.mcp_allow_rules(mcp_server)
    merged = claude_code.merge_settings(claude_code.read_settings(path), commands, timeouts,
                                        allow)
    waiter = (claude_rewake.rewake_command(base, agent, claude_rewake.REWAKE_WAIT_S)
              if rewake else None)
    merged = claude_code.merge_rewake(merged, waiter,
                                      claude_rewake.hook_fields(claude_rewake.REWAKE_WAIT_S))
    changed = claude_code.write_settings(path, merged)
    rewake_events = list(claude_code.REWAKE_EVENTS) if rewake else []
    if as_json:
        echo_json({"settings": str(path), "changed": changed, "events": list(commands),
                   "allow": allow, "rewake": rewake_events})
    elif changed:
        woken = f", the idle wake on {', '.join(rewake_events)}" if rewake else ""
        click.echo(f"hooks for {', '.join(commands)}{woken} and the rule {', '.join(allow)}"
                   f" written to {path}")
    else:
        click.echo(f"{path} already has these hooks; nothing changed")


@install.command("codex")
@click.option("--agent", required=True, help="The agent Codex acts as (its hooks and `bus mcp`).")
@click.option("--codex-home", type=click.Path(file_okay=False, path_type=Path),
              help="Codex's configuration directory  [default: $CODEX_HOME, else ~/.codex]")
@click.option("--command", "program", metavar="PROGRAM",
              help="How the hooks start bus (default: the absolute path of this one).")
@json_option
@pass_bus_context
def install_codex(obj: BusContext, agent: str, codex_home: Path | None, program: str | None,
                  as_json: bool) -> None:
    """Merge the hooks and the `bus mcp` server into CODEX_HOME/config.toml.

    The hooks (SessionStart, UserPromptSubmit, Stop) run `bus hook codex`;
    [mcp_servers.agentbus] runs `bus mcp --agent AGENT`. Both name this bus
    database by its absolute path. Every other table, key and comment is kept;
    an earlier entry of ours is replaced, so running it twice gives the same
    file. Codex runs new hooks once trusted: /hooks in codex, or `codex exec
    --dangerously-bypass-hook-trust` for automation.

    Example: bus hook install codex --agent w1
    """
    validate_agent_id(agent, "agent")
    codex_config = import_extra("bus.harness.codex", "mcp", "bus hook install codex")
    path = (codex_home or codex_config.codex_home()) / codex_config.CONFIG_FILE
    base = [program or _this_program(), "--db", str(Path(obj.db).absolute())]
    commands = codex_config.hook_commands(base, agent)
    try:
        before = path.read_text()
    except FileNotFoundError:
        before = ""
    after = codex_config.merge_config(before, commands, claude_code.DEFAULT_TIMEOUT_S,
                                      [*base, "mcp", "--agent", agent],
                                      _server_env())
    changed = after != before
    if changed:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, after.encode())
    if as_json:
        echo_json({"config": str(path), "changed": changed, "events": list(commands),
                   "mcp_server": codex_config.MCP_SERVER})
    elif changed:
        click.echo(f"hooks for {', '.join(commands)} and [mcp_servers."
                   f"{codex_config.MCP_SERVER}] written to {path}; trust the hooks in codex"
                   " with /hooks")
    else:
        click.echo(f"{path} already has these hooks; nothing changed")


def _server_env() -> dict[str, str]:
    """What `bus mcp` needs of this environment under Codex, which starts an MCP server
    with a few variables of its own only: where this checkout's code is, if set."""
    return {name: os.environ[name] for name in ("PYTHONPATH",) if os.environ.get(name)}


def _name_checkout_agent(path: Path, agent: str, as_json: bool) -> None:
    if agent == AUTO:
        raise click.BadParameter("with --local names this checkout's own agent: give its id"
                                 " (--agent lead), not auto", param_hint="--agent")
    settings = claude_code.merge_env(claude_code.read_settings(path), AGENT_ENV, agent)
    changed = claude_code.write_settings(path, settings)
    if as_json:
        echo_json({"settings": str(path), "changed": changed, "env": {AGENT_ENV: agent}})
    elif changed:
        click.echo(f"{AGENT_ENV}={agent} written to {path}")
    else:
        click.echo(f"{path} already names {agent}; nothing changed")


def _this_program() -> str:
    """The `bus` being run, as an absolute path when it is a file (a venv's script)."""
    argv0 = sys.argv[0]
    if os.path.basename(argv0) == "bus" and os.path.isfile(argv0):
        return os.path.abspath(argv0)
    return "bus"


@click.command()
@click.option("--agent", required=True, help=AGENT_HELP)
@click.option("--wait", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to wait for a message when none is waiting.")
@click.option("--format", "shape", default="text", show_default=True,
              type=click.Choice(["text", "json"]),
              help="text: a headline, then each message's header line and body; json: one object.")
@click.option("--ack", is_flag=True, help="Acknowledge the messages shown, once printed.")
@click.option("--limit", default=DEFAULT_LIMIT, show_default=True,
              type=click.IntRange(1, claude_code.LIMIT_MAX),
              help="Most messages shown; the rest come next time.")
@json_option
@pass_bus_context
def inbox(obj: BusContext, agent: str, wait: float, shape: str, ack: bool, limit: int,
          as_json: bool) -> None:
    """Print an agent's waiting messages for any harness: compact text, or JSON.

    Text is what the Claude Code hooks show a model; nothing is printed when
    nothing waits. JSON (--format json or --json) is one object:
    {"agent", "messages", "more", "acked_through"}. Without --ack the cursor
    stays where it is, as with `bus poll`.

    Example: bus inbox --agent w1 --wait 30 --ack
    """
    bus = obj.open()
    who = resolve_agent(bus, agent)
    as_json = as_json or shape == "json"
    found = pending(bus, who, limit, wait, preview=0 if as_json else BLOB_PREVIEW)
    if as_json:
        echo_json({"agent": who, "messages": [m.to_json_dict() for m in found.shown],
                   "more": found.more, "acked_through": found.last_seq if ack else None})
    elif found.text:
        click.echo(found.text)
    if ack:
        sys.stdout.flush()  # printed before it is acked: a crash now shows it again
        acknowledge(bus, found, "inbox")
    else:
        bus.record_delivered(who, found.shown, "inbox")


# --- bus mcp ------------------------------------------------------------------


TOOLS_HELP = (
    "Tool groups to list beside the daily loop, comma-separated: tasks (the graph and its"
    " leases), files (reservations), channels, pump, admin (the log's other tools: search,"
    " heartbeat, liveness...), workers (the worker lifecycle), or all. Without it only the"
    " daily loop is listed: join (without --agent), publish, publish_many, exchange, reply,"
    " poll, ack, task_ready, task_claim_next, task_done, reserve, unreserve.")


def _chosen_groups(ctx: click.Context, param: click.Parameter,
                   value: str | None) -> frozenset[str]:
    from bus.mcpserver.toolsets import chosen_groups  # no SDK: checked before serving

    try:
        return chosen_groups(value)
    except ValidationFailed as exc:
        raise click.BadParameter(exc.reason, ctx, param) from exc


def tools_option(function: Any) -> Any:
    """`--tools GROUP,...`: the tool groups a server lists beside the daily loop."""
    return click.option("--tools", "tools", metavar="GROUP,...", default=None,
                        callback=_chosen_groups, help=TOOLS_HELP)(function)


@click.command()
@click.option("--agent", default=None,
              help="The agent every tool acts as: it publishes, acks and claims as this id only;"
                   " `auto`: the worker whose worktree contains the working directory. Without"
                   " it the agent chooses its name with the join tool.")
@tools_option
@click.option("--list", "list_only", is_flag=True,
              help="Print the tools and resources the server lists instead of serving.")
@click.option("--call", "tool", metavar="TOOL",
              help="Call one tool as the agent would, print its JSON result and exit.")
@click.option("--args", "arguments", default="{}", show_default=True, metavar="JSON",
              help="The arguments of --call, a JSON object.")
@json_option
@pass_bus_context
def mcp(obj: BusContext, agent: str | None, tools: frozenset[str], list_only: bool,
        tool: str | None, arguments: str, as_json: bool) -> None:
    """Serve the bus to an MCP client (an LLM agent) over stdin/stdout.

    The client starts this command itself; register it in the client's
    configuration (see README.md). stdout carries the protocol only. --list
    prints the tools and resources; --call runs one tool through the same
    server, to see what an agent would get.

    Without --agent, the agent calls join(name) first (one configuration
    serves every session of a project); join's reclaim_token takes the name
    back after a restart.

    Every model request carries the listed tools' schemas, so only the
    daily loop is listed unless --tools names more groups.

    \b
    Example:
      bus --db .worker-state/bus.db mcp --agent planner
      bus mcp                        # the agent joins under a name of its own
      bus mcp --agent planner --list
      bus mcp --agent planner --tools tasks,files   # the daily loop and two groups
      bus mcp --agent auto   # started in a worker's worktree: that worker
      bus mcp --agent planner --call publish --args '{"type": "note", "to": "worker-1"}'
    """
    # The SDK takes half a second to import and no other command needs it; serving starts
    # before it is imported (bus/mcpserver/stdio.py). It comes with the mcp extra: without
    # it, the error names that extra.
    require_extra("mcp", "mcp", "bus mcp")
    from bus.mcpserver.session import AgentSession

    bus = obj.open()
    session = AgentSession.open_on(bus, resolve_agent(bus, agent), tools)
    if tool is None and not list_only:
        from bus.mcpserver.stdio import serve_stdio

        # SIGINT ends the server at once and without a word, as SIGTERM does (a shell shows
        # status 130): there is nothing to save, and the bus file is safe against a process
        # ending at any point. A KeyboardInterrupt would unwind the event loop and its
        # threads (about 0.4 s), and click would print "Aborted!" on the client's stderr.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        serve_stdio(session)
        return
    server = import_extra("bus.mcpserver.server", "mcp", "bus mcp").build_server(session)
    if tool is not None:
        _call(server, tool, _arguments(arguments))
    else:
        _list(server, session, as_json)


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise click.UsageError(f"--args is not JSON ({exc}); give an object such as"
                               """ '{"type": "note"}'""") from exc
    if not isinstance(value, dict):
        raise click.UsageError("--args must be a JSON object of argument names and values")
    return value


def _call(server: Any, tool: str, arguments: dict[str, Any]) -> None:
    from bus.mcpserver.server import call_tool

    from bus.mcpserver.failures import Failure

    failed, result = call_tool(server, tool, arguments)
    if failed:
        error = Failure(result["error"]["code"], result["error"].get("argument"),
                        result["error"]["message"])
        raise click.ClickException(error.text()) from _Refused(error.argument)
    echo_json(result)


class _Refused(Exception):
    """The argument a tool error names: `--json` shows it as the error's field."""

    def __init__(self, field: str | None) -> None:
        super().__init__(field)
        self.field = field


def _list(server: Any, session: Any, as_json: bool) -> None:
    from bus.mcpserver.server import catalog

    listed = catalog(server, session)
    if as_json:
        echo_json(listed)
        return
    more = listed.pop("more")
    for kind, items in listed.items():
        click.echo(f"{kind}:")
        for item in items:
            click.echo(f"  {item['name']:<32} {item['description'].splitlines()[0]}")
    if more:
        click.echo("more with --tools GROUP:")
        for group in more:
            click.echo(f"  {group['name']:<32} {', '.join(group['tools'])}")


# --- bus token ----------------------------------------------------------------


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


COMMANDS = [mcp, hook, inbox, token]
