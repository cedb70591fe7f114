"""A tap between an MCP client and a stdio server: every line both ways, timed, to a file.

    python tests/mcp_tap.py LOG -- bus --db bus.db mcp --agent ann

runs the server with the client's stdin and stdout passed through line by
line, and appends to LOG one JSON object per line: `t` (seconds since the tap
started), `from` ("client" or "server") and `message` (the line, parsed). The
tests use it to see what a real client asks a server at start, and when.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import IO


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

        server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        to_client = threading.Thread(target=pump, daemon=True,
                                     args=(server.stdout, sys.stdout.buffer, "server", note))
        to_client.start()
        pump(sys.stdin.buffer, server.stdin, "client", note)
        server.stdin.close()  # the client is done: so is the server, once it has answered
        code = server.wait()
        to_client.join()
    return code


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
