"""Bad bus files of every kind, and every command with arguments it accepts.

Shared by tests/storage/test_bad_files.py (in-process, through click's CliRunner) and
tests/journeys/test_bad_files.py (the installed `bus` and `worker`). Each kind
is a real file built the way a user meets it; the table gives every command
minimal valid arguments, so that it reaches the point where it opens the bus.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
from pathlib import Path
from typing import Iterator

import apsw
import click
import pytest

from bus import Bus
from bus.cli import main as bus_main
from workers.cli import main as worker_main
from workers.lifecycle import Workers

ROOT = Path(__file__).resolve().parents[2]
ORGANISM = ROOT / "examples" / "organism.yaml"
IS_ROOT = os.geteuid() == 0


# --- the kinds of bad file -----------------------------------------------------------------


def good_bus(path: Path) -> None:
    """A closed bus with 300 messages (several pages of them), a cursor and a channel."""
    with Bus.open(path) as bus:
        bus.publish_many([{"from_agent": "a", "type": "t", "payload": {"n": n, "pad": "p" * 200}}
                          for n in range(300)])
        bus.ack("a", 5)
        bus.heartbeats.beat("a", "working", task="t1")
        bus.claims.claim("t1", "a")
        bus.tasks.add("g0", title="a task of the graph")
        bus.tasks.add("g1", title="another")
        bus.tasks.claim_next("a")  # g0, fence 1
        bus.reservations.reserve("a", ["src/**"])
        engine = bus.channels
        engine.create_channel("c", "group", "o")
        engine.join_channel("c", "a")
        engine.send_message("c", "o", "text", "hi")
        dead_letter(bus)


def dead_letter(bus: Bus) -> None:
    """Dead letter 1: a delivery on channel d that ran out of its (zero) retries."""
    engine = bus.channels
    engine.create_channel("d", "group", "o", max_retries=0, ack_timeout=0.001)
    engine.join_channel("d", "a")
    engine.send_message("d", "o", "text", "lost")
    engine.receive_messages("a")
    engine.tick(now=engine.clock() + 60_000)
    assert [d.id for d in engine.dead_letters()] == [1]


def read_only_bus(path: Path) -> None:
    """A good bus with worker w1 WORKING on task t1 in a git repository beside it."""
    good_bus(path)
    repo = path.parent.parent / "repo"
    git_repo(repo)
    with Bus.open(path) as bus:
        workers = Workers(bus)
        workers.spawn("t9", "w1", repo)
        workers.start("w1")
    worktree = path.parent / "worktrees" / "w1"
    subprocess.run(["git", "-C", str(worktree), "-c", "user.name=t", "-c", "user.email=t@t",
                    "commit", "-q", "--allow-empty", "-m", "work"], check=True)


def corrupt(path: Path) -> None:
    """A bus with two pages in its middle overwritten (a bad sector, a torn copy)."""
    good_bus(path)
    page_size = 4096
    middle = path.stat().st_size // 2 // page_size * page_size
    with open(path, "r+b") as f:
        f.seek(middle)
        f.write(b"\xa5" * 2 * page_size)


def foreign(path: Path) -> None:
    """Another application's SQLite database (its tables, no application id of ours)."""
    conn = apsw.Connection(str(path))
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);"
                 " INSERT INTO notes (body) VALUES ('remember the milk')")
    conn.close()


def newer(path: Path) -> None:
    """A bus that a newer agentbus migrated (schema version 999)."""
    good_bus(path)
    conn = apsw.Connection(str(path))
    conn.execute("PRAGMA user_version = 999")
    conn.close()


def truncated(path: Path) -> None:
    """A bus cut short mid-page (a copy interrupted, a full disk)."""
    good_bus(path)
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2 + 100)


def header_then_garbage(path: Path) -> None:
    """SQLite's 16-byte magic header, then random bytes."""
    path.write_bytes(b"SQLite format 3\x00" + random.Random(29).randbytes(8000))


