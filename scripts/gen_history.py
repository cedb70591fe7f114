"""Synthetic agentbus history for the Spark history job: N messages of a realistic mix.

A small discrete-event simulation: a pool of workers takes tasks one after
the other and walks each through the worker state machine (ASSIGNED ->
WORKING -> IN_REVIEW -> APPROVED -> COMPLETED, with rejections, failures and
cancellations), beating while it works, asking the planner questions that
get answers (`in_reply_to`), and sometimes dying mid-task: the bus then
announces `task_released`, the task goes back to the queue and, after too
many attempts, `task_dead`. The messages come out in time order with the
export's line schema (bus/log/export.py), so the output is what `bus export`
would have written for such a history.

    python scripts/gen_history.py --out history.jsonl -n 1000000 --seed 7
    python scripts/gen_history.py --out history/ --partition-by date -n 1000000
    python scripts/gen_history.py --bus /tmp/demo.db -n 5000   # into a real bus (publish_many)

The same --seed and arguments give the same bytes. Into a bus, the bus stamps
each batch with its own commit time, so simulated durations collapse there.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import random
import sys
import time
from dataclasses import dataclass
from dataclasses import field
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Iterator

import orjson

DEFAULT_START = "2026-01-05T08:00:00Z"
CHUNK_LINES = 50_000  # lines joined per write: few syscalls, bounded memory
BUS_BATCH = 500  # messages per publish_many transaction
SYSTEM_AGENT = "bus"  # the bus announces task_released / task_dead as this agent
ORCHESTRATOR = "orchestrator"
PLANNER = "planner"
MAX_ATTEMPTS = 3  # takes of a task before the bus declares it dead
DEAD_AFTER_MS = 300_000  # silence after which `bus reap` treats a holder as dead

# Durations in seconds: (median, spread) of a log-normal, so most are near the
# median and a few are much longer, as real task times are.
ASSIGNED_S = (45.0, 0.8)
WORKING_S = (900.0, 0.7)
REVIEW_S = (240.0, 0.9)
MERGE_S = (60.0, 0.5)
ANSWER_S = (6.0, 0.9)
IDLE_S = (30.0, 1.0)
BEAT_S = 15.0  # heartbeat interval while ASSIGNED or WORKING
PROGRESS_EVERY = 8  # about one progress message per this many beats
QUESTION_EVERY = 40  # about one question to the planner per this many beats
P_DIE = 0.03  # a worker process dies mid-task (silence, then task_released)
P_DIE_POISON = 0.8  # ... on a task that kills whoever takes it
P_POISON = 0.01
P_FAIL = 0.02
P_CANCEL = 0.01
P_REJECT = 0.2
MAX_REVIEWS = 3
RESTART_S = (600.0, 0.5)  # how long a dead worker stays down


@dataclass
class Message:
    """One message before the bus gives it a seq: what publish would be called with."""

    from_agent: str
    type: str
    payload: Any
    to: str | None = None
    correlation_id: str | None = None
    in_reply_to: str | None = None
    id: str = ""


class Simulation:
    """A heap of timed events: messages to emit and processes to resume.

    A process is a generator that publishes through `emit` at `now_ms` and
    yields how many seconds to sleep before it runs again.
    """

    def __init__(self, rng: random.Random, start_ms: int) -> None:
        self.rng = rng
        self.now_ms = start_ms
        # (at_ms, order, message, process): plain tuples compare fastest, and
        # `order` is unique, so the comparison never reaches the last two.
        self._heap: list[tuple[int, int, Message | None, Iterator[float] | None]] = []
        self._order = itertools.count()  # ties keep their scheduling order: reproducible

    def emit(self, message: Message, delay_s: float = 0.0) -> Message:
        """Schedule `message` now (or `delay_s` later); it gets its id at once for replies."""
        message.id = self.new_id()
        heapq.heappush(self._heap, (self.now_ms + int(delay_s * 1000), next(self._order),
                                    message, None))
        return message

    def start(self, process: Iterator[float], delay_s: float = 0.0) -> None:
        heapq.heappush(self._heap, (self.now_ms + int(delay_s * 1000), next(self._order),
                                    None, process))

    def run(self) -> Iterator[tuple[int, Message]]:
        """(ts_ms, message) in time order, for as long as the caller keeps reading."""
        heap, pop = self._heap, heapq.heappop
        while heap:
            at_ms, _order, message, process = pop(heap)
            self.now_ms = at_ms
            if message is not None:
                yield at_ms, message
                continue
            try:
                sleep_s = next(process)
            except StopIteration:
                continue
            self.start(process, sleep_s)

    def lognormal(self, median_and_spread: tuple[float, float]) -> float:
        median, spread = median_and_spread
        return self.rng.lognormvariate(0.0, spread) * median

    def new_id(self) -> str:
        """A version 4 UUID from the seeded generator, so ids repeat with the seed."""
        h = f"{self.rng.getrandbits(128):032x}"
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


@dataclass
class Task:
    name: str
    poison: bool
    attempts: int = 0
    holders: set[str] = field(default_factory=set)  # workers that died holding it


class TaskQueue:
    """New tasks on demand, released ones first (a reaped task is taken over soon).

    A released task goes to another worker: a worker id names one spawn of a
    task, so the one that died on it does not spawn for it again.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._released: list[Task] = []
        self._numbers = itertools.count(1)

    def take(self, worker: str) -> Task:
        for index, task in enumerate(self._released):
            if worker not in task.holders:
                return self._released.pop(index)
        return Task(f"task-{next(self._numbers):06d}", self.rng.random() < P_POISON)

    def put_back(self, task: Task) -> None:
        self._released.append(task)


