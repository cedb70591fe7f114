"""The parent side of multi-process tests: start child programs, read their
stdout lines with deadlines, keep their stderr for failure messages, and kill
whatever is left at the end."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path


class Child:
    """One child process: stdout read as lines with a deadline, stderr kept in a file."""

    def __init__(self, name: str, program: Path, argv: list[str], env: dict[str, str],
                 stderr_path: Path, pass_fds: tuple[int, ...] = ()) -> None:
        self.name = name
        self.stderr_path = stderr_path
        self._stderr_file = open(stderr_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(program), *argv], env=env, stdin=subprocess.PIPE,
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

    def describe(self) -> str:
        return (f"child {self.name} (pid {self.pid}, returncode {self.proc.returncode});"
                f" stderr:\n{self.stderr()}")

    def read_line(self, timeout: float) -> str:
        """The next complete stdout line; AssertionError on EOF or after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if self._eof or remaining <= 0:
                self.proc.poll()
                raise AssertionError(f"no line within {timeout:.0f} s from {self.describe()}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if chunk:
                    self._buffer += chunk
                else:
                    self._eof = True
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

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

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()
        self._stderr_file.close()


class Children:
    """Starts children with the test's environment; `cleanup` kills what is left."""

    def __init__(self, env: dict[str, str], logs: Path, program: Path) -> None:
        self.program = program
        self.env = dict(env, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
        self.logs = logs
        self.logs.mkdir(exist_ok=True)
        self.started: list[Child] = []

    def start(self, name: str, *argv: str, pass_fds: tuple[int, ...] = ()) -> Child:
        child = Child(name, self.program, list(argv), self.env, self.logs / f"{name}.txt",
                      pass_fds)
        self.started.append(child)
        return child

    def cleanup(self) -> None:
        for child in self.started:
            child.cleanup()
