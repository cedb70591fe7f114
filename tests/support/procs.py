"""Child-process programs for tests/log/test_processes.py.

Run as `python tests/support/procs.py <role> [options]` with PYTHONPATH set to the
repository root (the `python_env` fixture does that). Every role talks to the
parent through stdout lines (flushed) and synchronises on a start barrier:

    --go-fd N   the child prints "ready" and then blocks reading file
                descriptor N; the parent closes its (only) write end, so every
                child waiting on the same pipe is released at the same moment.
                (--go-fds N,M,... : one such barrier per round.)

Any unexpected exception prints a traceback to stderr and exits with status 1;
every role that finishes normally exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

from bus import Bus


def say(text: str) -> None:
    """One line to the parent, written in one flushed write."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def wait_for_go(fd: int | None) -> None:
    """Block until the parent closes the write end of the barrier pipe."""
    if fd is None:
        return
    say("ready")
    while os.read(fd, 1):  # b"" means EOF: the parent closed the pipe
        pass
    os.close(fd)


# --- roles ------------------------------------------------------------------


def publisher(args: argparse.Namespace) -> None:
    """Publish `count` broadcasts, one transaction each, payload {publisher, n}."""
    bus = Bus.open(args.db)
    wait_for_go(args.go_fd)
    sender = f"pub-{args.publisher}"
    last_seq = 0
    for n in range(args.count):
        result = bus.publish(sender, "load", {"publisher": args.publisher, "n": n})
        if result.duplicate or result.seq <= last_seq:
            raise AssertionError(f"publish #{n} returned {result}, previous seq {last_seq}")
        last_seq = result.seq
    bus.close()
    say(f"done {args.count}")


def consumer(args: argparse.Namespace) -> None:
    """Poll + ack until the publishers are done and nothing is left, then write what was seen.

    The parent creates `done_file` once every publisher has exited. Its
    existence is checked *before* a poll: if it already existed and the poll
    comes back empty, every publish committed before that poll read the log,
    so nothing more can arrive. `expected` only bounds the loop: a consumer
    that has seen more than that many messages stops and reports them.
    """
    bus = Bus.open(args.db)
    done_file = Path(args.done_file)
    wait_for_go(args.go_fd)
    seen: list[dict] = []
    polls = 0
    while True:
        publishers_done = done_file.exists()
        batch = bus.poll(args.agent, limit=args.limit)
        polls += 1
        if not batch:
            if publishers_done:
                break
            # Nothing to read yet: back off briefly instead of spinning a core
            # the publishers need. Correctness never depends on this pause.
            time.sleep(0.002)
            continue
        for message in batch:
            payload = message.payload if isinstance(message.payload, dict) else {}
            seen.append({
                "seq": message.seq, "id": message.id, "from": message.from_agent,
                "to": message.to_agent, "publisher": payload.get("publisher"),
                "n": payload.get("n"), "payload_error": message.payload_error,
            })
        moved_to = bus.ack(args.agent, batch[-1].seq)
        if moved_to != batch[-1].seq:
            raise AssertionError(f"ack({batch[-1].seq}) moved the cursor to {moved_to}")
        if len(seen) > args.expected:
            break
    final_cursor = bus.cursor(args.agent)
    bus.close()
    with open(args.out, "w", encoding="utf-8") as out:
        for row in seen:
            out.write(json.dumps(row) + "\n")
    say(json.dumps({"count": len(seen), "polls": polls, "cursor": final_cursor}))


def poll(args: argparse.Namespace) -> None:
    """Poll once; ack the first `ack_first` messages one by one; report; maybe hang.

    Prints one JSON line {"seqs", "ids", "acked"} after the acks committed.
    With --hang it then blocks reading stdin (never acking the rest) until
    the parent kills it.
    """
    bus = Bus.open(args.db)
    messages = bus.poll(args.agent, limit=args.limit)
    acked = 0
    for message in messages[:args.ack_first]:
        acked = bus.ack(args.agent, message.seq)
    say(json.dumps({
        "seqs": [m.seq for m in messages], "ids": [m.id for m in messages], "acked": acked,
        "to": [m.to_agent for m in messages],
    }))
    if args.hang:
        sys.stdin.read()  # the parent never writes: this blocks until SIGKILL
        raise AssertionError("stdin closed: the parent was supposed to kill this process")
    bus.close()