class Worker:
    """One worker identity taking tasks in turn; each task is a walk through the machine."""

    def __init__(self, sim: Simulation, queue: TaskQueue, name: str) -> None:
        self.sim = sim
        self.queue = queue
        self.name = name
        self.state: str | None = None

    def process(self) -> Iterator[float]:
        while True:
            task = self.queue.take(self.name)
            task.attempts += 1
            died = yield from self._work_on(task)
            if died:
                task.holders.add(self.name)
                self._announce_death(task)
                yield self.sim.lognormal(RESTART_S)  # down until someone restarts it
            self.state = None
            yield self.sim.lognormal(IDLE_S)

    def _work_on(self, task: Task) -> Iterator[float]:
        """Returns True when the worker died holding the task."""
        sim, rng = self.sim, self.sim.rng
        self._change(task, "ASSIGNED", "spawn")
        sim.emit(Message(ORCHESTRATOR, "task_assign",
                         {"task": task.name, "branch": f"{self.name}/{task.name}", "base": "main"},
                         to=self.name, correlation_id=task.name))
        yield from self._beating(task, sim.lognormal(ASSIGNED_S), asks=False)
        if rng.random() < P_CANCEL:
            self._change(task, "CANCELLED", "cancel")
            return False
        self._change(task, "WORKING", "start")
        for review in range(1, MAX_REVIEWS + 1):
            dies = rng.random() < (P_DIE_POISON if task.poison else P_DIE)
            working = sim.lognormal(WORKING_S)
            yield from self._beating(task, working * rng.random() if dies else working)
            if dies:
                return True
            if rng.random() < P_FAIL:
                self._change(task, "FAILED", "fail")
                sim.emit(Message(self.name, "task_failed",
                                 {"worker": self.name, "reason": "tests failed"},
                                 correlation_id=task.name))
                return False
            approved = yield from self._review(task, last=review == MAX_REVIEWS)
            if approved:
                break
        yield sim.lognormal(MERGE_S)
        self._change(task, "COMPLETED", "merge")
        sim.emit(Message(self.name, "task_merged",
                         {"worker": self.name, "branch": f"{self.name}/{task.name}",
                          "base": "main", "commit": f"{rng.getrandbits(160):040x}",
                          "fast_forward": rng.random() < 0.7}, correlation_id=task.name))
        return False

    def _review(self, task: Task, last: bool) -> Iterator[float]:
        """IN_REVIEW until the orchestrator answers the review request; True if approved.

        The `last` review approves: reviewers give up rejecting eventually.
        """
        sim, rng = self.sim, self.sim.rng
        commit = f"{rng.getrandbits(160):040x}"
        details = {"worker": self.name, "branch": f"{self.name}/{task.name}", "commit": commit,
                   "message": "done"}
        self._change(task, "IN_REVIEW", "done")
        sim.emit(Message(self.name, "task_done", details, correlation_id=task.name))
        request = sim.emit(Message(self.name, "review_request", details, to=ORCHESTRATOR,
                                   correlation_id=task.name))
        yield sim.lognormal(REVIEW_S)
        approved = last or rng.random() >= P_REJECT
        result = {"worker": self.name, "approved": approved}
        if not approved:
            result["reason"] = "please add tests"
        sim.emit(Message(ORCHESTRATOR, "review_result", result, to=self.name,
                         correlation_id=task.name, in_reply_to=request.id))
        self._change(task, "APPROVED" if approved else "WORKING",
                     "approve" if approved else "reject")
        return approved

    def _beating(self, task: Task, duration_s: float, asks: bool = True) -> Iterator[float]:
        """Spend `duration_s` in the current state: heartbeats, progress, questions."""
        sim, rng = self.sim, self.sim.rng
        left = duration_s
        while left > 0:
            step = min(left, BEAT_S + rng.uniform(-2.0, 2.0))
            yield step
            left -= step
            progress = round(1.0 - left / duration_s, 3)
            sim.emit(Message(self.name, "heartbeat",
                             {"status": self.state.lower(), "task": task.name,
                              "progress": progress}, correlation_id=task.name))
            draw = rng.random()
            if draw < 1 / PROGRESS_EVERY:
                sim.emit(Message(self.name, "progress", {"task": task.name, "progress": progress,
                                                         "note": "step done"},
                                 correlation_id=task.name))
            elif asks and draw > 1 - 1 / QUESTION_EVERY:
                self._ask(task)

    def _ask(self, task: Task) -> None:
        """A question to the planner and, a little later, its answer."""
        question = self.sim.emit(Message(self.name, "question",
                                          {"task": task.name, "text": "which module owns this?"},
                                          to=PLANNER, correlation_id=task.name))
        self.sim.emit(Message(PLANNER, "answer", {"task": task.name, "text": "see DESIGN.md"},
                              to=self.name, correlation_id=task.name, in_reply_to=question.id),
                      delay_s=self.sim.lognormal(ANSWER_S))

    def _change(self, task: Task, to: str, command: str) -> None:
        self.sim.emit(Message(self.name, "state_change",
                              {"from": self.state, "to": to, "command": command},
                              correlation_id=task.name))
        self.state = to

    def _announce_death(self, task: Task) -> None:
        """What the bus says once the silent holder's lease is reaped (or ran out for good)."""
        silent_s = DEAD_AFTER_MS / 1000 + self.sim.rng.uniform(1.0, 60.0)
        if task.attempts >= MAX_ATTEMPTS:
            died_at = self.sim.now_ms + int(silent_s * 1000)
            self.sim.emit(Message(SYSTEM_AGENT, "task_dead",
                                  {"task": task.name, "last_holder": self.name,
                                   "attempts": task.attempts, "reason": "lease expired",
                                   "died_at_ms": died_at}, correlation_id=task.name),
                          delay_s=silent_s)
            return
        self.sim.emit(Message(SYSTEM_AGENT, "task_released",
                              {"task": task.name, "agent": self.name, "reason": "agent dead",
                               "silent_s": round(silent_s, 3)}, correlation_id=task.name),
                      delay_s=silent_s)
        self.sim.start(self._requeue(task, silent_s))

    def _requeue(self, task: Task, after_s: float) -> Iterator[float]:
        """Back in the queue once released: taken over by whoever is free first."""
        yield after_s
        self.queue.put_back(task)


