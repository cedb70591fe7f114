"""The message pump (bus.pump) against raw apsw writing the same rows, in the same run.

- throughput: N requests wait in the inbox; `Pump.run(until_idle=True)`
  routes each (a work unit and a thread row), claims it, runs the pipeline
  and an async handler that answers with one payload, and commits the reply
  envelope (reply row, thread pruned, unit done), committing 1 or up to 64
  finished units per transaction. Envelopes/s = replies / wall time. The
  baseline is raw apsw inserting the same reply rows, 1 or 64 per
  BEGIN IMMEDIATE transaction: what the commit alone costs.
- round trip: a client sends one request and waits for its reply, one at a
  time, with the pump running in another process (woken by the commit, via
  inotify) and in a thread of this process. The baseline is raw apsw making
  the same three commits, woken the same way (`bus.log.wake.ChangeWatcher`), its
  server in another process or a thread alike: the client writes the
  request and its inbox row; the server takes the row and claims the work
  (one commit), then writes the reply and marks the work done (another).

- the floor (scripts/pump_floor.py), under each row: the statements of a
  request answered inline, alone, in straight-line apsw (no pump, no XML
  work), with its ratio to the same baseline. A target above the floor's
  ratio asks more than any pump writing these rows could give.

- --original: the same echo workload through the original in-memory pump,
  xml-pipeline 0.4.0 from PyPI (scripts/bench_original_pump.py, in a venv of
  its own under /tmp, made on first use; skipped with a message when pip
  cannot install it), its figures printed beside ours from the same run.

- pipelines (--scenario pipelines): where the pump runs each unit's pipeline
  (`checked_input`: parse, C14N, XSD, deserialize), for 1 and 4 listeners
  of one root tag (each request a broadcast) and payloads from 236 B to 64
  KB that the XSD checks: on the event loop (as before), on one worker off
  the loop, on a shared pool of 4, on a worker per listener, and the
  default (a worker per listener from MIN_BYTES up). The modes alternate
  in each round; ratios: envelopes/s (best round) and CPU per envelope (all
  threads, least round) against on the loop, same size. Then whether each
  pipeline step releases the GIL (a spinning thread beside it, `gil_rows`).

    python scripts/bench_pump.py [--rounds 3] [--scale 1.0] [--original]
    python scripts/bench_pump.py --scenario pipelines [--rounds 3] [--scale 1.0]
    python scripts/bench_pump.py --raw-server DB   # the baseline's server, on its own
    python scripts/bench_pump.py --floor-server DB # the floor's server, on its own
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import apsw
import orjson

from bus import Bus
from bus.storage.db import write_transaction
from bus.log.messages import _INSERT_SQL
from bus.log.messages import new_message_id
from bus.log.messages import now_ms
from bus.pump import Pump
from bus.pump import client
from bus.pump.organism import Organism
from bus.pump.organism import load_organism
from bus.pump.pipelines import MIN_BYTES
from bus.pump.pipelines import Pipelines
from bus.log.wake import ChangeWatcher

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pump_floor  # noqa: E402 - beside this file (put on sys.path just above)

REPO_ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = REPO_ROOT / "examples"
# Issue 21's targets, as ratios to the baselines of the same run:
# (inline, per transaction) -> envelopes/s against raw apsw inserting the replies.
TARGET_RATIOS = {(True, 1): 0.5, (False, 1): 0.3, (True, 64): 0.25, (False, 64): 0.25}
TARGET_P50_RATIO = 2.0  # round trip p50 <= 2x the raw three-commit round trip
TARGET_P99_MS = 3.0
# Against the original in-memory pump, in the same run.
ORIGINAL = "xml-pipeline==0.4.0"
ORIGINAL_EXTRAS = ("python-dotenv",)  # its bootstrap imports dotenv, which it does not declare
ORIGINAL_VENV = Path(tempfile.gettempdir()) / "agentbus-bench-xml-pipeline-0.4.0"
TARGET_ORIGINAL_SPEEDUP = 3.0  # our envelopes/s >= 3x its
TARGET_ORIGINAL_P50 = 0.8  # our round trip p50 <= 0.8x its
REQUEST = b"<add><a>1.5</a><b>2</b></add>"
ORGANISM = """\
name: bench
listeners:
  - name: calculator
    root_tag: add
    payload: example_tools:Add
    handler: example_tools:add
    concurrency: 64
