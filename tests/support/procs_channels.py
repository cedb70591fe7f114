"""Child-process programs for tests/channels/test_channel_processes.py.

Run as `python tests/support/procs_channels.py <role> --db PATH [options]` with
PYTHONPATH at the repository root. Each child prints "ready", waits for the
parent to close the barrier pipe (`--go-fd`), works, and reports on stdout.

- sender: publishes `--count` events on channel `ps`, topic n % len(TOPICS),
  correlation id "<sender>-<n>"; every `--repeat-every`th event is sent a
  second time with the same correlation id (a sender's retry).
- receiver: receives and acknowledges (completed) until the done file exists
  and a receive comes back empty, then prints one JSON line: the
  [seq, correlation_id, attempt] of every message it acknowledged.
- grabber: receives once at `--now-ms` (the parent's clock, so the ack
  timer is the test's to step), prints the seqs it got, then blocks until killed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from bus import Bus
from bus.channels import Channels

TOPICS = ("build.web.ok", "build.api.ok", "build.web.fail", "deploy.web.done", "deploy.api.done")


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def wait_for_go(fd: int) -> None:
    say("ready")
    while os.read(fd, 1):
        pass
    os.close(fd)


def sender(args: argparse.Namespace) -> None:
    with Bus.open(args.db) as bus:
        wait_for_go(args.go_fd)
        for n in range(args.count):
            sends = 2 if args.repeat_every and n % args.repeat_every == 0 else 1
            for _ in range(sends):
                bus.channels.send_message("ps", args.agent, "event", {"n": n},
                                          topic=TOPICS[n % len(TOPICS)],
                                          correlation_id=f"{args.agent}-{n}")
    say("done")


def receiver(args: argparse.Namespace) -> None:
    done_file = Path(args.done_file)
    acked: list[list] = []
    with Bus.open(args.db) as bus:
        channels = bus.channels
        wait_for_go(args.go_fd)
        while True:
            senders_done = done_file.exists()  # checked before the receive: see procs.py
            batch = channels.receive_messages(args.agent, {"limit": 50})
            for message in batch:
                channels.acknowledge_message(message, args.agent, "completed")
                acked.append([message.seq, message.correlation_id, message.attempt])
            if not batch.messages:
                if senders_done:
                    break
                bus.wait_for_change(0.05)
    say(json.dumps(acked))


def grabber(args: argparse.Namespace) -> None:
    with Bus.open(args.db) as bus:
        channels = Channels(bus, clock=lambda: args.now_ms)
        wait_for_go(args.go_fd)
        got = channels.receive_messages(args.agent)
        say(json.dumps([m.seq for m in got]))
        time.sleep(3600)  # killed by the parent before it could acknowledge


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["sender", "receiver", "grabber"])
    parser.add_argument("--db", required=True)
    parser.add_argument("--agent", required=True)
    parser.add_argument("--go-fd", type=int, required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--repeat-every", type=int, default=0)
    parser.add_argument("--done-file")
    parser.add_argument("--now-ms", type=int)
    args = parser.parse_args(argv)
    {"sender": sender, "receiver": receiver, "grabber": grabber}[args.role](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