def simulate(seed: int, start_ms: int, workers: int) -> Iterator[tuple[int, Message]]:
    """An endless history in time order; take as many messages as needed."""
    rng = random.Random(seed)
    sim = Simulation(rng, start_ms)
    queue = TaskQueue(rng)
    for number in range(1, workers + 1):
        sim.start(Worker(sim, queue, f"worker-{number:02d}").process(),
                  delay_s=rng.uniform(0.0, 120.0))  # staggered, as processes start
    return sim.run()


# --- output ---------------------------------------------------------------------


class _IsoTimes:
    """ts strings of the export ("YYYY-MM-DDTHH:MM:SS.mmmZ"): one strftime per minute."""

    def __init__(self) -> None:
        self._minute = -1
        self._prefix = ""

    def __call__(self, ts_ms: int) -> str:
        minute, rest = divmod(ts_ms, 60_000)
        if minute != self._minute:  # times only go forward: one cached minute is enough
            moment = datetime.fromtimestamp(minute * 60, tz=timezone.utc)
            self._minute, self._prefix = minute, moment.strftime("%Y-%m-%dT%H:%M:")
        return f"{self._prefix}{rest // 1000:02d}.{rest % 1000:03d}Z"


def export_lines(history: Iterator[tuple[int, Message]], count: int) -> Iterator[tuple[str, bytes]]:
    """(date, line) for the first `count` messages, numbered from seq 1 like a fresh bus."""
    iso = _IsoTimes()
    dumps = orjson.dumps
    for seq, (ts_ms, m) in enumerate(itertools.islice(history, count), start=1):
        ts = iso(ts_ms)
        # Same keys in the same order as bus/log/export.py's format_line.
        yield ts[:10], dumps({
            "seq": seq, "id": m.id, "ts_ms": ts_ms, "ts": ts, "from": m.from_agent, "to": m.to,
            "type": m.type, "correlation_id": m.correlation_id, "in_reply_to": m.in_reply_to,
            "payload_ref": None, "payload": m.payload,
        }) + b"\n"


