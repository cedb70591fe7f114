"""The JSONL export (bus/log/export.py, Bus.export_jsonl, `bus export`): exactly once, append-only.

The export's promise: every message once, in seq order, across crashes, and
the file only ever grows. Crash points are tested two ways: deterministically,
by leaving in the file what a crash at that point leaves (complete lines past
the recorded end, a torn last line, foreign bytes) and opening an exporter;
and for real, by SIGKILLing exporter processes at random moments while
another process publishes and a reader tails the file. Child programs are in
tests/support/procs_export.py.

The expected file is always computed from the database: the line of each
row (format_line, itself checked field by field against the row), joined in
seq order. Since messages never change, the export file must at every
moment be a prefix of that.
"""

from __future__ import annotations

import json
import os
import pty
import random
import re
import select
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter
from datetime import datetime
from datetime import timedelta
from datetime import timezone
from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.cli import main
from bus.storage.errors import BusNotFound
from bus.log.export import ExportError
from bus.log.export import JsonlExporter
from bus.log.export import format_line
from bus.log.messages import now_ms
from tests.support.procs_coordination import Barrier
from tests.support.procs_export import Children
from tests.support.procs_export import make_messages
from tests.support.properties import scaled_settings

LINE_KEYS = ["seq", "id", "ts_ms", "ts", "from", "to", "type", "correlation_id", "in_reply_to",
             "payload_ref", "payload"]
# The columns format_line takes, in its order; written here, not imported, so a
# change in the library's query cannot hide itself.
ROWS_SQL = ("SELECT seq, id, ts_ms, from_agent, to_agent, type, correlation_id, in_reply_to,"
            " payload, payload_ref FROM messages WHERE seq > ? ORDER BY seq LIMIT ?")
STATE_SQL = "SELECT last_seq, path, part, bytes FROM export_state WHERE id = 1"
DEADLINE = 15.0  # seconds for anything a test waits for


# --- helpers ----------------------------------------------------------------


def run(args: list[str], db: Path | str | None = None, *, env: dict[str, str | None] | None = None):
    """Invoke the CLI in-process; BUS_DB / BUS_DURABILITY from the caller's shell are hidden."""
    full_env: dict[str, str | None] = {"BUS_DB": None, "BUS_DURABILITY": None}
    full_env.update(env or {})
    argv = (["--db", str(db)] if db is not None else []) + args
    return CliRunner().invoke(main, argv, env=full_env, catch_exceptions=False)


def rows(bus: Bus, after: int = 0) -> list[tuple]:
    return bus.conn.execute(ROWS_SQL, (after, 1 << 62)).fetchall()


def expected_file(bus: Bus) -> bytes:
    """The whole export as it must be: every message's line, in seq order."""
    return b"".join(format_line(row) for row in rows(bus))


def export_state(bus: Bus) -> tuple[int, str | None, str | None, int]:
    return bus.conn.execute(STATE_SQL).fetchone()


def publish(bus: Bus, count: int, seed: int = 0, big_every: int = 0) -> None:
    rng = random.Random(seed)
    for start in range(0, count, 2000):
        bus.publish_many(make_messages(rng, min(2000, count - start), big_every))


def assert_exactly_once(bus: Bus, out: Path) -> list[dict]:
    """The file holds every message of the bus once, in seq order, as format_line writes
    it, and export_state records exactly the file: last_seq the last line, bytes its size."""
    data = out.read_bytes()
    assert data.endswith(b"\n") or not data, f"{out} ends in a partial line: {data[-80:]!r}"
    lines = data.split(b"\n")[:-1]
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            raise AssertionError(f"{out}: line {number} is not JSON: {line[:80]!r}") from None
    bus_rows = rows(bus)
    file_seqs = [record["seq"] for record in records]
    bus_seqs = [row[0] for row in bus_rows]
    if file_seqs != bus_seqs:
        duplicates = [seq for seq, n in Counter(file_seqs).items() if n > 1]
        missing = sorted(set(bus_seqs) - set(file_seqs))
        raise AssertionError(f"{out}: {len(file_seqs)} lines for {len(bus_seqs)} messages;"
                             f" duplicated seqs {duplicates[:10]}, missing {missing[:10]},"
                             f" in order: {file_seqs == sorted(file_seqs)}")
    for line, row in zip(lines, bus_rows):
        assert line + b"\n" == format_line(row), f"line of seq {row[0]} differs from its row"
    assert export_state(bus) == (bus_seqs[-1] if bus_seqs else 0, str(out.absolute()), None,
                                 len(data))
    return records


def iso(ts_ms: int) -> str:
    """ISO 8601 UTC with milliseconds, computed independently of the library."""
    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ts_ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def exported_bus(bus: Bus, out: Path, count: int = 5) -> bytes:
    """Publish `count` messages and export them; return the file's bytes."""
    publish(bus, count, seed=count)
    assert bus.export_jsonl(out) == count
    return out.read_bytes()


def snapshot(bus: Bus, out: Path) -> tuple:
    """What a refused export must leave exactly as it was."""
    return export_state(bus), out.read_bytes() if out.exists() else None


class ExpectedExport:
    """The export file as it must be at any moment: a prefix of every message's line in
    seq order, with export_state.bytes at the end of the line of last_seq.

    Lines are computed once per message (messages never change), so checking the
    file after each of many kills stays cheap.
    """

    def __init__(self, bus: Bus, out: Path) -> None:
        self.bus = bus
        self.out = out
        self.data = bytearray()
        self.ends = {0: 0}  # seq -> offset just after its line
        self.last = 0
        self.lines = 0

    def _extend_to(self, size: int) -> None:
        while len(self.data) < size:
            batch = self.bus.conn.execute(ROWS_SQL, (self.last, 5000)).fetchall()
            if not batch:
                return
            for row in batch:
                self.data += format_line(row)
                self.ends[row[0]] = len(self.data)
            self.last = batch[-1][0]

    def check(self, context: str) -> str:
        """Assert the file and the state are consistent; say where the file ends.

        Sets `self.lines` to the number of complete lines in the file."""
        data = self.out.read_bytes() if self.out.exists() else b""
        last_seq, path, part, recorded = export_state(self.bus)
        self._extend_to(len(data))
        expected = bytes(self.data[:len(data)])
        if data != expected:
            at = next(i for i, (a, b) in enumerate(zip(data, expected)) if a != b) \
                if len(data) <= len(self.data) else len(self.data)
            raise AssertionError(
                f"{context}: the file differs from the expected export at byte {at} of"
                f" {len(data)}: {data[max(0, at - 60):at + 60]!r} instead of"
                f" {expected[max(0, at - 60):at + 60]!r}")
        assert path in (None, str(self.out)) and part is None, (context, path, part)
        self._extend_to(recorded + 1)
        size = len(data)
        assert recorded <= size, f"{context}: the state records {recorded} bytes of {size}"
        self.lines = data.count(b"\n")
        assert self.ends.get(last_seq) == recorded, (
            f"{context}: state says seq {last_seq} ends at byte {recorded}; it ends at"
            f" {self.ends.get(last_seq)}")
        if len(data) == recorded:
            return "at the recorded end"
        if data.endswith(b"\n"):
            return "complete lines past the recorded end"
        return "torn last line"


