"""The agents' real clients, driven against a bus file and a scripted model (tests/support/model_api.py).

`make clients` installs them, pinned, with `npm ci` in tests/clients/ (the
package.json there names the versions). A test that needs one skips, with the
reason, when it is not installed; BUS_TEST_CLIENTS may name another
node_modules holding the same packages (a sibling checkout's, say).

- `ClaudeCode` runs `claude -p ... --output-format stream-json --verbose`: a
  private HOME and XDG_CACHE_HOME, ANTHROPIC_BASE_URL on the scripted model,
  no updater, telemetry or other traffic, `bus mcp` in an MCP config, and the
  bus's tools allowed by rule (as root Claude Code refuses
  --dangerously-skip-permissions).
- `InteractiveClaude` runs `claude` in tmux, waits until it is idle and types prompts.
- `Codex` runs `codex exec --json` with a private CODEX_HOME whose config.toml
  names the scripted model (Responses API) and `bus mcp` under
  [mcp_servers.agentbus].
- `Inspector` runs the MCP Inspector's CLI (`--cli ... --method ...`) against
  `bus mcp` over stdio, or a URL over HTTP with headers.

Import the fixtures into a test module: `from tests.support.real_clients import claude_code  # noqa`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bus import Bus
from tests.conftest import REPO_ROOT
from tests.support.hook_harness import child_env
from tests.support.hook_harness import installed
from tests.support.hook_harness import run
from tests.support.model_api import ScriptedModel
from tests.support.terminal import TMUX
from tests.support.terminal import Terminal

CLIENTS = Path(os.environ.get("BUS_TEST_CLIENTS")
               or REPO_ROOT / "tests" / "clients" / "node_modules")
CLAUDE = CLIENTS / "@anthropic-ai" / "claude-code-linux-x64" / "claude"
CODEX = CLIENTS / ".bin" / "codex"
INSPECTOR = CLIENTS / ".bin" / "mcp-inspector"
TAP = REPO_ROOT / "tests" / "support" / "mcp_tap.py"
IDLE_PROMPT = re.compile(r"^❯\s*$", re.MULTILINE)  # Claude Code's input line, empty
BUSY = "esc to interrupt"  # beside its spinner while a turn runs
CLIENT_TIMEOUT = 180.0
SERVER = "agentbus"  # the MCP server's name in every client's configuration
BUS_TOOLS = f"mcp__{SERVER}__"  # how Claude Code and Codex name the server's tools


def claude_version() -> str:
    """The installed Claude Code's version, as it names itself to an MCP server."""
    client(CLAUDE)
    return json.loads((CLAUDE.parent / "package.json").read_text())["version"]


def client(path: Path) -> str:
    """The installed client program at `path`, or a skip that says how to install it."""
    if not os.access(path, os.X_OK):
        pytest.skip(f"{path.name} is not installed under {CLIENTS}: run `make clients` "
                    "(needs node and npm; it installs tests/clients/package-lock.json)")
    return str(path)


@dataclass
class ClientRun:
    """One run of a client: exit code, its JSON lines (stream-json / --json), stderr, seconds."""

    returncode: int
    events: list[dict[str, Any]]
    stdout: str
    stderr: str
    seconds: float

    def check(self) -> ClientRun:
        assert self.returncode == 0, (self.stdout[-3000:], self.stderr[-3000:])
        return self

    def hook_responses(self) -> list[dict[str, Any]]:
        """Claude Code's `hook_response` events (stream-json): each hook run it reports, with
        its `hook_event`, `exit_code`, `outcome`, `output` and `stderr`."""
        return [event for event in self.events if event.get("type") == "system"
                and event.get("subtype") == "hook_response"]


def run_client(argv: list[str], env: dict[str, str], cwd: Path,
               timeout: float = CLIENT_TIMEOUT) -> ClientRun:
    started = time.monotonic()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)
    return ClientRun(done.returncode, json_lines(done.stdout), done.stdout, done.stderr,
                     time.monotonic() - started)


def json_lines(text: str) -> list[dict[str, Any]]:
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue  # a client's plain-text line between its JSON ones
        if isinstance(event, dict):
            events.append(event)
    return events


def bus_mcp_argv(db: Path, agent: str | None, *extra: str) -> list[str]:
    """`bus mcp` on `db` as this checkout's install runs it (the venv running the tests)."""
    return [installed("bus"), "--db", str(db), "mcp", *(["--agent", agent] if agent else []),
            *extra]


def tapped(argv: list[str], log: Path | None) -> list[str]:
    """`argv` behind tests/support/mcp_tap.py when `log` is given: each line both ways, timed, in it."""
    return argv if log is None else [sys.executable, str(TAP), str(log), "--", *argv]


def tap_log(log: Path) -> list[dict[str, Any]]:
    """What the tap saw: {t, from, message} per line, in order (none if it never started)."""
    return json_lines(log.read_text()) if log.exists() else []


