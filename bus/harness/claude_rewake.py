"""Claude Code's `asyncRewake` hook: an idle session starts a turn when a message comes for it.

The contract, from Claude Code's hooks reference ("Run hooks in the
background", the `async` and `asyncRewake` fields of a command hook) and
checked against the 2.1.332 binary:

- A command hook with `"asyncRewake": true` runs in the background: the
  session does not wait for it, and may go idle (waiting for its user) while
  it runs. When it exits with code 2, its stderr (its stdout when stderr is
  empty) is queued for the model as a system reminder and starts a turn,
  even in an idle session. Any other exit code shows nothing.
- `"async": true` beside it keeps it in the background in headless runs too
  (`claude -p`); without it a headless run would wait for it at each event.
- `rewakeMessage` is the text put before the output ("Stop hook blocking
  error from command ..." by default, which reads as a failure), and
  `rewakeSummary` the line the user sees in the terminal.
- The hook's `timeout` (seconds) still applies: it is killed then.
- Claude Code kills its background hooks when it exits, but not when it is
  killed: a hook outliving its session must notice by itself. Hooks get the
  session's process id in `CLAUDE_PID`, and `CLAUDE_CODE_SESSION_ATTENDED=0`
  in a session nobody attends (`claude -p`, the SDK), which waits up to 30 s
  at its end for background hooks still running.

So `bus hook claude --rewake` runs at SessionStart (a session idle from its
start) and at each Stop (re-armed after every turn), waits on the bus's own
wake (`Bus.wait_for`, no polling) until a message waits for the agent,
then posts the messages to the session's inbox socket (`SessionInbox`) where
it has one and the session records them as queued, else writes them to
stderr and exits 2. Two files beside the bus
database, in `claude-wake/`, keep it to one delivery per message:

- a session's *waiter lock*: one waiter per session. A Stop that finds the
  session's waiter still waiting (it was armed before a turn the user
  started) leaves it to that one and exits at once.
- an agent's *delivery lock*, held from the poll to the ack by every hook
  that shows messages (this waiter and `bus hook claude`): a message shown
  by one is acked before another looks, so no two show it.

Both are `flock` locks, which the kernel drops when their holder dies
(`kill -9` included); the files stay, empty, and a session's goes a day after
its last waiter. Messages are acked once delivered; a waiter killed before
that (its session ended, its timeout) acks nothing, and they come with the
next hook.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import select
import shlex
import socket
import time
from contextlib import contextmanager
from pathlib import Path
from typing import IO
from typing import Any
from typing import Iterator
from typing import Mapping

import orjson

from bus.harness.inbox import Inbox
from bus.harness.inbox import Log
from bus.harness.inbox import acknowledge
from bus.harness.inbox import pending

STATE_DIR = "claude-wake"  # beside the bus database, as claude-hooks/ (claude_code)
WAKE_EXIT = 2  # the exit code that wakes the session
REWAKE_WAIT_S = 24 * 3600  # how long a waiter waits, at most, by default
REWAKE_TIMEOUT_MARGIN_S = 60  # the hook's timeout: the wait and room to start and finish
STALE_WAITER_S = REWAKE_WAIT_S + 3600  # a waiter lock this old has no waiter left to serve
REWAKE_MESSAGE = "Woken by the agent bus."  # before the messages, in place of an error's words
REWAKE_SUMMARY = "agentbus: new messages"  # the line the user sees in the terminal
SESSION_PID_ENV = "CLAUDE_PID"
ATTENDED_ENV = "CLAUDE_CODE_SESSION_ATTENDED"
SESSION_ENV = "CLAUDE_CODE_SESSION_ID"
SOCKET_ENV = "CLAUDE_CODE_MESSAGING_SOCKET"
TOKEN_ENV = "CLAUDE_CODE_MESSAGING_TOKEN"
SOCKET_TIMEOUT_S = 5.0  # a session that has not queued our lines by then is taken as without one
TRANSCRIPT_LOOK_S = 0.01  # between looks at the transcript for the session's enqueue record


def rewake_command(base: list[str], agent: str, wait: float) -> str:
    """The waiter's command line: `base` (the bus program and its --db) + `hook claude`."""
    wait_text = str(int(wait)) if float(wait).is_integer() else str(wait)
    return shlex.join([*base, "hook", "claude", "--agent", agent, "--wait", wait_text,
                       "--rewake"])