"""
# The same listener declared fast: a plain function answered in the routing transaction.
INLINE_ORGANISM = ORGANISM.replace("example_tools:add", "example_tools:add_now") \
    + "    inline: true\n"


def pump_rows(workdir: Path, rounds: int = 3, scale: float = 1.0) -> list[dict]:
    sys.path.insert(0, str(EXAMPLES))  # example_tools, as `bus pump run` finds it
    leased = workdir / "bench-organism.yaml"
    leased.write_text(ORGANISM)
    inline = workdir / "bench-inline-organism.yaml"
    inline.write_text(INLINE_ORGANISM)
    count = max(200, int(2000 * scale))
    rows = [throughput_row(workdir, organism, count, batch, rounds)
            for organism in (leased, inline) for batch in (1, 64)]
    trips = max(50, int(300 * scale))
    for organism in (leased, inline):
        rows.append(round_trip_row(workdir, organism, trips, in_process=False))
        rows.append(round_trip_row(workdir, organism, trips, in_process=True))
    return rows


def throughput_row(workdir: Path, organism: Path, count: int, batch: int, rounds: int) -> dict:
    best_pump = best_raw = best_floor = 0.0
    inline = organism.name.startswith("bench-inline")
    for round_ in range(rounds):
        path = workdir / f"pump-{organism.stem}-{batch}-{round_}.db"
        with Bus.open(path) as bus:
            run = _inline_throughput if inline else _leased_throughput
            elapsed = run(bus, load_organism(organism), count, batch)
            reply_xml = bus.last_messages(1)[0].payload
        best_pump = max(best_pump, count / elapsed)
        best_raw = max(best_raw, raw_replies(workdir / f"raw-{batch}-{round_}.db", count, batch,
                                             reply_xml))
        best_floor = max(best_floor, pump_floor.floor_replies(
            workdir / f"floor-{organism.stem}-{batch}-{round_}.db", count, batch,
            time.perf_counter))
    ratio = best_pump / best_raw
    target = TARGET_RATIOS[inline, batch]
    return {"case": f"pump {'inline' if inline else 'leased'} envelopes/s, {batch} per txn",
            "messages": count, "raw_per_s": round(best_raw), "agentbus_per_s": round(best_pump),
            "ratio": round(ratio, 3), "unit": "envelopes/s", "target_ratio": target,
            "ok": ratio >= target, "floor_per_s": round(best_floor),
            "floor_ratio": round(best_floor / best_raw, 3)}


def _leased_throughput(bus: Bus, organism: Organism, count: int, batch: int) -> float:
    """Seconds to answer `count` requests that wait for a starting pump (which leases
    them all: a restarted pump cannot tell whether one of them killed its predecessor)."""
    for _ in range(count):
        client.send(bus, "bench", REQUEST, to="calculator")
    pump = Pump(bus, organism, oob=False, commit_batch=batch)
    start = time.perf_counter()
    stats = pump.run(until_idle=True)
    elapsed = time.perf_counter() - start
    assert stats.outcomes == {"replied": count}, stats.outcomes
    return elapsed


def _inline_throughput(bus: Bus, organism: Organism, count: int, batch: int) -> float:
    """Seconds from the commit of `count` requests to a running pump's last answer."""
    booted, answered = threading.Event(), threading.Event()

    def settled(done: object, outcome: str) -> None:  # on the pump's database thread
        # Only the first and the last unit wake this thread: a wake per unit took
        # the GIL from the pump each time.
        total = sum(pump.stats.outcomes.values())  # this unit included
        if total == 1:
            booted.set()
        elif total == count + 1:
            answered.set()
    pump = Pump(bus, organism, oob=False, commit_batch=batch, on_unit=settled)
    thread = threading.Thread(target=pump.run, daemon=True)
    thread.start()
    try:
        # The warm-up request: answered once `booted` is set. Not awaited with
        # client.wait_replies, whose watcher would stay on this thread's connection
        # and cost each of the pump's commits an inotify event per WAL write.
        warm_up = client.send(bus, "bench", REQUEST)
        if not booted.wait(30):
            raise SystemExit("the pump did not answer its first request within 30 s")
        assert client.replies(bus, warm_up), "the warm-up request has no reply"
        with write_transaction(bus.conn):
            for _ in range(count):
                client.send(bus, "bench", REQUEST, to="calculator")
        start = time.perf_counter()
        answered.wait()
        elapsed = time.perf_counter() - start
    finally:
        pump.stop()
        thread.join()
    assert pump.stats.outcomes == {"replied": count + 1}, pump.stats.outcomes
    return elapsed


