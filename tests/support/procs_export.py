"""Child-process programs for tests/log/test_export.py.

Run as `python tests/support/procs_export.py <role> [options]` with PYTHONPATH set to
the repository root (the `python_env` fixture does that). Children talk to
the parent through flushed stdout lines; unexpected exceptions print a
traceback to stderr and exit 1.

    export   export everything new with JsonlExporter.export_batches(batch),
             printing "go" once the bus is open (the parent's kill timer starts
             there) and {"exported": n} at the end.
    publish  publish varied messages (see `make_messages`) in small batches
             until the parent closes stdin, then print {"published": n}.
    hold     open an exporter (taking its lock), print "holding", and keep it
             until the parent closes stdin or kills the process.
    cli      wait on a start barrier (--go-fd), then run the real `bus` command
             line in this process with the arguments given as a JSON list; the
             exit status is the command's.

The parent side (`Children`, on tests/support/children.py) is at the end of this file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import select
import sys
import traceback
from pathlib import Path
from typing import Any

from bus import Bus
from tests.support import children
from bus.log.export import JsonlExporter

BIG_PAYLOAD = 5000  # characters: more than the 4096-byte blob threshold
AGENTS = ["planner", "worker-1", "worker-2", "reviewer", "ops.bot:7"]
TEXTS = ["", "héllo wörld", "日本語のテキスト", "emoji \U0001F680\U0001F9EA",
         "quote \" and \\ back", "line\nbreak\ttab", "sep\u2028para\u2029", "nul\u0000char",
         "{\"json\": \"in a string\"}"]


def say(text: str) -> None:
    """One line to the parent, written in one flushed write."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def random_payload(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.randint(-2**63, 2**63 - 1)
    if kind == 3:
        return rng.uniform(-1e6, 1e6)
    if kind in (4, 5):
        return rng.choice(TEXTS) + str(rng.randrange(1000))
    if kind == 6:
        return [random_payload(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(TEXTS) + str(n): random_payload(rng, depth + 1)
            for n in range(rng.randrange(4))}


def make_messages(rng: random.Random, count: int, big_every: int = 0) -> list[dict[str, Any]]:
    """`count` publish_many items with varied fields; every `big_every`-th (on average)
    has a payload large enough for the blob store."""
    items = []
    for _ in range(count):
        item: dict[str, Any] = {"from_agent": rng.choice(AGENTS), "type": rng.choice(
            ["task_assign", "task_done", "note", "événement"])}
        if big_every and rng.randrange(big_every) == 0:
            item["payload"] = {"big": "x" * BIG_PAYLOAD, "n": rng.randrange(10**9)}
        else:
            item["payload"] = random_payload(rng)
        if rng.random() < 0.5:
            item["to"] = rng.choice(AGENTS)
        if rng.random() < 0.3:
            item["correlation_id"] = f"task-{rng.randrange(100)}"
        if rng.random() < 0.2:
            item["in_reply_to"] = f"reply-{rng.randrange(10**6)} ✓"
        items.append(item)
    return items


def stdin_closed(timeout: float) -> bool:
    """Wait up to `timeout` seconds for the parent to close stdin; True once it has."""
    ready, _, _ = select.select([sys.stdin.buffer], [], [], timeout)
    return bool(ready) and sys.stdin.buffer.read1(1) == b""


# --- roles ------------------------------------------------------------------


def export(args: argparse.Namespace) -> None:
    bus = Bus.open(args.db)
    say("go")
    total = 0
    with JsonlExporter(bus.conn, args.out) as exporter:
        for done in exporter.export_batches(args.batch):
            total += done
    bus.close()
    say(json.dumps({"exported": total}))


def publish(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    bus = Bus.open(args.db)
    published = 0
    while True:
        if published < args.max:
            count = min(rng.randint(1, args.most), args.max - published)
            bus.publish_many(make_messages(rng, count, big_every=args.big_every))
            if published == 0:
                say("publishing")
            published += count
        if stdin_closed(args.pause if published < args.max else 1.0):
            break
    bus.close()
    say(json.dumps({"published": published}))


def hold(args: argparse.Namespace) -> None:
    bus = Bus.open(args.db)
    with JsonlExporter(bus.conn, args.out):
        say("holding")
        while not stdin_closed(60.0):
            pass
    bus.close()


def cli(args: argparse.Namespace) -> None:
    from bus.cli import main as bus_main  # imported before the barrier: the race is the export
    if args.go_fd is not None:
        say("ready")
        while os.read(args.go_fd, 1):
            pass
        os.close(args.go_fd)
    bus_main(json.loads(args.argv), prog_name="bus")  # exits with the command's status


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="procs_export")
    roles = parser.add_subparsers(dest="role", required=True)

    p = roles.add_parser("export")
    p.add_argument("db")
    p.add_argument("out")
    p.add_argument("--batch", type=int, required=True)
    p.set_defaults(func=export)

    p = roles.add_parser("publish")
    p.add_argument("db")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--max", type=int, required=True, help="stop publishing after this many")
    p.add_argument("--most", type=int, default=30, help="largest batch")
    p.add_argument("--pause", type=float, default=0.005, help="seconds between batches")
    p.add_argument("--big-every", type=int, default=0)
    p.set_defaults(func=publish)

    p = roles.add_parser("hold")
    p.add_argument("db")
    p.add_argument("out")
    p.set_defaults(func=hold)

    p = roles.add_parser("cli")
    p.add_argument("argv", help="the bus command's arguments, as a JSON list")
    p.add_argument("--go-fd", type=int)
    p.set_defaults(func=cli)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.func(args)
    except SystemExit:
        raise
    except BaseException:
        sys.stderr.write(f"procs_export {args.role}: unexpected exception\n")
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0


# --- parent side ----------------------------------------------------------------

PROGRAM = Path(__file__).resolve()


class Children(children.Children):
    """Children running this program."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        super().__init__(env, logs, PROGRAM)


if __name__ == "__main__":
    sys.exit(main())