class ClaudeCode:
    """Claude Code's native binary in `tmp_path`, pointed at `model`, with `bus mcp` on `db`.

    `mcp_args` are added to `bus mcp`'s command line (`--tools`, say); with
    `mcp_log`, the server runs behind tests/support/mcp_tap.py, which logs its traffic
    there. `env` is the client's environment, which its MCP server and hooks
    inherit.
    """

    def __init__(self, tmp_path: Path, model: ScriptedModel, db: Path, agent: str | None = "ann",
                 mcp_args: tuple[str, ...] = (), mcp_log: Path | None = None) -> None:
        self.binary = client(CLAUDE)
        self.db = db
        self.cwd = tmp_path / "project"
        self.home = tmp_path / "claude-home"
        self.cache = tmp_path / "cache"  # XDG_CACHE_HOME: `bus mcp`'s start cache lives here
        self.mcp_config = tmp_path / "mcp.json"
        for directory in (self.cwd, self.home, self.cache):
            directory.mkdir(exist_ok=True)
        command, *args = tapped(bus_mcp_argv(db, agent, *mcp_args), mcp_log)
        self.mcp_config.write_text(json.dumps({"mcpServers": {SERVER: {
            "command": command, "args": args}}}))
        self.env = child_env(tmp_path) | {
            "HOME": str(self.home), "XDG_CACHE_HOME": str(self.cache),
            "XDG_CONFIG_HOME": str(self.home / ".config"),
            "ANTHROPIC_BASE_URL": model.url, "ANTHROPIC_API_KEY": "sk-ant-scripted",
            "DISABLE_AUTOUPDATER": "1", "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_ERROR_REPORTING": "1"}
        for name in ("CLAUDECODE", "CLAUDE_CODE_ENTRYPOINT", "CLAUDE_CODE_SSE_PORT",
                     "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CONFIG_DIR"):
            self.env.pop(name, None)  # the session running the tests, if any, is not this one

    def install_hooks(self, *options: str) -> None:
        """`bus hook install claude` in the project: `options` are its own (`--agent ann`)."""
        run("bus", ["--db", str(self.db), "hook", "install", "claude", "--project",
                    str(self.cwd), *options], self.env, self.cwd)

    def session_args(self) -> list[str]:
        """The options of every run: the bus's MCP server only, its tools allowed."""
        return ["--mcp-config", str(self.mcp_config), "--strict-mcp-config",
                "--allowedTools", f"{BUS_TOOLS}*"]

    def argv(self, prompt: str, *extra: str) -> list[str]:
        return [self.binary, "-p", prompt, "--output-format", "stream-json", "--verbose",
                *self.session_args(), *extra]

    def run(self, prompt: str, *extra: str, timeout: float = CLIENT_TIMEOUT) -> ClientRun:
        return run_client(self.argv(prompt, *extra), self.env, self.cwd, timeout)


class InteractiveClaude:
    """Claude Code as a person runs it, in a tmux terminal: for what only an idle session shows.

    `start` answers the first-run questions ahead (onboarding, the API key, trust in the
    project) in the private HOME, starts `claude` with the options of `claude`'s runs, and
    returns once it is idle. `prompt` types a line and presses Enter.
    """

    def __init__(self, claude: ClaudeCode, model: ScriptedModel, tmp_path: Path) -> None:
        if TMUX is None:
            pytest.skip("tmux is not installed (make test installs it)")
        self.claude, self.model = claude, model
        self.terminal = Terminal(tmp_path, claude.env)

    def start(self, *extra: str) -> None:
        key = self.claude.env["ANTHROPIC_API_KEY"]
        (self.claude.home / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "theme": "dark",
            "customApiKeyResponses": {"approved": [key[-20:]], "rejected": []},
            "projects": {str(self.claude.cwd): {"hasTrustDialogAccepted": True,
                                                "hasCompletedProjectOnboarding": True}}}))
        argv = [self.claude.binary, *self.claude.session_args(), *extra]
        self.terminal.start(f"cd {shlex.quote(str(self.claude.cwd))} && {shlex.join(argv)}")
        self.wait_idle("the session's first idle prompt")

    def idle(self, screen: str) -> bool:
        """The turn is over for the model and on the screen: an empty input line, no spinner."""
        return (self.model.turn_ended() and IDLE_PROMPT.search(screen) is not None
                and BUSY not in screen)

    def wait_idle(self, what: str = "the session going idle") -> str:
        return self.terminal.wait_for(self.idle, what)

    def prompt(self, text: str) -> int:
        """Type `text` and Enter; the number of model requests before it, for `model.wait_for`."""
        since = len(self.model.requests)
        self.terminal.keys("-l", text)
        self.terminal.keys("Enter")
        return since

    def close(self) -> None:
        self.terminal.close()


