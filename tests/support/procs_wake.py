"""Child-process programs for tests/log/test_wake.py.

Run as `python tests/support/procs_wake.py <role> <db>` with PYTHONPATH set to the
repository root (the `python_env` fixture does that). The child talks to the
parent through lines: commands on stdin, answers on stdout (flushed).

Roles:

  publisher   opens the bus, says "ready", then obeys one command per line:
                publish         one message; answers "published <seq>"
                burst <n>       n messages, one transaction each; "published <last seq>"
                quit            closes the bus and exits 0
  stream      opens the bus, says "ready", waits for one "go" line, then
              publishes <rounds> bursts of <size> messages (one transaction
              each) without waiting for anyone, and says "done <last seq>".

Any unexpected exception prints a traceback to stderr and exits with status 1.
"""

from __future__ import annotations

import argparse
import sys
import traceback

from bus import Bus


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def publisher(args: argparse.Namespace) -> None:
    bus = Bus.open(args.db, create=False)
    say("ready")
    n = 0
    for line in sys.stdin:
        words = line.split()
        if words == ["quit"]:
            break
        if words == ["publish"]:
            count = 1
        elif len(words) == 2 and words[0] == "burst":
            count = int(words[1])
        else:
            raise AssertionError(f"unknown command {line!r}")
        seq = 0
        for _ in range(count):
            seq = bus.publish("child", "ping", {"n": n}).seq
            n += 1
        say(f"published {seq}")
    bus.close()


def stream(args: argparse.Namespace) -> None:
    bus = Bus.open(args.db, create=False)
    say("ready")
    if sys.stdin.readline().split() != ["go"]:
        raise AssertionError("expected 'go'")
    seq = 0
    for round_ in range(args.rounds):
        for n in range(args.size):
            seq = bus.publish("streamer", "burst", {"round": round_, "n": n}).seq
    bus.close()
    say(f"done {seq}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="procs_wake")
    roles = parser.add_subparsers(dest="role", required=True)
    p = roles.add_parser("publisher")
    p.add_argument("db")
    p.set_defaults(func=publisher)
    p = roles.add_parser("stream")
    p.add_argument("db")
    p.add_argument("--rounds", type=int, required=True)
    p.add_argument("--size", type=int, required=True)
    p.set_defaults(func=stream)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.func(args)
    except BaseException:
        sys.stderr.write(f"procs_wake {args.role}: unexpected exception\n")
        traceback.print_exc()
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
