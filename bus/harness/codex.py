"""The Codex CLI's configuration: `bus hook install codex` writes the bus into its config.toml.

From Codex's docs (developers.openai.com/codex/hooks and /codex/config-reference,
read for this module) and checked against codex-cli 0.171.0:

- The configuration is `$CODEX_HOME/config.toml` (default `~/.codex`). MCP
  servers are tables `[mcp_servers.NAME]` with `command`, `args` and `env`.
- Hooks may be inline in the same file, in the shape of Claude Code's
  settings: `[[hooks.Stop]]` entries, each with `[[hooks.Stop.hooks]]`
  handlers `{type = "command", command = ..., timeout = seconds}`. Codex
  sends the same JSON on stdin as Claude Code (`session_id`, `cwd`,
  `hook_event_name`, Stop's `stop_hook_active`) and reads the same answers:
  `hookSpecificOutput.additionalContext` at SessionStart and
  UserPromptSubmit, `decision: "block"` with a `reason` at Stop. So `bus hook
  codex` is `bus hook claude`'s logic (bus/harness/claude_code.py), without the
  background waiter, which Codex has no way to run.
- Codex runs a hook someone added only once it is trusted: `/hooks` in an
  interactive `codex` reviews and trusts them; automation that vets its hook
  sources passes `codex exec --dangerously-bypass-hook-trust`.

The file is the user's: it is edited with tomlkit, which keeps every other
table, key, comment and the layout as they were (the stdlib reads TOML but
does not write it, and tomli-w would write the data back without the comments).
tomlkit comes with the `[mcp]` extra, as `bus mcp`, which Codex is to run, does.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path
from typing import Any
from typing import Mapping
from typing import Sequence

import tomlkit

from bus.harness import claude_code
from bus.storage.errors import ValidationFailed

EVENTS = (claude_code.SESSION_START, claude_code.USER_PROMPT_SUBMIT, claude_code.STOP)
HOME_ENV = "CODEX_HOME"
CONFIG_FILE = "config.toml"
MCP_SERVER = "agentbus"


def codex_home(environ: Mapping[str, str] = os.environ) -> Path:
    """Where Codex keeps its configuration: $CODEX_HOME, else ~/.codex."""
    return Path(environ.get(HOME_ENV) or Path.home() / ".codex")


def hook_commands(base: list[str], agent: str) -> dict[str, str]:
    """The command line each event runs: `base` (the bus program and its --db) + `hook codex`."""
    command = shlex.join([*base, "hook", "codex", "--agent", agent])
    return {event: command for event in EVENTS}


def is_ours(command: object) -> bool:
    """A hook command that runs `bus ... hook codex` (any agent, any flags)."""
    return claude_code.bus_hook_words(command, "codex") is not None


def _is_our_hook(hook: object) -> bool:
    return isinstance(hook, Mapping) and is_ours(hook.get("command"))


def merge_config(text: str, commands: Mapping[str, str], timeout: int,
                 server: Sequence[str], server_env: Mapping[str, str]) -> str:
    """`text` (a config.toml) with our hook on each event of `commands` and the MCP server
    `[mcp_servers.agentbus]` running `server` with `server_env`, all else kept.

    An earlier hook of ours is replaced where it was; `text` itself comes back
    when it already says all this. ValidationFailed when the file is not TOML,
    or `hooks` has a shape Codex would not read.
    """
    try:
        doc = tomlkit.parse(text)
    except tomlkit.exceptions.ParseError as exc:
        raise ValidationFailed("codex-home", f"{CONFIG_FILE} is not valid TOML ({exc}); fix or"
                               " move it, nothing was written") from exc
    hooks = doc.get("hooks")
    if hooks is None:
        hooks = doc["hooks"] = tomlkit.table(is_super_table=True)
    elif not isinstance(hooks, Mapping):
        raise ValidationFailed("hooks", f"in {CONFIG_FILE} is not a table; fix it by hand"
                               " (Codex reads [[hooks.Stop]] entries)")
    for event, command in commands.items():
        ours = {"type": "command", "command": command, "timeout": timeout}
        hooks[event] = claude_code.merge_entries(event, list(hooks.get(event, [])), ours,
                                                 _is_our_hook)
    servers = doc.get("mcp_servers")
    if servers is None:
        servers = doc["mcp_servers"] = tomlkit.table(is_super_table=True)
    entry: dict[str, Any] = {"command": server[0], "args": list(server[1:])}
    if server_env:
        entry["env"] = dict(server_env)
    servers[MCP_SERVER] = entry
    if doc.unwrap() == tomlkit.parse(text).unwrap():
        return text  # nothing to change: not even the blank lines tomlkit redraws
    return tomlkit.dumps(doc)