class TailReader(threading.Thread):
    """A careful `tail -f` consumer: reads appended bytes, parses only complete lines.

    It remembers every byte it read, so the test can check that the final file
    starts with all of them (nothing it saw was changed or cut afterwards), and
    fails if the file ever gets shorter than what it has read, if a complete line
    does not parse, or if a seq comes twice or out of order.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.seen = bytearray()
        self.lines: list[bytes] = []
        self.seqs: list[int] = []
        self.partial_reads = 0  # reads that ended inside a line
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def finish(self) -> None:
        """Read to the end of the file as it is now, then stop."""
        self._stop_event.set()
        self.join(DEADLINE)
        assert not self.is_alive(), "the reader did not stop"
        assert not self.errors, self.errors[0]

    def run(self) -> None:
        try:
            self._follow()
        except BaseException:
            self.errors.append(traceback.format_exc())

    def _follow(self) -> None:
        while not self.path.exists():
            if self._stop_event.is_set():
                return
            time.sleep(0.001)
        pending = b""
        with open(self.path, "rb", buffering=0) as f:
            while True:
                stopping = self._stop_event.is_set()  # before the read: the last read sees all
                chunk = f.read(1 << 20)
                size = os.fstat(f.fileno()).st_size
                assert size >= len(self.seen), f"the file shrank to {size} after {len(self.seen)}"
                if not chunk:
                    if stopping:
                        break
                    time.sleep(0.0005)
                    continue
                self.seen += chunk
                *complete, pending = (pending + chunk).split(b"\n")
                if pending:
                    self.partial_reads += 1
                for line in complete:
                    seq = orjson.loads(line)["seq"]
                    assert not self.seqs or seq > self.seqs[-1], (
                        f"seq {seq} read after seq {self.seqs[-1]}")
                    self.seqs.append(seq)
                    self.lines.append(line)
        assert pending == b"", f"the file ends in a partial line {pending[:80]!r}"


class StateMonitor(threading.Thread):
    """Reads export_state, then the file's size, over and over, from its own connection.

    The state follows the disk: whatever state a reader can see, the file
    already holds the bytes it records. A state committed before its lines
    were written shows up here as recorded bytes beyond the file's end, even
    when no kill lands in that window.
    """

    def __init__(self, db_path: Path, out: Path) -> None:
        super().__init__(daemon=True)
        self.db_path = db_path
        self.out = out
        self.samples = 0
        self.ahead: list[tuple[int, int]] = []  # (recorded bytes, file size) seen
        self.errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            with Bus.open(self.db_path) as own:
                while not self._stop_event.is_set():
                    recorded = own.conn.execute(STATE_SQL).fetchone()[3]
                    try:
                        size = os.stat(self.out).st_size
                    except FileNotFoundError:
                        size = 0
                    if recorded > size:
                        self.ahead.append((recorded, size))
                    self.samples += 1
                    time.sleep(0.0005)
        except BaseException:
            self.errors.append(traceback.format_exc())

    def finish(self) -> None:
        self._stop_event.set()
        self.join(DEADLINE)
        assert not self.is_alive(), "the state monitor did not stop"
        assert not self.errors, self.errors[0]
        assert self.samples > 0
        assert not self.ahead, (f"export_state recorded more bytes than the file held"
                                f" ({len(self.ahead)} times, e.g. {self.ahead[:3]}): the state"
                                " was committed before the lines were written")


def seconds_per_message(bus: Bus, out: Path, batches: tuple[int, ...]) -> dict[int, float]:
    """Time a few in-process export steps of each batch size (children run the same code).

    This exports the first messages; the kill delays are drawn over a range
    scaled from these times so that they cover a whole export.
    """
    timing = {}
    with JsonlExporter(bus.conn, out) as exporter:
        for batch in batches:
            # Past a few hundred lines a step costs about the same per line.
            step = min(batch, 400)
            start, done, steps = time.perf_counter(), 0, max(2, 600 // step)
            for count in exporter.export_batches(step):
                done += count
                steps -= 1
                if not steps:
                    break
            timing[batch] = (time.perf_counter() - start) / max(done, 1)
    return timing


def kill_exporters_at_random(bus: Bus, db_path: Path, out: Path, children: Children,
                             rng: random.Random, iterations: range, batches: tuple[int, ...],
                             budget: float, note: str) -> Counter:
    """Start exporter children and SIGKILL each after a random delay; check the file after each.

    The delay is uniform from 0 (the bus just opened, the exporter not yet) to
    twice the time the export of everything pending takes divided by the
    iterations left (estimated from in-process timing, then from how far the
    children got): the backlog is worked off by all the children together, each
    killed at a random point of its share, and the last ones often get to the
    end. So kills land at every step: opening and recovering, formatting,
    writing, fsyncing, committing, and after the end, all along the backlog.
    After a kill, the next exporter is either
    another child or, now and then, an in-process exporter that runs a few
    batches and closes. Runs `iterations.stop` iterations, or `iterations.start`
    and as many more as fit in `budget` seconds (a loaded machine is slower).
    Meanwhile a StateMonitor checks that the state never runs ahead of the file.
    Returns how the kills left the file.
    """
    outcomes: Counter = Counter()
    monitor = StateMonitor(db_path, out)
    monitor.start()
    try:
        timing = seconds_per_message(bus, out, batches)
        expected = ExpectedExport(bus, out)
        expected.check(f"{note}, calibration")
        _kill_loop(bus, db_path, out, children, rng, iterations, batches, budget, note,
                   timing, expected, outcomes)
    finally:
        monitor.finish()
    outcomes["state samples"] = monitor.samples
    return outcomes


def _kill_loop(bus: Bus, db_path: Path, out: Path, children: Children, rng: random.Random,
               iterations: range, batches: tuple[int, ...], budget: float, note: str,
               timing: dict[int, float], expected: ExpectedExport, outcomes: Counter) -> None:
    deadline = time.monotonic() + budget
    for iteration in range(iterations.stop):
        if iteration >= iterations.start and time.monotonic() > deadline:
            break
        context = f"{note}, iteration {iteration}"
        batch = rng.choice(batches)
        pending = bus.conn.execute("SELECT count(*) FROM messages WHERE seq > ?",
                                   (export_state(bus)[0],)).get
        child = children.start(f"exporter-{iteration}", "export", str(db_path), str(out),
                               "--batch", str(batch))
        lines_before = expected.lines
        try:
            assert child.read_line(DEADLINE) == "go"
            started = time.monotonic()
            share = pending * timing[batch] / (iterations.stop - iteration)
            delay = rng.uniform(0, 0.01 + 2.0 * share)
            try:
                returncode = child.proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                child.proc.kill()
                returncode = child.proc.wait(timeout=DEADLINE)
            elapsed = time.monotonic() - started
            assert returncode in (0, -signal.SIGKILL), child.describe()
        finally:
            child.cleanup()
        where = expected.check(context)
        outcomes["finished" if returncode == 0 else f"killed: {where}"] += 1
        progressed = expected.lines - lines_before
        if progressed >= batch:  # how fast children really are here, under this load
            timing[batch] = (timing[batch] + elapsed / progressed) / 2
        if rng.random() < 0.3:  # resume in this process for a few batches, then stop cleanly
            with JsonlExporter(bus.conn, out) as exporter:
                for _ in zip(range(rng.randrange(4)), exporter.export_batches(rng.choice(batches))):
                    pass
            assert expected.check(f"{context}, in-process resume") == "at the recorded end"


@pytest.fixture
def children(python_env: dict[str, str], tmp_path: Path):
    started = Children(python_env, tmp_path / "stderr")
    yield started
    started.cleanup()


def restore_sigint() -> None:
    """Run in the child before exec: a SIGINT ignored by our parent must not stay ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for_file_lines(path: Path, count: int, proc: subprocess.Popen | None = None) -> None:
    """Block until `path` holds `count` complete lines (deadline: DEADLINE seconds)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        data = path.read_bytes() if path.exists() else b""
        lines = data.count(b"\n")
        if lines >= count:
            return
        if proc is not None:
            assert proc.poll() is None, f"the exporter exited with {proc.returncode}"
        assert time.monotonic() < deadline, (
            f"{path} has {lines} lines, not {count}, after {DEADLINE} s")
        time.sleep(0.005)


def read_line_with_deadline(stream, timeout: float = DEADLINE) -> bytes:
    ready, _, _ = select.select([stream], [], [], timeout)
    assert ready, f"no output within {timeout} s"
    return stream.readline()


# --- crash points, deterministically ------------------------------------------


def test_export_adopts_complete_lines_a_crash_left_past_the_recorded_end(
        bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "bus.jsonl"
    recorded = exported_bus(bus, out, 5)
    publish(bus, 5, seed=1)
    # A crash after writing and fsyncing lines 6-8, before the state committed:
    leftover = b"".join(format_line(row) for row in rows(bus, 5)[:3])
    out.write_bytes(recorded + leftover)
    with JsonlExporter(bus.conn, out) as exporter:
        # Opening adopts them: the state moves up to them, the file is untouched.
        assert export_state(bus) == (8, str(out), None, len(recorded + leftover))
        assert out.read_bytes() == recorded + leftover
        assert exporter.pending() == 2
        assert exporter.export() == 2
    assert_exactly_once(bus, out)


@pytest.mark.parametrize("cut", [1, 2, 17, -2, -1], ids=lambda cut: f"cut{cut}")
@pytest.mark.parametrize("whole_lines", [0, 2])
def test_export_completes_a_torn_last_line_instead_of_truncating(
        bus: Bus, tmp_path: Path, cut: int, whole_lines: int) -> None:
    out = tmp_path / "bus.jsonl"
    recorded = exported_bus(bus, out, 4)
    publish(bus, 4, seed=2)
    new = [format_line(row) for row in rows(bus, 4)]
    # A crash in the middle of a write: whole lines, then the start of the next one
    # (cut -1 leaves all of it but the newline).
    torn = b"".join(new[:whole_lines]) + new[whole_lines][:cut]
    out.write_bytes(recorded + torn)
    inode = out.stat().st_ino
    with open(out, "rb") as reader:  # a `tail -f` reader that has read the torn bytes
        seen = reader.read()
        with JsonlExporter(bus.conn, out):
            assert export_state(bus) == (4 + whole_lines + 1, str(out), None,
                                         len(recorded) + sum(map(len, new[:whole_lines + 1])))
        # Completed in place: the same file, and every byte before stays as it was.
        assert out.stat().st_ino == inode
        rest = reader.read()
    assert seen == recorded + torn
    assert seen + rest == recorded + b"".join(new[:whole_lines + 1])
    assert bus.export_jsonl(out) == 4 - whole_lines - 1
    assert out.read_bytes().startswith(recorded + torn)
    assert_exactly_once(bus, out)


@pytest.mark.parametrize("tail", [
    pytest.param(b"garbage\n", id="not-json"),
    pytest.param(b"garb", id="torn-not-a-prefix"),
    pytest.param(b"\n", id="empty-line"),
    pytest.param(b'[6, "not a record"]\n', id="json-array"),
    pytest.param(b'{"seq": 6}\n', id="record-that-is-not-the-message"),
    pytest.param(None, id="message-6-edited"),
    pytest.param(b"", id="message-5-again"),
    pytest.param(b"", id="message-7-without-6"),
])
def test_export_refuses_a_foreign_tail_and_changes_nothing(
        bus: Bus, tmp_path: Path, request, tail: bytes | None) -> None:
    out = tmp_path / "bus.jsonl"
    recorded = exported_bus(bus, out, 5)
    publish(bus, 3, seed=3)
    following = [format_line(row) for row in rows(bus, 5)]
    case = request.node.callspec.id
    if case == "message-6-edited":
        tail = following[0].replace(b'"seq":6', b'"seq":6,"edited":true')
    elif case == "message-5-again":
        tail = recorded.splitlines(keepends=True)[-1]
    elif case == "message-7-without-6":
        tail = following[1]
    out.write_bytes(recorded + tail)
    before = snapshot(bus, out)
    with pytest.raises(ExportError, match="changed by hand|does not match the bus"):
        bus.export_jsonl(out)
    assert snapshot(bus, out) == before
    # Once the foreign bytes are gone, the export goes on as if nothing happened.
    out.write_bytes(recorded)
    assert bus.export_jsonl(out) == 3
    assert_exactly_once(bus, out)


@pytest.mark.parametrize("keep", [0, 1, -1], ids=["emptied", "one-byte", "last-byte-cut"])
def test_export_refuses_a_file_shorter_than_recorded(
        bus: Bus, tmp_path: Path, keep: int) -> None:
    out = tmp_path / "bus.jsonl"
    recorded = exported_bus(bus, out, 5)
    publish(bus, 2, seed=4)
    out.write_bytes(recorded[:keep])
    before = snapshot(bus, out)
    with pytest.raises(ExportError, match=f"has {len(recorded[:keep])} bytes but"
                                          f" {len(recorded)} were exported"):
        bus.export_jsonl(out)
    assert snapshot(bus, out) == before


def test_export_refuses_a_deleted_export_file(bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "bus.jsonl"
    exported_bus(bus, out, 3)
    state = export_state(bus)
    out.unlink()
    with pytest.raises(ExportError, match="truncated or replaced"):
        bus.export_jsonl(out)
    assert export_state(bus) == state


def test_export_refuses_a_non_empty_foreign_file_on_first_export(
        bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "notes.jsonl"
    out.write_bytes(b'{"mine": true}\n')
    publish(bus, 3)
    before = snapshot(bus, out)
    with pytest.raises(ExportError, match="did not write"):
        bus.export_jsonl(out)
    assert snapshot(bus, out) == before
    assert export_state(bus) == (0, None, None, 0)


def test_export_accepts_an_empty_existing_file_on_first_export(
        bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "bus.jsonl"
    out.touch()
    publish(bus, 3)
    assert bus.export_jsonl(out) == 3
    assert_exactly_once(bus, out)


def test_export_to_another_path_than_recorded_is_refused_naming_it(
        bus: Bus, tmp_path: Path) -> None:
    first = tmp_path / "first.jsonl"
    exported_bus(bus, first, 3)
    publish(bus, 2, seed=5)
    before = snapshot(bus, first)
    for other in (tmp_path / "second.jsonl", tmp_path / "sub" / "first.jsonl"):
        with pytest.raises(ExportError, match=f"this bus exports to {re.escape(str(first))};"):
            bus.export_jsonl(other)
        assert snapshot(bus, first) == before
    assert bus.export_jsonl(first) == 2
    assert_exactly_once(bus, first)


def test_export_to_another_path_leaves_no_file_there(bus: Bus, tmp_path: Path) -> None:
    # Regression: the lock's open (O_CREAT) used to run before the recorded path was
    # checked, leaving an empty file wherever a mistyped --out pointed.
    exported_bus(bus, tmp_path / "first.jsonl", 3)
    other = tmp_path / "typo.jsonl"
    with pytest.raises(ExportError):
        bus.export_jsonl(other)
    assert not other.exists()


def test_export_recovers_again_after_a_crash_during_recovery(bus: Bus, tmp_path: Path) -> None:
    # The torn line is completed and fsynced, then the process dies before the state
    # commits: the next open finds a complete line past the recorded end and adopts it.
    out = tmp_path / "bus.jsonl"
    recorded = exported_bus(bus, out, 3)
    publish(bus, 2, seed=6)
    completed = format_line(rows(bus, 3)[0])
    out.write_bytes(recorded + completed)
    assert bus.export_jsonl(out) == 1
    assert_exactly_once(bus, out)


# --- crash points, for real: SIGKILL at random moments ------------------------


@pytest.mark.slow
def test_export_sigkilled_at_random_points_resumes_exactly_once(
        bus: Bus, db_path: Path, tmp_path: Path, children: Children) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")  # shown with a failure: random.Random(seed) replays the choices
    rng = random.Random(seed)
    publish(bus, 25_000, seed=seed, big_every=2500)
    publisher = children.start("publisher", "publish", str(db_path), "--seed", str(seed + 1),
                               "--max", "15000", "--most", "20", "--big-every", "1000")
    assert publisher.read_line(DEADLINE) == "publishing"
    out = tmp_path / "export" / "bus.jsonl"
    started = time.monotonic()
    outcomes = kill_exporters_at_random(bus, db_path, out, children, rng, range(30, 50),
                                        batches=(2, 8, 30, 120), budget=25.0,
                                        note=f"seed {seed}")
    publisher.close_stdin()
    published = json.loads(publisher.read_line(DEADLINE))["published"]
    publisher.wait_ok(DEADLINE)
    bus.export_jsonl(out)  # finish in this process
    records = assert_exactly_once(bus, out)
    assert len(records) == 25_000 + published
    assert any(record["payload_ref"] for record in records)  # blob payloads went through too
    print(f"seed {seed}: {dict(outcomes)} in {time.monotonic() - started:.1f} s,"
          f" {len(records)} messages")
    killed = sum(n for outcome, n in outcomes.items() if outcome.startswith("killed"))
    # The kills really landed inside exports, often between the write and the commit.
    assert killed >= 10, outcomes
    assert outcomes["killed: complete lines past the recorded end"] >= 1, outcomes


@pytest.mark.slow
def test_export_tailing_reader_sees_each_record_once_across_kills(
        bus: Bus, db_path: Path, tmp_path: Path, children: Children) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")  # shown with a failure: random.Random(seed) replays the choices
    rng = random.Random(seed)
    publish(bus, 20_000, seed=seed)
    out = tmp_path / "bus.jsonl"
    reader = TailReader(out)
    reader.start()
    publisher = children.start("publisher", "publish", str(db_path), "--seed", str(seed + 1),
                               "--max", "10000", "--most", "40")
    try:
        assert publisher.read_line(DEADLINE) == "publishing"
        # Large batches too: a kill inside a long write can tear a line.
        outcomes = kill_exporters_at_random(bus, db_path, out, children, rng, range(20, 30),
                                            batches=(5, 50, 2000, 8000), budget=15.0,
                                            note=f"seed {seed}")
        publisher.close_stdin()
        publisher.read_line(DEADLINE)
        publisher.wait_ok(DEADLINE)
        bus.export_jsonl(out)
    finally:
        reader.finish()
    final = out.read_bytes()
    print(f"seed {seed}: {dict(outcomes)}; the reader ended {reader.partial_reads} reads"
          f" inside a line")
    # Everything the reader read is still there, unchanged: nothing was cut or rewritten.
    assert final.startswith(bytes(reader.seen))
    assert len(reader.seen) == len(final)
    assert reader.seqs == [row[0] for row in rows(bus)]
    assert [line + b"\n" for line in reader.lines] == [format_line(row) for row in rows(bus)]
    assert_exactly_once(bus, out)


# --- one exporter at a time ---------------------------------------------------


def test_exporter_second_on_the_same_file_is_refused_until_the_first_closes(
        bus: Bus, db_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "bus.jsonl"
    exported_bus(bus, out, 3)
    publish(bus, 4, seed=7)
    with Bus.open(db_path) as other:
        first = JsonlExporter(bus.conn, out)
        first.open()
        before = snapshot(bus, out)
        with pytest.raises(ExportError, match=f"another exporter is writing {out}; stop it"):
            JsonlExporter(other.conn, out).open()
        with pytest.raises(ExportError, match="another exporter is writing"):
            other.export_jsonl(out)
        assert snapshot(bus, out) == before
        assert first.export(batch=1) == 4
        first.close()
        publish(bus, 2, seed=8)
        assert other.export_jsonl(out) == 2
    assert_exactly_once(bus, out)


@pytest.mark.slow
def test_export_lock_of_a_sigkilled_exporter_process_is_released(
        bus: Bus, db_path: Path, tmp_path: Path, children: Children) -> None:
    out = tmp_path / "bus.jsonl"
    exported_bus(bus, out, 3)
    publish(bus, 3, seed=9)
    holder = children.start("holder", "hold", str(db_path), str(out))
    assert holder.read_line(DEADLINE) == "holding"
    with pytest.raises(ExportError, match="another exporter is writing"):
        bus.export_jsonl(out)
    refused = run(["export"], db_path)
    assert refused.exit_code == 1
    assert refused.stderr == f"Error: another exporter is writing {out}; stop it first\n"
    holder.proc.kill()
    assert holder.wait(DEADLINE) == -signal.SIGKILL
    result = run(["export"], db_path)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"exported 3 message(s) to {out}\n"
    assert_exactly_once(bus, out)


@pytest.mark.slow
def test_export_cli_racing_processes_export_each_message_once(
        bus: Bus, db_path: Path, tmp_path: Path, children: Children) -> None:
    out = tmp_path / "bus.jsonl"
    for round_ in range(4):
        publish(bus, 3000, seed=round_)
        barrier = Barrier()
        try:
            argv = json.dumps(["--db", str(db_path), "export", "--out", str(out), "--json"])
            racers = [children.start(f"racer-{round_}-{n}", "cli", argv, "--go-fd",
                                     str(barrier.read_fd), pass_fds=(barrier.read_fd,))
                      for n in range(3)]
            barrier.release(racers, DEADLINE)
        finally:
            barrier.close()
        exported = 0
        for racer in racers:
            returncode = racer.wait(DEADLINE)
            stdout = racer.rest_of_stdout()
            if returncode == 0:
                report = json.loads(stdout)
                assert report["path"] == str(out)
                exported += report["exported"]
            else:
                # The loser fails cleanly: the lock, not a half-done export
                # (with --json, the error is a JSON object on stderr).
                assert (returncode, stdout) == (1, ""), racer.describe()
                assert json.loads(racer.stderr()) == {
                    "error": f"another exporter is writing {out}; stop it first",
                    "field": None}, racer.describe()
        assert exported == 3000, f"round {round_}: {exported} exported"
        assert_exactly_once(bus, out)


def _threads_sleeping(threads: list[threading.Thread], outcomes: list) -> bool:
    """True once every thread sleeps in nanosleep (SQLite's busy handler)."""
    states = []
    for thread in threads:
        if not thread.is_alive():
            pytest.fail(f"opening ended without waiting for the write lock: {outcomes}")
        try:
            states.append(Path(f"/proc/self/task/{thread.native_id}/wchan").read_text())
        except OSError:
            pytest.skip("the kernel does not say what a thread waits on")
    return all("nanosleep" in state for state in states)


def test_export_two_first_exporters_on_different_files_cannot_both_write(
        bus: Bus, db_path: Path, tmp_path: Path) -> None:
    # Regression: two exporters opened at once on a bus that never exported both
    # passed _start_fresh (its UPDATE checked last_seq only, not the path), so each
    # went on writing at the other's recorded byte offset into its own file: a file
    # starting with NUL bytes, and messages split between two files.
    publish(bus, 10)
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    buses = [Bus.open(db_path) for _ in files]
    exporters = [JsonlExporter(b.conn, path) for b, path in zip(buses, files)]
    outcomes: list = [None, None]

    def open_exporter(n: int) -> None:
        try:
            exporters[n].open()
            outcomes[n] = "open"
        except ExportError as exc:
            outcomes[n] = exc

    # Both read the state (no export yet) and then wait for the write lock held here.
    holder = Bus.open(db_path)
    holder.conn.execute("BEGIN IMMEDIATE")
    threads = [threading.Thread(target=open_exporter, args=(n,)) for n in range(2)]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + DEADLINE
        while not _threads_sleeping(threads, outcomes):
            if time.monotonic() > deadline:
                pytest.fail("the exporters did not reach the write lock")
            time.sleep(0.001)
    finally:
        holder.conn.execute("COMMIT")
        for thread in threads:
            thread.join(DEADLINE)
        holder.close()
    try:
        for step in range(3):  # each open exporter exports; then more messages come
            if step:
                publish(bus, 5, seed=step)
            for n in ((0, 1), (1, 0))[step % 2]:  # each takes a turn at exporting first
                if outcomes[n] == "open":
                    try:
                        exporters[n].export()
                    except ExportError:  # refusing is fine: writing beside the record is not
                        pass
    finally:
        for exporter in exporters:
            exporter.close()
        for b in buses:
            b.close()
    assert_exactly_once(bus, Path(export_state(bus)[1]))


# --- --follow -----------------------------------------------------------------


@pytest.mark.slow
def test_export_follow_subprocess_exports_new_messages_until_sigint(
        bus: Bus, db_path: Path, tmp_path: Path, bus_command, python_env) -> None:
    out = tmp_path / "follow.jsonl"
    publish(bus, 3)
    env = {k: v for k, v in python_env.items() if k != "BUS_DURABILITY"}
    proc = subprocess.Popen(bus_command + ["--db", str(db_path), "export", "--follow",
                                           "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=restore_sigint)
    try:
        assert read_line_with_deadline(proc.stdout) == f"exported 3 message(s) to {out}\n".encode()
        total = 3
        for round_, count in enumerate([1, 7, 2500]):  # the last one in several commits
            for start in range(0, count, 1000):
                publish(bus, min(1000, count - start), seed=100 + round_ * 10 + start)
            total += count
            wait_for_file_lines(out, total, proc)
            # The state commits just after the lines are on disk: check the lines here.
            assert out.read_bytes() == expected_file(bus)
        proc.send_signal(signal.SIGINT)
        returncode = proc.wait(timeout=DEADLINE)
        stdout, stderr = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    assert returncode == 0, stderr
    assert (stdout, stderr) == (b"", b"")
    assert_exactly_once(bus, out)
    assert bus.export_jsonl() == 0  # the state ended where the file ends


FOLLOWER = """
import sys
from bus import Bus
with Bus.open(sys.argv[1]) as bus, bus.exporter(sys.argv[2]) as exporter:
    print(exporter.export(), flush=True)
    exporter.follow(bus.wait_for_change)
print("stopped", flush=True)
"""


@pytest.mark.slow
def test_exporter_follow_returns_at_sigint_with_every_message_once(
        bus: Bus, db_path: Path, tmp_path: Path, python_env) -> None:
    """The library's follow (what `bus export --follow` calls) stops at Ctrl-C and returns."""
    out = tmp_path / "follow.jsonl"
    publish(bus, 2)
    proc = subprocess.Popen([sys.executable, "-c", FOLLOWER, str(db_path), str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=python_env,
                            preexec_fn=restore_sigint)
    try:
        assert read_line_with_deadline(proc.stdout) == b"2\n"
        publish(bus, 5, seed=7)
        wait_for_file_lines(out, 7, proc)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (proc.returncode, stdout, stderr) == (0, b"stopped\n", b"")
    assert_exactly_once(bus, out)


# --- the command line ------------------------------------------------------------


def test_export_cli_prints_count_and_default_path_beside_the_db(
        bus: Bus, db_path: Path, tmp_path: Path) -> None:
    publish(bus, 3)
    default = tmp_path / "bus.jsonl"
    first = run(["export"], db_path)
    assert first.exit_code == 0, first.output
    assert (first.stdout, first.stderr) == (f"exported 3 message(s) to {default}\n", "")
    assert_exactly_once(bus, default)
    second = run(["export"], db_path)
    assert (second.exit_code, second.stdout) == (0, f"exported 0 message(s) to {default}\n")
    publish(bus, 2, seed=1)
    third = run(["export"], db_path)
    assert (third.exit_code, third.stdout) == (0, f"exported 2 message(s) to {default}\n")
    assert_exactly_once(bus, default)


def test_export_cli_json_reports_path_and_count(bus: Bus, db_path: Path, tmp_path: Path) -> None:
    publish(bus, 4)
    out = tmp_path / "exports" / "all.jsonl"
    result = run(["export", "--out", str(out), "--json"], db_path)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"path": str(out), "exported": 4}
    assert list(json.loads(result.stdout)) == ["path", "exported"]
    again = run(["export", "--json"], db_path)  # the recorded path is the default now
    assert json.loads(again.stdout) == {"path": str(out), "exported": 0}
    assert_exactly_once(bus, out)


def test_export_cli_out_elsewhere_after_exporting_exits_1_naming_the_recorded_path(
        bus: Bus, db_path: Path, tmp_path: Path) -> None:
    publish(bus, 2)
    first = tmp_path / "first.jsonl"
    assert run(["export", "--out", str(first)], db_path).exit_code == 0
    publish(bus, 1, seed=1)
    before = snapshot(bus, first)
    result = run(["export", "--out", str(tmp_path / "second.jsonl")], db_path)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith(f"Error: this bus exports to {first};")
    assert snapshot(bus, first) == before


def test_export_cli_relative_out_is_recorded_absolute(
        bus: Bus, db_path: Path, tmp_path: Path, monkeypatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    publish(bus, 2)
    result = run(["export", "--out", "rel.jsonl"], db_path)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"exported 2 message(s) to {work / 'rel.jsonl'}\n"
    monkeypatch.chdir(tmp_path)  # elsewhere, the default is still the recorded file
    assert bus.export_path() == work / "rel.jsonl"
    publish(bus, 1, seed=1)
    assert run(["export"], db_path).stdout == f"exported 1 message(s) to {work / 'rel.jsonl'}\n"
    assert_exactly_once(bus, work / "rel.jsonl")


def test_export_cli_missing_db_exits_1_and_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "missing" / "bus.db"
    result = run(["export"], db)
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ")
    assert str(db) in result.stderr
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(BusNotFound):
        Bus.open(db, create=False)


@pytest.mark.slow
def test_export_cli_progress_bar_only_on_a_terminal(
        bus: Bus, db_path: Path, tmp_path: Path, bus_command, python_env) -> None:
    for start in range(0, 50_000, 10_000):  # PROGRESS_MIN: the backlog that earns a bar
        bus.publish_many([{"from_agent": "a", "type": "t", "payload": n}
                          for n in range(start, start + 10_000)])
    out = tmp_path / "piped.jsonl"
    piped = subprocess.run(bus_command + ["--db", str(db_path), "export", "--out", str(out)],
                           capture_output=True, env=python_env, timeout=60)
    assert (piped.returncode, piped.stderr) == (0, b"")
    assert piped.stdout == f"exported 50000 message(s) to {out}\n".encode()
    assert_exactly_once(bus, out)
    # The same backlog again (as if never exported), now with stderr on a terminal.
    bus.conn.execute("UPDATE export_state SET last_seq = 0, path = NULL, bytes = 0")
    tty_out = tmp_path / "tty.jsonl"
    primary, secondary = pty.openpty()
    try:
        proc = subprocess.Popen(bus_command + ["--db", str(db_path), "export", "--out",
                                               str(tty_out)],
                                stdout=subprocess.PIPE, stderr=secondary, env=python_env)
        os.close(secondary)
        secondary = -1
        terminal = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            terminal += chunk
        stdout, _ = proc.communicate(timeout=DEADLINE)
    finally:
        os.close(primary)
        if secondary >= 0:
            os.close(secondary)
    assert proc.returncode == 0, terminal
    assert b"exporting" in terminal and b"100%" in terminal, terminal[-300:]
    assert stdout == f"exported 50000 message(s) to {tty_out}\n".encode()
    assert_exactly_once(bus, tty_out)


# --- the Python API ------------------------------------------------------------


def test_bus_export_jsonl_returns_counts_and_export_path_follows_the_record(
        bus: Bus, db_path: Path, tmp_path: Path) -> None:
    assert bus.export_path() == db_path.absolute().parent / "bus.jsonl"
    assert bus.export_jsonl(tmp_path / "empty.jsonl") == 0
    # Exporting an empty bus records the file: it is the default from now on.
    assert bus.export_path() == tmp_path / "empty.jsonl"
    publish(bus, 7)
    assert bus.export_jsonl() == 7
    assert bus.export_jsonl() == 0
    publish(bus, 2, seed=1)
    with bus.exporter() as exporter:
        assert exporter.path == tmp_path / "empty.jsonl"
        assert exporter.pending() == 2
        assert list(exporter.export_batches(batch=1)) == [1, 1]
        assert exporter.pending() == 0
    assert_exactly_once(bus, tmp_path / "empty.jsonl")


def test_bus_export_path_defaults_beside_a_relative_db(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with Bus.open("state/bus.db") as opened:
        assert opened.export_path() == tmp_path / "state" / "bus.jsonl"
        publish(opened, 2)
        assert opened.export_jsonl() == 2
        assert_exactly_once(opened, tmp_path / "state" / "bus.jsonl")


# --- the line schema -----------------------------------------------------------


def test_export_line_has_the_stable_schema(bus: Bus, tmp_path: Path) -> None:
    published = bus.publish("planner", "task_assign", {"task": "t1", "n": [1, 2.5, None]},
                            to="worker-1", correlation_id="task-1", in_reply_to="msg-0")
    broadcast = bus.publish("worker-1", "note")
    out = tmp_path / "bus.jsonl"
    bus.export_jsonl(out)
    records = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    for record in records:
        assert list(record) == LINE_KEYS
    ts_ms = [row[2] for row in rows(bus)]
    assert records[0] == {
        "seq": published.seq, "id": published.id, "ts_ms": ts_ms[0], "ts": iso(ts_ms[0]),
        "from": "planner", "to": "worker-1", "type": "task_assign", "correlation_id": "task-1",
        "in_reply_to": "msg-0", "payload_ref": None, "payload": {"task": "t1", "n": [1, 2.5, None]},
    }
    assert records[1] == {
        "seq": broadcast.seq, "id": broadcast.id, "ts_ms": ts_ms[1], "ts": iso(ts_ms[1]),
        "from": "worker-1", "to": None, "type": "note", "correlation_id": None,
        "in_reply_to": None, "payload_ref": None, "payload": None,
    }


@pytest.mark.parametrize("ts_ms", [0, 999, 1000, 1_700_000_000_001, 1_795_000_000_999,
                                   951_782_400_000, 4_102_444_799_999])
def test_export_ts_is_iso_utc_with_milliseconds(bus: Bus, tmp_path: Path, ts_ms: int) -> None:
    seq = bus.publish("a", "t").seq
    bus.conn.execute("UPDATE messages SET ts_ms = ? WHERE seq = ?", (ts_ms, seq))
    bus.export_jsonl(tmp_path / "bus.jsonl")
    record = orjson.loads((tmp_path / "bus.jsonl").read_bytes())
    assert (record["ts_ms"], record["ts"]) == (ts_ms, iso(ts_ms))
    assert datetime.fromisoformat(record["ts"]) == datetime(1970, 1, 1, tzinfo=timezone.utc) \
        + timedelta(milliseconds=ts_ms)


def test_export_large_payload_is_null_with_its_blob_reference(bus: Bus, tmp_path: Path) -> None:
    big = {"text": "é" * 3000, "list": list(range(200))}  # > 4096 bytes of JSON
    just_below = "y" * (4096 - 2)  # a JSON string of exactly 4096 bytes stays inline
    bus.publish("a", "big", big)
    bus.publish("a", "edge", just_below)
    bus.export_jsonl(tmp_path / "bus.jsonl")
    lines = (tmp_path / "bus.jsonl").read_bytes().splitlines()
    first, second = [orjson.loads(line) for line in lines]
    assert first["payload"] is None
    assert first["payload_ref"].startswith("sha256-")
    assert orjson.loads(bus.blobs.get(first["payload_ref"])) == big
    assert (second["payload"], second["payload_ref"]) == (just_below, None)


def test_export_unicode_and_nested_payloads_round_trip(bus: Bus, tmp_path: Path) -> None:
    payloads = [
        {"naïve": "café ☕", "日本": ["語", {"深い": {"ネスト": [[[]], {}]}}]},
        "emoji \U0001F680 and a line\nbreak, a tab\t, quotes \" and backslash \\",
        "separators \u2028 \u2029 and NUL \u0000",
        [1, -1, 2**63 - 1, -2**63, 2**64 - 1, 0.1, -0.0, 1e300, True, False, None],
        {"": "", " ": [{"a": {"b": {"c": {"d": {"e": "deep"}}}}}]},
        0, "", [], {},
    ]
    for payload in payloads:
        bus.publish("a", "t", payload)
    out = tmp_path / "bus.jsonl"
    bus.export_jsonl(out)
    data = out.read_bytes()
    assert data.count(b"\n") == len(payloads)  # newlines inside strings are escaped
    assert [orjson.loads(line)["payload"] for line in data.split(b"\n")[:-1]] == payloads
    assert [json.loads(line)["payload"] for line in data.decode().split("\n")[:-1]] == payloads


def test_format_line_is_deterministic(bus: Bus) -> None:
    publish(bus, 50, seed=11, big_every=10)
    bus.conn.execute("UPDATE messages SET ts_ms = ts_ms + seq * 997_000")  # many seconds
    all_rows = rows(bus)
    first = [format_line(row) for row in all_rows]
    again = [format_line(row) for row in reversed(all_rows)][::-1]
    copies = [format_line(tuple(list(row))) for row in all_rows]
    assert first == again == copies
    for line, row in zip(first, all_rows):
        record = orjson.loads(line)
        assert line == orjson.dumps(record) + b"\n"  # compact: no spaces, one line
        assert (record["seq"], record["ts"]) == (row[0], iso(row[2]))


def test_format_line_keeps_an_undecodable_payload_visible(bus: Bus, tmp_path: Path) -> None:
    seq = bus.publish("a", "t", {"ok": 1}).seq
    bus.conn.execute("UPDATE messages SET payload = ? WHERE seq = ?", ("{not json", seq))
    bus.export_jsonl(tmp_path / "bus.jsonl")
    record = orjson.loads((tmp_path / "bus.jsonl").read_bytes())
    assert record["payload"] == {"undecodable_payload": "{not json"}


AGENT = st.text(alphabet="abcXYZ019._:-", min_size=1, max_size=128)
TEXT = st.text(min_size=1, max_size=60)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


@scaled_settings(max_examples=150)
@given(payload=JSON_VALUES, from_agent=AGENT, to=st.none() | AGENT, type_=TEXT,
       correlation_id=st.none() | TEXT, in_reply_to=st.none() | TEXT,
       ts_ms=st.integers(0, 253_402_300_799_999))
def test_export_line_round_trips_random_messages(
        bus: Bus, tmp_path: Path, payload, from_agent, to, type_, correlation_id, in_reply_to,
        ts_ms) -> None:
    out = tmp_path / "random.jsonl"
    size = out.stat().st_size if out.exists() else 0
    published = bus.publish(from_agent, type_, payload, to=to, correlation_id=correlation_id,
                            in_reply_to=in_reply_to)
    bus.conn.execute("UPDATE messages SET ts_ms = ? WHERE seq = ?", (ts_ms, published.seq))
    assert bus.export_jsonl(out) == 1
    line = out.read_bytes()[size:]
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    record = orjson.loads(line)
    assert list(record) == LINE_KEYS
    ref = record["payload_ref"]
    if ref is not None:  # a payload over the blob threshold
        assert record["payload"] is None
        assert orjson.loads(bus.blobs.get(ref)) == payload
    assert record == {
        "seq": published.seq, "id": published.id, "ts_ms": ts_ms, "ts": iso(ts_ms),
        "from": from_agent, "to": to, "type": type_, "correlation_id": correlation_id,
        "in_reply_to": in_reply_to, "payload_ref": ref,
        "payload": None if ref is not None else payload,
    }
    assert export_state(bus)[3] == out.stat().st_size


# --- compaction ------------------------------------------------------------------


def later() -> int:
    """A `now` one minute ahead: with keep_days=0 every existing message is old."""
    return now_ms() + 60_000


def test_compact_never_deletes_messages_not_yet_exported(bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "bus.jsonl"
    publish(bus, 10)
    bus.ack("consumer", 10)
    whole = expected_file(bus)
    with JsonlExporter(bus.conn, out) as exporter:
        assert next(exporter.export_batches(batch=4)) == 4
    report = bus.compact(0, now=later())
    assert (report.acked_through, report.messages) == (4, 4)  # only what is exported
    assert [row[0] for row in rows(bus)] == list(range(5, 11))
    assert bus.export_jsonl(out) == 6
    assert out.read_bytes() == whole
    # Now the consumer is the one behind: the exporter counts as one more cursor.
    publish(bus, 5, seed=1)
    assert bus.export_jsonl(out) == 5
    assert bus.compact(0, now=later()).acked_through == 10
    assert [row[0] for row in rows(bus)] == list(range(11, 16))
    bus.ack("consumer", 15)
    assert bus.compact(0, now=later()).messages == 4  # the newest (15) always stays
    assert [row[0] for row in rows(bus)] == [15]
    assert out.read_bytes().count(b"\n") == 15
    assert export_state(bus) == (15, str(out), None, out.stat().st_size)


def test_compact_before_the_first_export_ignores_the_exporter(bus: Bus, tmp_path: Path) -> None:
    # Documented: the exporter counts as a cursor once it has exported something.
    publish(bus, 6)
    bus.ack("consumer", 4)
    assert bus.compact(0, now=later()).messages == 4
    out = tmp_path / "bus.jsonl"
    assert bus.export_jsonl(out) == 2
    assert [orjson.loads(line)["seq"] for line in out.read_bytes().splitlines()] == [5, 6]
    assert_exactly_once(bus, out)


def test_compact_keeps_the_messages_a_crash_left_uncommitted_in_the_file(
        bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "bus.jsonl"
    recorded = exported_bus(bus, out, 5)
    publish(bus, 5, seed=1)
    whole = expected_file(bus)
    new = [format_line(row) for row in rows(bus, 5)]
    # Lines 6 and 7 and half of 8 reached the file; the state still says 5.
    out.write_bytes(recorded + new[0] + new[1] + new[2][:len(new[2]) // 2])
    bus.ack("consumer", 10)
    assert bus.compact(0, now=later()).messages == 5
    assert bus.export_jsonl(out) == 2  # 6-8 adopted or completed, 9-10 exported
    assert out.read_bytes() == whole