def missing(path: Path) -> None:
    """No file at all (its directory exists)."""


KINDS = {"corrupt": corrupt, "foreign": foreign, "newer": newer, "truncated": truncated,
         "header-then-garbage": header_then_garbage, "missing": missing,
         "read-only": read_only_bus}


BAD_KINDS = ["corrupt", "foreign", "newer", "truncated", "header-then-garbage", "missing"]
# What the error says about each kind (the fix follows it).
NAMED = {
    "corrupt": "is corrupt (",
    "foreign": "is a SQLite database with tables that agentbus did not create",
    "newer": "has schema version 999, but this agentbus supports up to version",
    "truncated": "is corrupt (",
    "header-then-garbage": "is not a readable SQLite database",
    "missing": "no bus database at",
}
# `bus history` reads the export, not the bus: without either it names the export.
NAMED_BY_COMMAND = {("missing", "bus history"): "no export at"}


def make_kind(kind: str, directory: Path) -> Path:
    """The bus file of `kind` in `directory` (read-only is made so by `read_only_directory`)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bus.db"
    KINDS[kind](path)
    return path


@contextlib.contextmanager
def read_only_directory(directory: Path) -> Iterator[None]:
    """`directory` and its files read-only for this process while the block runs.

    Root writes through any mode bits, so as root the directory is bind-mounted
    read-only over itself; any other user gets files 0444 in a 0555 directory.
    """
    if not IS_ROOT:
        for p in directory.rglob("*"):
            p.chmod(0o555 if p.is_dir() else 0o444)
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(0o755)
        return
    for argv in (["mount", "--bind", str(directory), str(directory)],
                 ["mount", "-o", "remount,bind,ro", str(directory)]):
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            subprocess.run(["umount", str(directory)], capture_output=True)
            pytest.skip(f"cannot make a read-only mount here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every path under `directory` with its bytes (None for a directory)."""
    return {str(p.relative_to(directory)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(directory.rglob("*"))}


# --- every command, and how each behaves ---------------------------------------------------


def command_names() -> list[str]:
    """Every visible command of `bus` and `worker` that runs: each leaf, and each group
    that runs without a subcommand too (`bus history`), read from the click groups."""
    def walk(group: click.Group, prefix: str) -> Iterator[str]:
        for name, command in sorted(group.commands.items()):
            if command.hidden:
                continue
            if isinstance(command, click.Group):
                if command.invoke_without_command:
                    yield f"{prefix} {name}"
                yield from walk(command, f"{prefix} {name}")
            else:
                yield f"{prefix} {name}"
    return [*walk(bus_main, "bus"), *walk(worker_main, "worker")]


# Minimal valid arguments: each names what the read-only bus of `good_bus` holds.
ARGS: dict[str, list[str]] = {
    "bus ack": ["--agent", "a", "--seq", "6"],
    "bus alive": [],
    "bus channel acknowledge": ["--agent", "a", "--seq", "301", "--status", "acknowledged"],
    "bus channel close": ["c"],
    "bus channel create": ["c2", "--type", "group", "--owner", "o"],
    "bus channel deliveries": ["--seq", "301"],
    "bus channel drain": ["c"],
    "bus channel join": ["c", "--agent", "b"],
    "bus channel leave": ["c", "--agent", "a"],
    "bus channel list": [],
    "bus channel pause": ["c"],
    "bus channel query": [],
    "bus channel receive": ["--agent", "a"],
    "bus channel resume": ["c"],
    "bus channel send": ["--channel", "c", "--from", "o", "--type", "text", "--content", "hi"],
    "bus channel show": ["c"],
    "bus channel subscribe": ["c", "--agent", "a", "--pattern", "x.y"],
    "bus channel thread": ["corr"],
    "bus channel tick": [],
    "bus channel unsubscribe": ["c", "--agent", "a", "--pattern", "x.y"],
    "bus check": [],
    "bus claim": ["--task", "t2", "--agent", "a"],
    "bus claims": [],
    "bus compact": [],
    "bus consumer info": ["a"],
    "bus consumers": [],
    "bus cursor delete": ["a"],
    "bus cursor set": ["a", "--latest"],
    "bus dlq discard": ["1"],
    "bus dlq list": [],
    "bus dlq purge": ["--older-than", "0"],
    "bus dlq replay": ["1"],
    "bus dlq show": ["1"],
    "bus export": [],
    "bus forget": ["a"],
    "bus gc": [],
    "bus heartbeat": ["--agent", "a"],
    "bus help": ["status"],
    "bus hook claude": ["--agent", "a"],
    "bus hook install claude": ["--agent", "a", "--project", "{dir}"],
    "bus hook codex": ["--agent", "a"],
    "bus hook install codex": ["--agent", "a", "--codex-home", "{dir}/codex"],
    "bus inbox": ["--agent", "a"],
    "bus history": [],
    "bus history serve": ["--status"],  # without it, it would start a Spark server
    "bus init": [],
    "bus mcp": ["--agent", "a", "--list"],
    "bus mirror nats": ["--url", "nats://127.0.0.1:9", "--stream", "BUS", "--until-caught-up"],
    "bus replicate": ["--to", "file://{dir}/replica", "--config-only"],
    "bus restore": ["--from", "file://{dir}/replica", "{dir}/restored.db"],
    "bus migrate": [],
    "bus poll": ["--agent", "a"],
    "bus publish": ["--from", "a", "--type", "t"],
    "bus pump dead": [str(ORGANISM)],
    "bus pump oob keygen": ["--out", "{dir}/key"],
    "bus pump oob send": ["list-capabilities", "--key", "{dir}/key"],
    "bus pump organism check": [str(ORGANISM)],
    "bus pump run": [str(ORGANISM), "--until-idle", "--no-oob"],
    "bus pump send": [str(ORGANISM), "<add><a>1</a><b>2</b></add>", "--to", "calculator"],
    "bus pump threads": [],
    "bus reap": [],
    "bus release": ["--task", "t1", "--agent", "a"],
    "bus reservations": [],
    "bus reserve": ["--agent", "a", "docs/**"],
    "bus unreserve": ["--agent", "a"],
    "bus hooks install": ["--repo", "{dir}"],
    "bus hooks pre-commit": ["--agent", "a"],
    "bus task add": ["g2", "--after", "g1"],
    "bus task cancel": ["g1"],
    "bus task claim-next": ["--agent", "a"],
    "bus task depend": ["g1", "--after", "g0"],
    "bus task done": ["g0", "--agent", "a", "--fence", "1"],
    "bus task list": [],
    "bus task ready": [],
    "bus task show": ["g0"],
    "bus renew": ["--task", "t1", "--agent", "a"],
    "bus schema": [],
    "bus search": ["--enable"],
    "bus serve": ["--port", "0"],
    "bus sql": ["SELECT count(*) FROM messages"],
    "bus status": [],
    "bus tables": [],
    "bus token create": ["--agent", "a"],
    "bus token list": [],
    "bus token revoke": ["tok-00000000"],
    "bus tail": [],
    "bus top": [],
    "bus xml check": ["--schema", "{dir}/schema.xsd", "{dir}/doc.xml"],
    "bus xml schema": ["bus.pump.meta:Capabilities"],
    "worker approve": ["w1"],
    "worker cancel": ["w1"],
    "worker cleanup": ["--finished"],
    "worker done": ["w1"],
    "worker fail": ["w1", "--reason", "r"],
    "worker heartbeat": ["w1"],
    "worker merge": ["w1"],
    "worker reject": ["w1", "--reason", "r"],
    "worker rework": ["w1"],
    "worker run": ["w1", "--", "true"],
    "worker spawn": ["--task", "t", "--repo", "{dir}"],
    "worker start": ["w1"],
    "worker status": [],
}

# What a command reads on stdin: a hook command gets one event, as Claude Code sends it.
STDIN: dict[str, str] = {
    "bus hook claude": '{"hook_event_name": "SessionStart", "session_id": "s", "cwd": "/"}',
    "bus hook codex": '{"hook_event_name": "SessionStart", "session_id": "s", "cwd": "/"}',
}

# Commands that never open the bus file: the kind of file does not matter to them.
NO_BUS = {
    "bus help": "prints a command's help",
    "bus history serve": "keeps its server's pid and port beside the file, never opens it",
    "bus hook install claude": "writes .claude/settings.json in --project",
    "bus hook install codex": "writes config.toml in --codex-home",
    "bus hooks install": "writes a git pre-commit hook naming the file, which it never opens",
    "bus pump oob keygen": "writes a key pair",
    "bus pump oob send": "talks to a running pump's socket, not to the file",
    "bus pump organism check": "checks organism.yaml",
    "bus restore": "restores a replica into a new path, never the bus it names",
    "bus xml check": "validates an XML file against an XSD",
    "bus xml schema": "prints a class's XSD",
}

# Commands that create a missing bus: `bus init` by its nature, the pump (its
# first start makes its bus) and `worker spawn` (the first worker makes it).
CREATES = {"bus init", "bus pump run", "bus pump send", "worker spawn"}

# Commands that go on, with a note naming the file, when there is no bus: a git
# hook must not stop every commit of a repository whose bus was never made.
GOES_ON_WITHOUT_A_BUS = {"bus hooks pre-commit": "no bus at {db}; nothing is reserved"}
NOT_REFUSED_WHEN_MISSING = CREATES | set(GOES_ON_WITHOUT_A_BUS)

# Commands that only read: on a read-only bus they work (exit 0).
READS = {
    "bus alive", "bus channel deliveries", "bus channel list", "bus channel query",
    "bus channel show", "bus channel thread", "bus check", "bus claims", "bus consumer info",
    "bus consumers", "bus dlq list", "bus dlq show", "bus help", "bus inbox", "bus mcp",
    "bus migrate", "bus poll",
    "bus pump dead", "bus pump threads", "bus schema", "bus sql", "bus status", "bus tables",
    "bus tail", "bus token list", "worker status", "bus reservations", "bus task list",
    "bus task ready", "bus task show", "bus hooks pre-commit",
}

# Write commands with nothing to write on that bus: they succeed and change nothing.
NOTHING_TO_WRITE = {"bus init": "the bus exists at the latest schema version",
                    "bus gc": "no unreferenced blob to delete",
                    "worker cleanup": "no finished worker"}

# Write commands on a read-only bus: what the error says. Most reach the write
# and say the file cannot be written; these are refused before it, and say why.
READ_ONLY_ERRORS = {
    "worker merge": "worker w1 is WORKING; allowed:",
    "worker spawn": "Read-only file system",  # git cannot make the worktree beside the bus
    "bus mirror nats": "no server answered at",  # it reaches NATS before it writes its cursor
}

# Commands that run until stopped (or start Spark) on a good file: they are
# run on the bad kinds, where they must stop at once, and not on a read-only
# good bus (tests/views/test_views_*.py and the journeys run them there).
RUN_ON = {"bus top": "a live terminal view", "bus serve": "a web server",
          "bus history": "a Spark job"}


def arguments(command: str, scratch: Path) -> list[str]:
    """The command's arguments, with `scratch` (a directory apart from the bus) made ready."""
    scratch.mkdir(parents=True, exist_ok=True)
    if command == "worker spawn" and not (scratch / ".git").exists():
        git_repo(scratch)
    return [a.replace("{dir}", str(scratch)) for a in ARGS[command]]


def git_repo(path: Path) -> None:
    """A git repository with one commit at `path`."""
    path.mkdir(parents=True, exist_ok=True)
    for argv in (["init", "-q", "-b", "main"], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                "commit", "-q", "--allow-empty", "-m", "start"]):
        subprocess.run(["git", "-C", str(path), *argv], check=True)