def write_file(lines: Iterator[tuple[str, bytes]], path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "wb") as out:
        for chunk in _chunks(lines):
            out.write(b"".join(line for _date, line in chunk))
            written += len(chunk)
    return written


def write_partitions(lines: Iterator[tuple[str, bytes]], root: Path) -> int:
    """`date=YYYY-MM-DD/part-<first seq>.jsonl`, the exporter's partition layout."""
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"error: {root} is not empty; generate into a new directory")
    written, current, out = 0, None, None
    try:
        for chunk in _chunks(lines):
            for date, group in itertools.groupby(chunk, key=lambda item: item[0]):
                if date != current:
                    if out is not None:
                        out.close()
                    part = root / f"date={date}" / f"part-{written + 1:012d}.jsonl"
                    part.parent.mkdir(parents=True, exist_ok=True)
                    out, current = open(part, "wb"), date
                data = [line for _date, line in group]
                out.write(b"".join(data))
                written += len(data)
    finally:
        if out is not None:
            out.close()
    return written


def publish_to_bus(history: Iterator[tuple[int, Message]], count: int, db: Path) -> int:
    """Publish into a real bus file in batches (the bus sets seq and time itself)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout too
    from bus import Bus

    written = 0
    with Bus.open(db) as bus:
        for chunk in _chunks(itertools.islice(history, count), BUS_BATCH):
            bus.publish_many([{
                "from_agent": m.from_agent, "type": m.type, "payload": m.payload, "to": m.to,
                "id": m.id, "correlation_id": m.correlation_id, "in_reply_to": m.in_reply_to,
            } for _ts, m in chunk])
            written += len(chunk)
    return written


def _chunks(items: Iterator[Any], size: int = CHUNK_LINES) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def parse_start(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, help="export JSONL file (or directory with"
                                                 " --partition-by date) to write")
    target.add_argument("--bus", type=Path, help="bus database to publish into instead")
    parser.add_argument("-n", "--messages", type=int, default=100_000, help="how many messages")
    parser.add_argument("--seed", type=int, default=1, help="same seed, same history")
    parser.add_argument("--workers", type=int, default=24, help="workers taking tasks")
    parser.add_argument("--start", default=DEFAULT_START, help="simulated start time (ISO 8601)")
    parser.add_argument("--partition-by", choices=["date"],
                        help="write date=YYYY-MM-DD/part-*.jsonl under the --out directory")
    args = parser.parse_args(argv)
    if args.messages < 0 or args.workers < 1:
        parser.error("--messages must be >= 0 and --workers >= 1")
    if args.partition_by and args.out is None:
        parser.error("--partition-by needs --out")

    started = time.perf_counter()
    history = simulate(args.seed, parse_start(args.start), args.workers)
    if args.bus is not None:
        written, where = publish_to_bus(history, args.messages, args.bus), args.bus
    else:
        lines = export_lines(history, args.messages)
        writer: Callable[[Iterator[tuple[str, bytes]], Path], int] = (
            write_partitions if args.partition_by else write_file)
        written, where = writer(lines, args.out), args.out
    elapsed = time.perf_counter() - started
    rate = written / elapsed if elapsed > 0 else float("inf")
    print(f"wrote {written} messages to {where} in {elapsed:.1f} s ({rate:,.0f}/s)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
