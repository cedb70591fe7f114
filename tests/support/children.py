"""The parent side of multi-process tests: start child programs, read their
stdout lines with deadlines, keep their stderr for failure messages, start
them together on a barrier, kill them like a crash, and kill whatever is
left at the end."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

SHORT_TIMEOUT = 60.0  # for a child to react: print a line, exit, die after SIGKILL


class Child:
    """One child process: stdout read as lines with a deadline, stderr kept in a file."""

    def __init__(self, name: str, program: Path, argv: list[str], env: dict[str, str],
                 stderr_path: Path, pass_fds: tuple[int, ...] = (),
                 stdin: int = subprocess.PIPE) -> None:
        self.name = name
        self.stderr_path = stderr_path
        self._stderr_file = open(stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(program), *argv], env=env, stdin=stdin,
            stdout=subprocess.PIPE, stderr=self._stderr_file, pass_fds=pass_fds, bufsize=0,
        )
        self._buffer = b""
        self._eof = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        self._stderr_file.flush()
        return self.stderr_path.read_text(errors="replace")

    stderr_text = stderr

    def describe(self) -> str:
        return (f"child {self.name} (pid {self.pid}, returncode {self.proc.returncode});"
                f" stderr:\n{self.stderr()}")

    def read_line(self, timeout: float) -> str:
        """The next complete stdout line; AssertionError on EOF or after `timeout` seconds."""
        line = self.next_line(timeout)
        if line is None:
            self.proc.poll()
            raise AssertionError(f"no line within {timeout:.0f} s from {self.describe()}")
        return line

    def next_line(self, timeout: float) -> str | None:
        """The next complete stdout line, or None on EOF or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if self._eof or remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if chunk:
                    self._buffer += chunk
                else:
                    self._eof = True
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def remaining_lines(self) -> tuple[list[str], bytes]:
        """After the child died: every complete line still in the pipe, and any partial tail."""
        assert self.proc.poll() is not None, "only for a child that has exited"
        lines = []
        while (line := self.next_line(SHORT_TIMEOUT)) is not None:
            lines.append(line)
        return lines, self._buffer

    def rest_of_stdout(self) -> str:
        """Everything still unread on stdout, once the process has exited."""
        data = self._buffer + self.proc.stdout.read()
        self._buffer = b""
        return data.decode()

    def close_stdin(self) -> None:
        self.proc.stdin.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=max(timeout, 0.1))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"did not finish within {timeout:.0f} s: {self.describe()}")

    def wait_ok(self, timeout: float) -> None:
        assert self.wait(timeout) == 0, self.describe()

    def kill(self, timeout: float = SHORT_TIMEOUT) -> None:
        """SIGKILL (no cleanup, no atexit, no flushing: like a crash) and reap it."""
        os.kill(self.pid, signal.SIGKILL)
        try:
            returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running {timeout:.0f} s after SIGKILL: {self.describe()}")
        assert returncode == -signal.SIGKILL, self.describe()

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._stderr_file.close()


class Barrier:
    """Start children together: each blocks reading the pipe until the parent closes it.

    Only children get the read end (via pass_fds); the write end is the
    parent's alone, so closing it gives every waiting child EOF at once.
    """

    def __init__(self) -> None:
        self.read_fd, self.write_fd = os.pipe()

    def release(self, children: list[Child], timeout: float = SHORT_TIMEOUT) -> None:
        for child in children:
            line = child.read_line(timeout)
            assert line == "ready", f"{line!r} from {child.describe()}"
        self.close()

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            if fd >= 0:
                os.close(fd)
        self.read_fd = self.write_fd = -1


class Children:
    """Starts children of `program` with the test's environment; `cleanup` kills what is left."""

    def __init__(self, env: dict[str, str], logs: Path, program: Path) -> None:
        self.program = program
        self.env = dict(env, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
        self.logs = logs
        self.logs.mkdir(exist_ok=True)
        self.started: list[Child] = []

    def start(self, name: str, *argv: str, pass_fds: tuple[int, ...] = (),
              program: Path | None = None) -> Child:
        """Start `program` (default: this set's) with `argv`; stderr goes to logs/<name>.txt."""
        child = Child(name, program or self.program, list(argv), self.env,
                      self.logs / f"{name}.txt", pass_fds)
        self.started.append(child)
        return child

    def cleanup(self) -> None:
        for child in self.started:
            child.cleanup()