def raw_replies(path: Path, count: int, batch: int, payload: object) -> float:
    """Raw apsw inserting `count` reply rows like the pump's, `batch` per transaction."""
    Bus.open(path).close()  # the same schema and pragmas
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(5000)
    conn.execute("PRAGMA synchronous = NORMAL")
    text = orjson.dumps(payload).decode()
    thread, request = new_message_id(), new_message_id()
    start = time.perf_counter()
    for first in range(0, count, batch):
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(first, min(first + batch, count)):
            conn.execute(_INSERT_SQL, (new_message_id(), now_ms(), "calculator", "@bench",
                                       "envelope", thread, request, text, None)).get
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return count / elapsed


def round_trip_row(workdir: Path, organism: Path, trips: int, in_process: bool) -> dict:
    where = "thread" if in_process else "process"
    kind = "inline" if organism.name.startswith("bench-inline") else "leased"
    path = workdir / f"trip-{kind}-{where}.db"
    with Bus.open(path) as bus:
        stop = _start_pump(bus, path, organism, in_process)
        try:
            def trip() -> None:
                got = client.wait_replies(bus, client.send(bus, "bench", REQUEST), timeout=30)
                assert got and got[0].root_tag == "sum", got
            latencies = _latencies(trip, trips)
        finally:
            stop()
    raw = raw_round_trips(workdir / f"raw-trip-{where}.db", trips, in_process)
    floor = floor_round_trips(workdir / f"floor-trip-{kind}-{where}.db", trips, in_process)
    p50, raw_p50 = statistics.median(latencies), statistics.median(raw)
    p99 = _p99(latencies)
    return {"case": f"round trip {kind}, pump in a{'' if in_process else 'nother'} {where}",
            "messages": trips, "p50_ms": round(p50, 3), "p99_ms": round(p99, 3),
            "raw_p50_ms": round(raw_p50, 3), "raw_p99_ms": round(_p99(raw), 3),
            "ratio": round(p50 / raw_p50, 3), "target_ratio": TARGET_P50_RATIO,
            "target_p99_ms": TARGET_P99_MS,
            "ok": p50 <= TARGET_P50_RATIO * raw_p50 and p99 <= TARGET_P99_MS,
            "floor_p50_ms": round(statistics.median(floor), 3), "floor_p99_ms": round(_p99(floor), 3),
            "floor_ratio": round(statistics.median(floor) / raw_p50, 3)}


def _latencies(trip: Callable[[], None], trips: int) -> list[float]:
    """Milliseconds per `trip()`, one at a time, after one to warm up."""
    trip()
    latencies = []
    for _ in range(trips):
        start = time.perf_counter()
        trip()
        latencies.append((time.perf_counter() - start) * 1000)
    return latencies


def _p99(latencies: list[float]) -> float:
    return sorted(latencies)[max(0, int(len(latencies) * 0.99) - 1)]


def _start_pump(bus: Bus, path: Path, organism: Path, in_process: bool):
    if in_process:
        pump = Pump(bus, load_organism(organism), oob=False)
        thread = threading.Thread(target=pump.run, daemon=True)
        thread.start()
        return lambda: (pump.stop(), thread.join())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(EXAMPLES)]))
    process = subprocess.Popen([sys.executable, "-m", "bus.cli", "--db", str(path), "pump",
                                "run", str(organism), "--no-oob"], env=env,
                               stdout=subprocess.DEVNULL)
    return lambda: (process.terminate(), process.wait())


# --- the round trip's baseline: raw apsw, the same commits, the same wake -------------

_RAW_REQUEST = orjson.dumps({"xml": REQUEST.decode()}).decode()
_RAW_REPLY = orjson.dumps({"xml": "<sum>3.5</sum>"}).decode()


