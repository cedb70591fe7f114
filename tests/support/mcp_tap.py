"""A tap between an MCP client and a stdio server: every line both ways, timed, to a file.

    python tests/support/mcp_tap.py LOG -- bus --db bus.db mcp --agent ann

runs the server with the client's stdin and stdout passed through line by
line, and appends to LOG one JSON object per line: `t` (seconds since the tap
started), `from` ("client" or "server") and `message` (the line, parsed). The
tests use it to see what a real client asks a server at start, and when.

The server ends with the tap: when the client ends the tap (a signal, or
SIGKILL through the parent-death signal) and, as the MCP SDK's clients do,
EOF_GRACE_S after the client closed its end.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

EOF_GRACE_S = 2.0  # the MCP SDK's stdio client waits this long for a server, then kills it
PR_SET_PDEATHSIG = 1  # prctl(2)


def main(argv: list[str]) -> int:
    log_path, separator, *command = argv
    assert separator == "--" and command, __doc__
    started = time.monotonic()
    lock = threading.Lock()
    with open(log_path, "a", encoding="utf-8") as log:
        def note(side: str, line: bytes) -> None:
            try:
                message = json.loads(line)
            except ValueError:
                message = line.decode(errors="replace")
            with lock:
                log.write(json.dumps({"t": round(time.monotonic() - started, 4), "from": side,
                                      "message": message}) + "\n")
                log.flush()

        server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  preexec_fn=die_with_parent)

        def end(signum: int, frame: object) -> None:
            server.kill()
            os._exit(128 + signum)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, end)
        to_client = threading.Thread(target=pump, daemon=True,
                                     args=(server.stdout, sys.stdout.buffer, "server", note))
        to_client.start()
        pump(sys.stdin.buffer, server.stdin, "client", note)
        server.stdin.close()  # the client is done: so is the server, once it has answered
        try:
            code = server.wait(timeout=EOF_GRACE_S)
        except subprocess.TimeoutExpired:
            server.kill()
            code = server.wait()
        to_client.join()
    return code


def die_with_parent() -> None:
    """In the server's process: SIGKILL when the tap dies, however it dies (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def pump(source: IO[bytes], sink: IO[bytes], side: str, note) -> None:
    for line in iter(source.readline, b""):
        note(side, line)
        try:
            sink.write(line)
            sink.flush()
        except (BrokenPipeError, ValueError):
            return


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