def publish_stream(args: argparse.Namespace) -> None:
    """Publish forever; print "<n> <seq> <id>" after each publish returned."""
    bus = Bus.open(args.db)
    n = 0
    while True:
        result = bus.publish(args.sender, "stream", {"n": n, "pad": "x" * (n % 300)})
        say(f"{n} {result.seq} {result.id}")
        n += 1


def publish_threads(args: argparse.Namespace) -> None:
    """`--threads` threads share one Bus and publish forever (group commit).

    Each prints "try <id>" before a publish and "ok <id> <seq>" once it
    returned, so the parent knows every id that may be in the file and every
    one that must be.
    """
    bus = Bus.open(args.db)
    lock = threading.Lock()

    def tell(text: str) -> None:
        with lock:
            say(text)

    def publish_forever(thread: int) -> None:
        n = 0
        while True:
            id_ = str(uuid.uuid4())
            tell(f"try {id_}")
            result = bus.publish(f"t{thread}", "stream", {"thread": thread, "n": n}, id=id_)
            tell(f"ok {id_} {result.seq}")
            n += 1

    for thread in range(args.threads):
        threading.Thread(target=publish_forever, args=(thread,), daemon=True).start()
    sys.stdin.read()  # the parent never writes: this blocks until SIGKILL
    raise AssertionError("stdin closed: the parent was supposed to kill this process")


def open_and_publish(args: argparse.Namespace) -> None:
    """Round after round: wait for that round's barrier, open a new bus file, publish one.

    `db` is a template with "{round}" in it; --go-fds lists one barrier per
    round. A failing round is reported as {"round", "error"} and the child
    goes on to the next one (its siblings wait at the next barrier), then
    exits 1 at the end.
    """
    failed = 0
    for round_, fd in enumerate(int(fd) for fd in args.go_fds.split(",")):
        wait_for_go(fd)
        started = time.monotonic()
        try:
            bus = Bus.open(args.db.format(round=round_))
            try:
                result = bus.publish(args.sender, "hello", {"sender": args.sender})
                version = bus.schema_version()
            finally:
                bus.close()
        except Exception:
            failed += 1
            elapsed = time.monotonic() - started
            say(json.dumps({"round": round_, "error": f"after {elapsed:.3f} s: "
                            + traceback.format_exc()}))
        else:
            say(json.dumps({"round": round_, "seq": result.seq, "id": result.id,
                            "schema_version": version}))
    if failed:
        raise SystemExit(f"{failed} round(s) failed, see the reports on stdout")


# --- command line -------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="procs")
    roles = parser.add_subparsers(dest="role", required=True)

    p = roles.add_parser("publisher")
    p.add_argument("db")
    p.add_argument("--publisher", type=int, required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--go-fd", type=int)
    p.set_defaults(func=publisher)

    p = roles.add_parser("consumer")
    p.add_argument("db")
    p.add_argument("--agent", required=True)
    p.add_argument("--expected", type=int, required=True)
    p.add_argument("--done-file", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--limit", type=int, default=500)
    p.add_argument("--go-fd", type=int)
    p.set_defaults(func=consumer)

    p = roles.add_parser("poll")
    p.add_argument("db")
    p.add_argument("--agent", required=True)
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--ack-first", type=int, default=0)
    p.add_argument("--hang", action="store_true")
    p.set_defaults(func=poll)

    p = roles.add_parser("publish-stream")
    p.add_argument("db")
    p.add_argument("--sender", required=True)
    p.set_defaults(func=publish_stream)

    p = roles.add_parser("publish-threads")
    p.add_argument("db")
    p.add_argument("--threads", type=int, default=16)
    p.set_defaults(func=publish_threads)

    p = roles.add_parser("open-and-publish")
    p.add_argument("db", help='path template containing "{round}"')
    p.add_argument("--sender", required=True)
    p.add_argument("--go-fds", required=True, help="comma-separated, one per round")
    p.set_defaults(func=open_and_publish)

    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.func(args)
    except BaseException:
        sys.stderr.write(f"procs {args.role}: unexpected exception\n")
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