def _raw_conn(path: Path) -> apsw.Connection:
    conn = apsw.Connection(str(path))
    conn.set_busy_timeout(5000)
    conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def raw_round_trips(path: Path, trips: int, in_process: bool) -> list[float]:
    Bus.open(path).close()  # the same schema and pragmas
    stop = _start_server(path, in_process, "--raw-server", raw_server)
    conn = _raw_conn(path)
    watcher = ChangeWatcher(conn, path)

    def trip() -> None:
        thread = new_message_id()
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_INSERT_SQL, (new_message_id(), now_ms(), "console", "@bench", "envelope",
                                   thread, None, _RAW_REQUEST, None)).get
        seq = conn.last_insert_rowid()
        conn.execute("INSERT INTO pump_inbox (seq, organism, root_tag, created_at_ms)"
                     " VALUES (?, 'bench', 'add', ?)", (seq, now_ms()))
        conn.execute("COMMIT")
        while not conn.execute("SELECT 1 FROM messages WHERE correlation_id = ? AND seq > ?",
                               (thread, seq)).fetchall():
            watcher.wait(1.0)

    try:
        return _latencies(trip, trips)
    finally:
        stop()
        watcher.close()
        conn.close()


def floor_round_trips(path: Path, trips: int, in_process: bool) -> list[float]:
    """The floor's round trip (scripts/pump_floor.py): the client's commit, then the
    pump's, with the statements alone."""
    conn, root_id = pump_floor.open_floor(path)
    stop = _start_server(path, in_process, "--floor-server", pump_floor.floor_server)
    watcher = ChangeWatcher(conn, path)
    try:
        return _latencies(lambda: pump_floor.floor_trip(conn, watcher, root_id), trips)
    finally:
        stop()
        watcher.close()
        conn.close()


def _start_server(path: Path, in_process: bool, flag: str,
                  server: Callable[[Path, Callable[[], bool]], None]) -> Callable[[], None]:
    """`server(path, stopped)` in a thread, or this script with `flag path` in a process;
    its stop."""
    if in_process:
        stopped = threading.Event()
        thread = threading.Thread(target=server, args=(path, stopped.is_set), daemon=True)
        thread.start()
        return lambda: (stopped.set(), thread.join())
    process = subprocess.Popen([sys.executable, __file__, flag, str(path)],
                               env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
    return lambda: (process.terminate(), process.wait())


def raw_server(path: Path, stopped: Callable[[], bool] = lambda: False) -> None:
    """Answer every inbox row: claim it in one commit, reply in the next."""
    conn = _raw_conn(path)
    watcher = ChangeWatcher(conn, path)
    while not stopped():
        watcher.wait(0.05)
        conn.execute("BEGIN IMMEDIATE")
        taken = conn.execute("DELETE FROM pump_inbox RETURNING seq").fetchall()
        for (seq,) in taken:
            conn.execute("INSERT INTO pump_work (organism, input_seq, listener, kind, thread,"
                         " attempts, max_attempts, lease_owner, lease_until_ms, created_at_ms)"
                         " VALUES ('bench', ?, 'calculator', 'call', '', 1, 3, 'raw', ?, ?)",
                         (seq, now_ms() + 30_000, now_ms()))
        conn.execute("COMMIT")
        for (seq,) in taken:
            thread, request_id = conn.execute(
                "SELECT correlation_id, id FROM messages WHERE seq = ?", (seq,)).fetchone()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_INSERT_SQL, (new_message_id(), now_ms(), "calculator", "@bench",
                                       "envelope", thread, request_id, _RAW_REPLY, None)).get
            conn.execute("UPDATE pump_work SET status = 'done' WHERE input_seq = ?", (seq,))
            conn.execute("COMMIT")
    watcher.close()
    conn.close()


def print_rows(rows: list[dict]) -> None:
    """Envelopes/s rows: ratio = ours / raw (higher is better); round trips: ratio = our
    p50 / raw p50 (lower is better). Under each, the floor (scripts/pump_floor.py) with
    its ratio to the same raw baseline: no pump doing this work can do better."""
    print(f"{'pump':44} {'n':>6} {'baseline':>11} {'agentbus':>11} {'ratio':>7}  target")
    for r in rows:
        verdict = "ok" if r["ok"] else "not met"
        if "p50_ms" in r:
            print(f"{r['case']:44} {r['messages']:>6} {'p50 ' + str(r['raw_p50_ms']):>11}"
                  f" {'p50 ' + str(r['p50_ms']):>11} {r['ratio']:>7}  p50 <= "
                  f"{r['target_ratio']:g}x raw, p99 <= {r['target_p99_ms']:g} ms: {verdict}")
            print(f"{'':44} {'':>6} {'p99 ' + str(r['raw_p99_ms']):>11}"
                  f" {'p99 ' + str(r['p99_ms']):>11}")
            print(f"{'  floor: the statements alone':44} {'':>6} {'':>11}"
                  f" {'p50 ' + str(r['floor_p50_ms']):>11} {r['floor_ratio']:>7}"
                  f"  p99 {r['floor_p99_ms']} ms")
        else:
            print(f"{r['case']:44} {r['messages']:>6} {r['raw_per_s']:>11}"
                  f" {r['agentbus_per_s']:>11} {r['ratio']:>7}  >= {r['target_ratio']:g}x raw:"
                  f" {verdict}")
            reach = "within" if r["floor_ratio"] >= r["target_ratio"] else "beyond"
            print(f"{'  floor: the statements alone':44} {'':>6} {'':>11}"
                  f" {r['floor_per_s']:>11} {r['floor_ratio']:>7}  the target is {reach} it")