class Codex:
    """The Codex CLI in `tmp_path`: CODEX_HOME/config.toml names `model` and `bus mcp` on `db`
    (`mcp_args` and `mcp_log` as for ClaudeCode). The file is written at each run, from
    `env` as it is then."""

    def __init__(self, tmp_path: Path, model: ScriptedModel, db: Path, agent: str | None = "ann",
                 mcp_args: tuple[str, ...] = (), mcp_log: Path | None = None) -> None:
        self.binary = client(CODEX)
        self.model_url = model.url
        self.server = tapped(bus_mcp_argv(db, agent, *mcp_args), mcp_log)
        self.cwd = tmp_path / "project"
        self.home = tmp_path / "codex-home"
        self.cache = tmp_path / "cache"
        for directory in (self.cwd, self.home, self.cache):
            directory.mkdir(exist_ok=True)
        self.env = child_env(tmp_path) | {"HOME": str(tmp_path), "CODEX_HOME": str(self.home),
                                          "XDG_CACHE_HOME": str(self.cache)}
        self.env.pop("OPENAI_API_KEY", None)

    def config(self) -> str:
        # Codex starts an MCP server with a few variables of its own only: the rest by name.
        server_env = {name: self.env[name] for name in ("PYTHONPATH", "XDG_CACHE_HOME")
                      if name in self.env}
        return "\n".join([
            'model = "gpt-5-codex"',
            'model_provider = "scripted"',
            'approval_policy = "never"',
            'sandbox_mode = "read-only"',
            "",
            "[model_providers.scripted]",
            'name = "scripted model"',
            f"base_url = {toml_string(self.model_url + '/v1')}",
            'wire_api = "responses"',
            "request_max_retries = 0",
            "stream_max_retries = 0",
            "",
            f"[mcp_servers.{SERVER}]",
            f"command = {toml_string(self.server[0])}",
            f"args = [{', '.join(toml_string(arg) for arg in self.server[1:])}]",
            f"env = {{ {', '.join(f'{k} = {toml_string(v)}' for k, v in server_env.items())} }}",
            ""])

    def argv(self, prompt: str, *extra: str) -> list[str]:
        return [self.binary, "exec", "--json", "--skip-git-repo-check", *extra, prompt]

    def run(self, prompt: str, *extra: str, timeout: float = CLIENT_TIMEOUT) -> ClientRun:
        (self.home / "config.toml").write_text(self.config())
        return run_client(self.argv(prompt, *extra), self.env, self.cwd, timeout)


def toml_string(text: str) -> str:
    return json.dumps(text)  # a JSON string is a TOML basic string for these paths and URLs


class Inspector:
    """The MCP Inspector's CLI, with a private HOME (its catalog lives there)."""

    def __init__(self, tmp_path: Path) -> None:
        self.binary = client(INSPECTOR)
        self.home = tmp_path / "inspector-home"
        self.home.mkdir(exist_ok=True)
        self.env = child_env(tmp_path) | {"HOME": str(self.home)}
        self.cwd = tmp_path

    def call(self, target: list[str], method: str, *extra: str,
             timeout: float = CLIENT_TIMEOUT) -> ClientRun:
        """`--method METHOD` on `target` (a command and its arguments, or a URL and
        `--transport http`), with the CLI's other options in `extra`."""
        return run_client([self.binary, "--cli", *target, "--method", method, *extra],
                          self.env, self.cwd, timeout)

    def result(self, target: list[str], method: str, *extra: str) -> dict[str, Any]:
        """The JSON result the CLI prints for a call that succeeded."""
        done = self.call(target, method, *extra).check()
        return json.loads(done.stdout)


def stall_the_sdk(env: dict[str, str], tmp_path: Path) -> None:
    """Make the MCP SDK's import never end for the `bus mcp` that `env` starts: what a client
    gets then is what `bus mcp` answers before the SDK is loaded, its fast start."""
    stalled = tmp_path / "stalled-sdk" / "mcp"
    stalled.mkdir(parents=True, exist_ok=True)
    (stalled / "__init__.py").write_text("import time\ntime.sleep(3600)\n")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(stalled.parent),
                                                      env.get("PYTHONPATH")]))


@pytest.fixture
def scripted_model():
    """A ScriptedModel with an empty script: a test sets `scripted_model.script` first."""
    with ScriptedModel() as model:
        yield model


@pytest.fixture
def client_bus(db_path: Path) -> Path:
    """A bus file made before any client starts."""
    with Bus.open(db_path, create=True):
        pass
    return db_path


@pytest.fixture
def claude_code(tmp_path: Path, scripted_model: ScriptedModel, client_bus: Path) -> ClaudeCode:
    return ClaudeCode(tmp_path, scripted_model, client_bus)


@pytest.fixture
def interactive_claude(tmp_path: Path, claude_code: ClaudeCode, scripted_model: ScriptedModel):
    """An InteractiveClaude, not started yet (hooks may be installed first); closed at the end."""
    session = InteractiveClaude(claude_code, scripted_model, tmp_path)
    yield session
    session.close()


@pytest.fixture
def codex(tmp_path: Path, scripted_model: ScriptedModel, client_bus: Path) -> Codex:
    return Codex(tmp_path, scripted_model, client_bus)


@pytest.fixture
def inspector(tmp_path: Path) -> Inspector:
    return Inspector(tmp_path)