def hook_fields(wait: float) -> dict[str, Any]:
    """The settings fields of the waiter's hook, beside its type and command."""
    return {"async": True, "asyncRewake": True, "timeout": int(wait) + REWAKE_TIMEOUT_MARGIN_S,
            "rewakeMessage": REWAKE_MESSAGE, "rewakeSummary": REWAKE_SUMMARY}


def unattended(environ: Mapping[str, str] = os.environ) -> bool:
    """A session nobody attends (`claude -p`): it never goes idle, and would wait for us."""
    return environ.get(ATTENDED_ENV) == "0"


def state_path(db_path: str | os.PathLike[str], kind: str, key: str) -> Path:
    """`claude-wake/<kind>-<hash of key>.lock` beside the database (any key is a safe name)."""
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return Path(db_path).absolute().parent / STATE_DIR / f"{kind}-{digest}.lock"


def _open_lock(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def claim_session(db_path: str | os.PathLike[str], session: str) -> int | None:
    """The session's waiter lock as an open fd, held until it is closed or this process
    dies; None when another waiter holds it."""
    path = state_path(db_path, "waiter", session)
    fd = _open_lock(path)
    if not _try_lock(fd):
        os.close(fd)
        return None
    os.utime(fd)  # the file's age says when its session last had a waiter
    _prune_waiter_locks(path)
    return fd


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _prune_waiter_locks(mine: Path) -> None:
    """Remove the waiter locks of sessions without a waiter for a day (gone sessions).

    Only a lock this process can take is removed, while it holds it: a
    waiter still waiting keeps its file.
    """
    cutoff = time.time() - STALE_WAITER_S
    for other in mine.parent.glob("waiter-*.lock"):
        try:
            if other == mine or other.stat().st_mtime >= cutoff:
                continue
            fd = os.open(other, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # another waiter pruned it first
        try:
            if _try_lock(fd):
                other.unlink(missing_ok=True)
        finally:
            os.close(fd)


@contextmanager
def delivering(db_path: str | os.PathLike[str], agent: str) -> Iterator[None]:
    """Hold the agent's delivery lock: from a poll to the ack of what it showed."""
    fd = _open_lock(state_path(db_path, "deliver", agent))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # drops the lock


def session_gone_fd(environ: Mapping[str, str] = os.environ) -> int | None:
    """A pidfd that turns readable when the session's process (CLAUDE_PID) ends, or None
    where there is none to watch (an older Claude Code, not Linux, a process gone already)."""
    raw = environ.get(SESSION_PID_ENV, "")
    if not raw.isdigit() or not hasattr(os, "pidfd_open"):
        return None
    try:
        return os.pidfd_open(int(raw))
    except OSError:
        return None


def _gone(fd: int | None) -> bool:
    if fd is None:
        return False
    return bool(select.select([fd], [], [], 0)[0])  # a pidfd is readable once its process ended


class NotAccepted(OSError):
    """The session's inbox read our lines but did not record them as queued."""


class SessionInbox:
    """A Claude Code session's inbox socket (2.1.224 and later), where a message starts a
    turn as soon as it is read, in an idle session too.

    Claude Code advertises it to its hooks in CLAUDE_CODE_MESSAGING_SOCKET (a
    Unix socket) and CLAUDE_CODE_MESSAGING_TOKEN; a client sends JSON lines,
    `{"type": "auth", "token": ...}` first, then `{"type": "user", "message":
    {"role": "user", "content": ...}}` (its own start-up log documents this),
    and the session reads them once the client closes its side. The model is
    shown it as a message from a peer. Older versions set neither variable.

    The socket never answers on the connection: 2.1.332 closes its side both
    when it queued the message and when it dropped it (a bad token, a line it
    could not parse), so the close says nothing. What says the session
    accepted it is its transcript (the hook event's `transcript_path`): a
    queued message is recorded there at once, as `{"type": "queue-operation",
    "operation": "enqueue", "content": <the text>}`, in an idle session and a
    busy one alike. So a post counts only once that line appears; a session
    whose transcript is unknown, or that records another shape (another
    protocol version), gets the hook's way (stderr and exit 2) instead.
    """

    def __init__(self, path: str, token: str, transcript: str) -> None:
        self.path = path
        self.token = token
        self.transcript = Path(transcript)

    @classmethod
    def of_session(cls, transcript: str | None,
                   environ: Mapping[str, str] = os.environ) -> SessionInbox | None:
        """The session's inbox, or None where it has none or we could not confirm a post."""
        path, token = environ.get(SOCKET_ENV), environ.get(TOKEN_ENV)
        return cls(path, token, transcript) if path and token and transcript else None

    def post(self, text: str) -> None:
        """Send `text`; return once the session has recorded it as queued.

        OSError (refused, gone, too slow, NotAccepted) when it may not have:
        nothing is acked then.
        """
        offset = self._transcript_size()
        lines = [{"type": "auth", "token": self.token},
                 {"type": "user", "message": {"role": "user", "content": text}}]
        deadline = time.monotonic() + SOCKET_TIMEOUT_S
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(SOCKET_TIMEOUT_S)
            conn.connect(self.path)
            conn.sendall(b"".join(orjson.dumps(line) + b"\n" for line in lines))
            conn.shutdown(socket.SHUT_WR)
            while conn.recv(4096):
                pass  # it has read our lines once it closes; whether it took them, see below
        self._wait_for_enqueue(text, offset, deadline)

    def _transcript_size(self) -> int:
        """Where the session's next records will start. NotAccepted when it has no transcript
        yet: a session nobody has spoken to writes its first records only at the end of
        its first turn (2.1.332), too late to confirm a post by; the hook's way it is."""
        try:
            return self.transcript.stat().st_size
        except FileNotFoundError:
            raise NotAccepted(f"{self.transcript} does not exist yet") from None

    def _wait_for_enqueue(self, text: str, offset: int, deadline: float) -> None:
        """Return when the transcript records `text` queued after `offset`; NotAccepted when
        it has not by `deadline`. The session writes it as it reads our lines, so this
        looks every few ms for a moment (a file has no commit signal to wake on)."""
        while True:
            if self._enqueued(text, offset):
                return
            if time.monotonic() >= deadline:
                raise NotAccepted(f"{self.transcript} records no queued message of ours")
            time.sleep(TRANSCRIPT_LOOK_S)

    def _enqueued(self, text: str, offset: int) -> bool:
        try:
            with self.transcript.open("rb") as transcript:
                transcript.seek(offset)
                tail = transcript.read()
        except FileNotFoundError:
            return False
        for line in tail.splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue  # a line still being written: the next look reads it whole
            if (isinstance(record, dict) and record.get("type") == "queue-operation"
                    and record.get("operation") == "enqueue" and record.get("content") == text):
                return True
        return False


class Delivery:
    """Where the waiter puts messages: the session's inbox socket where it has one, else
    its stderr (exit code 2 wakes the session). `route` says which one took them."""

    VIA = {"socket": "claude:inbox", "stderr": "hook:rewake"}  # the receipts' words

    def __init__(self, inbox: SessionInbox | None, out: IO[str]) -> None:
        self.inbox = inbox
        self.out = out
        self.route: str | None = None

    @property
    def via(self) -> str:
        """Where the messages went, as their receipts name it (after a delivery)."""
        return self.VIA[self.route or "stderr"]

    def __call__(self, text: str) -> None:
        if self.inbox is not None:
            try:
                self.inbox.post(text)
                self.route = "socket"
                return
            except OSError:
                # A session without a working inbox, or one that did not record our post: the
                # hook's way. If it did take the post after all, it sees the messages twice,
                # which at-least-once allows; acking on a guess could lose them.
                self.inbox = None
        self.out.write(text + "\n")
        self.out.flush()
        self.route = "stderr"


def wait_and_deliver(bus: Log, db_path: str | os.PathLike[str], agent: str, limit: int,
                     wait: float, deliver: Delivery, session: str | None = None,
                     gone_fd: int | None = None) -> Inbox | None:
    """Wait up to `wait` s for messages for `agent`; `deliver` their text, record their
    receipts (`session`'s) and ack them.

    `deliver` raises when the text may not have arrived, and nothing is acked.
    Returns what was delivered, or None when the wait ended first, or the
    session did (`gone_fd` readable). The wait is `Bus.wait_for`'s (woken by
    commits, and at least every second, when it also sees the session gone);
    the messages are read again under the delivery lock, as another hook may
    have shown them meanwhile.
    """
    deadline = time.monotonic() + wait
    while not _gone(gone_fd):
        with delivering(db_path, agent):
            inbox = pending(bus, agent, limit)
            if inbox.shown:
                deliver(inbox.text)  # delivered once it returns; a kill before acks nothing
                acknowledge(bus, inbox, deliver.via, session)
                return inbox
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        bus.wait_for(lambda: bus.poll(agent, 1), left,
                     lambda found: bool(found) or _gone(gone_fd))
    return None