# --- the original in-memory pump (xml-pipeline 0.4.0) ---------------------------------


def original_python() -> Path | None:
    """The Python of a venv holding xml-pipeline 0.4.0 (made on first use); None, with
    the reason on stderr, when it cannot be made."""
    python = ORIGINAL_VENV / "bin" / "python"
    ready = ORIGINAL_VENV / ".installed"
    if ready.exists():
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", str(ORIGINAL_VENV)], check=True,
                       capture_output=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", ORIGINAL,
                        *ORIGINAL_EXTRAS], check=True, capture_output=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as exc:
        output = getattr(exc, "stderr", b"") or b""
        print(f"--original skipped: cannot install {ORIGINAL} into {ORIGINAL_VENV}: {exc}"
              f" {output.decode(errors='replace')[-500:]}", file=sys.stderr)
        return None
    ready.touch()
    return python


def original_row(python: Path, scale: float) -> dict | None:
    """Its envelopes/s and round trip (scripts/bench_original_pump.py); None if it failed."""
    count, trips = max(200, int(2000 * scale)), max(50, int(300 * scale))
    done = subprocess.run([str(python), str(REPO_ROOT / "scripts" / "bench_original_pump.py"),
                           "--count", str(count), "--trips", str(trips)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        print(f"--original failed (exit {done.returncode}): {done.stderr[-1000:]}",
              file=sys.stderr)
        return None
    return json.loads(done.stdout.splitlines()[-1])


def print_original(rows: list[dict], original: dict) -> None:
    print(f"\noriginal xml-pipeline 0.4.0 (in memory), same run: {original['per_s']:.0f}"
          f" requests answered/s, round trip p50 {original['p50_ms']:.3f} ms,"
          f" p99 {original['p99_ms']:.3f} ms")
    for r in rows:
        if "p50_ms" in r:
            ratio = r["p50_ms"] / original["p50_ms"]
            ok = ratio <= TARGET_ORIGINAL_P50
            print(f"  {r['case']:44} p50 {ratio:6.2f}x the original's"
                  f"  (<= {TARGET_ORIGINAL_P50:g}x: {'ok' if ok else 'not met'})")
        else:
            ratio = r["agentbus_per_s"] / original["per_s"]
            ok = ratio >= TARGET_ORIGINAL_SPEEDUP
            print(f"  {r['case']:44} {ratio:6.2f}x the original's envelopes/s"
                  f"  (>= {TARGET_ORIGINAL_SPEEDUP:g}x: {'ok' if ok else 'not met'})")


# --- pipelines side by side (seed 000): where checked_input runs ---------------------

PIPELINE_LISTENERS = 4
# (name, lines, characters per line): the envelope is about lines * (chars + 30) bytes.
PIPELINE_SIZES = (("small", 3, 20), ("2 KB", 20, 70), ("16 KB", 60, 240), ("64 KB", 120, 500))


def pipeline_organism(listeners: int) -> str:
    """`listeners` listeners of <doc> (a payload the XSD checks: not plain): a broadcast."""
    entries = "".join(f"  - name: reader{i}\n    root_tag: doc\n"
                      "    payload: bench_pipeline_tools:Doc\n"
                      "    handler: bench_pipeline_tools:read\n    concurrency: 64\n"
                      for i in range(listeners))
    return f"name: bench\nlisteners:\n{entries}"


def pipeline_request(lines: int, width: int) -> bytes:
    items = "".join(f"<item><number>{n}</number><text>{'x' * width}</text></item>"
                    for n in range(lines))
    return f"<doc><title>bench</title><line>{items}</line></doc>".encode()


def _pipeline_modes() -> dict[str, Callable[[], Pipelines]]:
    """Where the pump runs checked_input: today's default, and what it was chosen against."""

    class OneWorker(Pipelines):  # every listener's pipelines on one thread off the loop
        def _worker(self, name: str) -> ThreadPoolExecutor:
            return super()._worker("*")

    class SharedPool(Pipelines):  # a pool of 4 threads for all (per-listener order lost)
        def _worker(self, name: str) -> ThreadPoolExecutor:
            if "*" not in self._workers:
                self._workers["*"] = ThreadPoolExecutor(4, thread_name_prefix="bench-pool")
            return self._workers["*"]

    return {"on the loop (before)": lambda: Pipelines(min_bytes=1 << 62),
            "one worker off the loop": lambda: OneWorker(min_bytes=0),
            "shared pool of 4": lambda: SharedPool(min_bytes=0),
            "a worker per listener": lambda: Pipelines(min_bytes=0),
            f"per listener, >= {MIN_BYTES} B (default)": Pipelines}


def pipeline_rows(workdir: Path, rounds: int = 3, scale: float = 1.0) -> list[dict]:
    """Envelopes/s of each mode, per payload size, best of `rounds` alternating runs."""
    (workdir / "bench_pipeline_tools.py").write_text(PIPELINE_TOOLS)
    sys.path.insert(0, str(workdir))
    modes = _pipeline_modes()
    rows = []
    for listeners in (1, PIPELINE_LISTENERS):
        organism = workdir / f"pipelines-{listeners}.yaml"
        organism.write_text(pipeline_organism(listeners))
        for size, lines, width in PIPELINE_SIZES:
            request = pipeline_request(lines, width)
            count = max(50, int(400 * scale))
            best = dict.fromkeys(modes, 0.0)
            cpu = {mode: float("inf") for mode in modes}
            for round_ in range(rounds):
                for index, (mode, make) in enumerate(modes.items()):
                    path = workdir / f"pipelines-{listeners}-{lines}-{round_}-{index}.db"
                    with Bus.open(path) as bus:
                        elapsed, used = _pipeline_throughput(
                            bus, load_organism(organism), request, count, listeners, make())
                    best[mode] = max(best[mode], count * listeners / elapsed)
                    cpu[mode] = min(cpu[mode], used / (count * listeners))
            before, before_cpu = best["on the loop (before)"], cpu["on the loop (before)"]
            for mode, per_s in best.items():
                rows.append({"case": f"{listeners} listener(s), {size} ({len(request)} B)",
                             "mode": mode, "envelopes": count * listeners,
                             "per_s": round(per_s), "ratio": round(per_s / before, 3),
                             "cpu_us": round(cpu[mode] * 1e6, 1),
                             "cpu_ratio": round(cpu[mode] / before_cpu, 3)})
    return rows


def _pipeline_throughput(bus: Bus, organism: Organism, request: bytes, count: int,
                         listeners: int, pipelines: Pipelines) -> tuple[float, float]:
    """Wall and CPU seconds (all the process's threads) of a pump answering the requests."""
    for _ in range(count):
        client.send(bus, "bench", request)
    pump = Pump(bus, organism, oob=False)
    pump._pipelines = pipelines  # the mode under test (bus/pump/pipelines.py)
    start, cpu = time.perf_counter(), time.process_time()
    stats = pump.run(until_idle=True)
    elapsed, used = time.perf_counter() - start, time.process_time() - cpu
    assert stats.outcomes == {"replied": count * listeners}, stats.outcomes
    return elapsed, used


def print_pipeline_rows(rows: list[dict]) -> None:
    """Envelopes/s (best round) and CPU us per envelope, all threads (least round), each
    with its ratio to the pipelines on the loop: the wall clock shows what running side
    by side gained, the CPU time what the hops cost (the same on a loaded machine)."""
    print(f"\n{'pipelines: ratios against on the loop, same size':44} {'mode':34}"
          f" {'n':>5} {'env/s':>7} {'ratio':>6} {'cpu us':>7} {'ratio':>6}")
    for r in rows:
        print(f"{r['case']:44} {r['mode']:34} {r['envelopes']:>5} {r['per_s']:>7}"
              f" {r['ratio']:>6} {r['cpu_us']:>7} {r['cpu_ratio']:>6}")


def gil_rows(workdir: Path, calls: int = 10, interval: float = 0.05) -> list[dict]:
    """Whether each pipeline step of the largest payload lets another thread run.

    With a switch interval of `interval` and a thread spinning beside it, a call
    that releases the GIL waits for the spinner to give it back: `calls` calls
    take about calls x interval (share 1.0). A call that keeps the GIL runs
    through (share near 0): threads cannot run two of those at once. Time here
    is the verdict's scale, not a measurement of speed.
    """
    sys.path.insert(0, str(workdir))
    from bench_pipeline_tools import Doc  # written by pipeline_rows
    from bus.xml.parser import canonicalize
    from bus.xml.parser import parse
    request = pipeline_request(*PIPELINE_SIZES[-1][1:])
    spec, root = Doc.__xmlify__, parse(request)
    steps = {"parse (hardened parser)": lambda: parse(request),
             "C14N": lambda: canonicalize(root), "payload XSD": lambda: spec.validate(root),
             "decode to the dataclass": lambda: spec.decode(root),
             "time.sleep(0.0001), for scale": lambda: time.sleep(0.0001)}
    rows, before = [], sys.getswitchinterval()
    sys.setswitchinterval(interval)
    try:
        for name, step in steps.items():
            stop = []
            spinner = threading.Thread(target=_spin, args=(stop,))
            spinner.start()
            start = time.perf_counter()
            for _ in range(calls):
                step()
            share = (time.perf_counter() - start) / (calls * interval)
            stop.append(True)
            spinner.join()
            rows.append({"step": name, "share": round(share, 2),
                         "gil": "released" if share > 0.5 else "kept"})
    finally:
        sys.setswitchinterval(before)
    return rows


def _spin(stop: list) -> None:
    while not stop:  # bytecode only: the GIL changes hands at the switch interval
        pass


def print_gil_rows(rows: list[dict]) -> None:
    print("\npipeline steps beside a spinning thread (share ~1: the GIL is released):")
    for r in rows:
        print(f"  {r['step']:32} {r['share']:>6}  {r['gil']}")


PIPELINE_TOOLS = '''
from __future__ import annotations

from dataclasses import dataclass

from bus.pump import Reply
from bus.xml import xmlify


@xmlify(root="line")
@dataclass
class Line:
    number: int
    text: str


@xmlify(root="doc")
@dataclass
class Doc:
    """A document of numbered lines: its XSD checks every line."""

    title: str
    line: list[Line]


@xmlify(root="read")
@dataclass
class Read:
    lines: int


async def read(msg: Doc, ctx) -> Reply:
    return Reply(Read(len(msg.line)))
'''


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--original", action="store_true",
                        help=f"also run the workload through {ORIGINAL} (pip-installed under"
                             " /tmp) and print its figures beside ours")
    parser.add_argument("--scenario", choices=("pump", "pipelines", "all"), default="pump",
                        help="pump: the rows above (default); pipelines: where the pipelines"
                             " run, by payload size and listeners; all: both")
    parser.add_argument("--raw-server", type=Path, metavar="DB",
                        help="run the round trip baseline's server on DB until terminated")
    parser.add_argument("--floor-server", type=Path, metavar="DB",
                        help="run the round trip floor's server on DB until terminated")
    args = parser.parse_args(argv)
    if args.raw_server:
        raw_server(args.raw_server)
        return 0
    if args.floor_server:
        pump_floor.floor_server(args.floor_server)
        return 0
    python = original_python() if args.original else None
    workdir = Path(tempfile.mkdtemp(prefix="agentbus-bench-pump-"))
    rows, pipelines = [], []
    try:
        if args.scenario in ("pump", "all"):
            rows = pump_rows(workdir, args.rounds, args.scale)
        if args.scenario in ("pipelines", "all"):
            pipelines = pipeline_rows(workdir, args.rounds, args.scale)
            gil = gil_rows(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    original = original_row(python, args.scale) if python is not None and rows else None
    if rows:
        print_rows(rows)
    if original is not None:
        print_original(rows, original)
    if pipelines:
        print_pipeline_rows(pipelines)
        print_gil_rows(gil)
    return 0  # a missed target is a figure to read, not an error


if __name__ == "__main__":
    sys.exit(main())
