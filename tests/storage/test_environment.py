"""Bad environments get named errors and change nothing: corrupt, read-only and full databases.

Each test works on real files: a copy with 8 KiB overwritten, a directory
another user cannot write (setpriv to `nobody` when the tests run as root),
a small tmpfs filled to the last byte (root only). Each checks the error
class and message, the CLI's exit code and `Error: ...`, and that the
database file and the blob directory are byte-identical afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import apsw
import pytest

from bus import Bus
from bus.storage import integrity
from bus.storage.db import check_database
from bus.storage.errors import BusReadOnly
from bus.storage.errors import DatabaseCorrupt
from bus.storage.errors import DiskFull
from tests.support.cli_helpers import json_lines
from tests.support.cli_helpers import run

NOBODY = 65534
IS_ROOT = os.geteuid() == 0
BIG = {"text": "x" * 6000}  # over the blob threshold


def make_bus(path: Path, count: int = 300) -> None:
    """A closed bus with `count` messages, one of them in the blob store, and one cursor."""
    with Bus.open(path) as bus:
        bus.publish_many([{"from_agent": "a", "type": "t", "payload": {"n": n, "pad": "p" * 200}}
                          for n in range(count)])
        bus.publish("a", "big", BIG)
        bus.ack("worker", 5)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` (the database, its blobs, an export) with its bytes.

    Not SQLite's -wal and -shm: a reader may create them, empty of data.
    """
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*"))
            if p.is_file() and not p.name.endswith(("-wal", "-shm")) and p.name != "filler"}


# --- a corrupt file -----------------------------------------------------------------------


def corrupt(path: Path) -> None:
    """Overwrite 8 KiB from the middle leaf page of the messages table."""
    conn = apsw.Connection(str(path))
    pages = [p for (p,) in conn.execute(
        "SELECT pageno FROM dbstat WHERE name = 'messages' AND pagetype = 'leaf' ORDER BY pageno")]
    page_size = conn.execute("PRAGMA page_size").get
    conn.close()
    with open(path, "r+b") as f:
        f.seek((pages[len(pages) // 2] - 1) * page_size)
        f.write(b"\xa5" * 8192)


@pytest.fixture
def corrupt_db(tmp_path: Path) -> Path:
    path = tmp_path / "bus.db"
    make_bus(path)
    corrupt(path)
    return path


@pytest.mark.parametrize("args", [
    ["publish", "--from", "a", "--type", "t", "--payload", "{}"],
    ["ack", "--agent", "worker", "--seq", "7"],
    ["poll", "--agent", "worker"],
    ["tail"],
    ["export"],
    ["status"],
    ["init"],
    ["migrate"],
    ["compact", "--keep-days", "0"],
    ["claim", "--task", "t1", "--agent", "a"],
])
def test_corrupt_file_every_command_names_it_and_writes_nothing(corrupt_db: Path, args) -> None:
    before = snapshot(corrupt_db.parent)
    result = run(args, corrupt_db)
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: {corrupt_db} is corrupt (")
    assert "bus check --full" in result.output and ".recover" in result.output
    assert snapshot(corrupt_db.parent) == before


def test_corrupt_file_open_raises_database_corrupt(corrupt_db: Path) -> None:
    before = snapshot(corrupt_db.parent)
    with pytest.raises(DatabaseCorrupt) as caught:
        Bus.open(corrupt_db)
    assert caught.value.path == str(corrupt_db)
    assert snapshot(corrupt_db.parent) == before


def test_corrupt_file_found_by_a_read_refuses_every_later_write(corrupt_db: Path,
                                                                monkeypatch) -> None:
    """A file too large for the check at open: the first CorruptError stops all writes."""
    monkeypatch.setattr(integrity, "QUICK_CHECK_AT_OPEN_MAX", 0)
    before = snapshot(corrupt_db.parent)
    with Bus.open(corrupt_db) as bus:
        with pytest.raises(DatabaseCorrupt, match="is corrupt"):
            bus.poll("worker", 10_000)
        with pytest.raises(DatabaseCorrupt, match="is corrupt"):
            bus.list_messages(0, 10_000)
        with pytest.raises(DatabaseCorrupt, match="found earlier by this process"):
            bus.publish("a", "t", BIG)
        with pytest.raises(DatabaseCorrupt):
            bus.ack("worker", 6)
        with pytest.raises(DatabaseCorrupt):
            bus.claims.claim("t1", "a")
    assert snapshot(corrupt_db.parent) == before


def test_check_reports_a_corrupt_file_and_exits_1(corrupt_db: Path) -> None:
    before = snapshot(corrupt_db.parent)
    for args in (["check"], ["check", "--full"]):
        result = run(args, corrupt_db)
        assert result.exit_code == 1
        assert "problem(s) found" in result.output and "is corrupt" in result.output
    result = run(["check", "--json"], corrupt_db)
    report = json_lines(result.output.splitlines()[0])[0]
    assert report["ok"] is False and report["check"] == "quick_check" and report["problems"]
    assert snapshot(corrupt_db.parent) == before


def test_check_passes_an_intact_bus(db_path: Path) -> None:
    make_bus(db_path, 20)
    assert run(["check"], db_path).output == f"{db_path}: ok (quick_check)\n"
    result = run(["check", "--full", "--json"], db_path)
    assert result.exit_code == 0
    assert json_lines(result.output) == [{"path": str(db_path), "check": "integrity_check",
                                          "ok": True, "problems": []}]


def test_check_database_reports_a_file_too_damaged_to_open(db_path: Path) -> None:
    make_bus(db_path, 20)
    with open(db_path, "r+b") as f:  # page 1 holds sqlite_schema
        f.seek(100)
        f.write(b"\xff" * 4000)
    report = check_database(db_path)
    assert not report.ok and report.problems


# --- a read-only bus ----------------------------------------------------------------------


@pytest.fixture
def shared_dir():
    """A directory outside pytest's private tmp tree, so that another user can reach it."""
    path = Path(tempfile.mkdtemp(prefix="agentbus-ro-"))
    path.chmod(0o755)
    yield path
    for p in [path, *path.rglob("*")]:
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(path)


def run_as_other_user(args: list[str]) -> subprocess.CompletedProcess:
    """Run `python args...` as `nobody` when root (root writes anywhere), else as ourselves."""
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    if not IS_ROOT:
        prefix = []
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run([*prefix, sys.executable, *args], capture_output=True, text=True,
                          env=env, cwd="/", timeout=120)


def bus_cli(db: Path, *args: str) -> subprocess.CompletedProcess:
    return run_as_other_user(["-m", "bus.cli", "--db", str(db), *args])


@pytest.fixture
def read_only_bus(shared_dir: Path) -> Path:
    if IS_ROOT and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot act as another user")
    path = shared_dir / "bus" / "bus.db"
    make_bus(path)
    for p in path.parent.rglob("*"):
        p.chmod(0o555 if p.is_dir() else 0o444)
    path.parent.chmod(0o555)
    return path


@pytest.mark.parametrize("args", [["status"], ["poll", "--agent", "worker"], ["tail", "-n", "2"],
                                  ["sql", "SELECT count(*) AS n FROM messages"], ["check"]])
def test_read_only_bus_reads_work(read_only_bus: Path, args) -> None:
    before = snapshot(read_only_bus.parent)
    result = bus_cli(read_only_bus, *args)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert snapshot(read_only_bus.parent) == before


@pytest.mark.parametrize("args", [["publish", "--from", "a", "--type", "t", "--payload", "{}"],
                                  ["publish", "--from", "a", "--type", "t",
                                   "--payload", '{"text": "' + "y" * 6000 + '"}'],
                                  ["ack", "--agent", "worker", "--seq", "7"],
                                  ["claim", "--task", "t1", "--agent", "a"],
                                  ["export"], ["compact", "--keep-days", "0"]])
def test_read_only_bus_writes_say_why(read_only_bus: Path, args) -> None:
    before = snapshot(read_only_bus.parent)
    result = bus_cli(read_only_bus, *args)
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: {read_only_bus} cannot be written: ")
    assert "is not writable by this user" in result.stderr and "Traceback" not in result.stderr
    assert snapshot(read_only_bus.parent) == before


def test_read_only_bus_reads_beside_the_owner_writing(shared_dir: Path) -> None:
    """The owner has the bus open (its -wal and -shm exist): another user still reads."""
    if IS_ROOT and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot act as another user")
    path = shared_dir / "bus" / "bus.db"
    make_bus(path, 10)
    with Bus.open(path) as owner:
        owner.publish("owner", "live", {"n": 1})
        path.parent.chmod(0o555)
        path.chmod(0o444)
        read = bus_cli(path, "tail", "-n", "1", "--json")
        write = bus_cli(path, "ack", "--agent", "x", "--seq", "1")
    assert read.returncode == 0, read.stderr
    assert json_lines(read.stdout)[0]["type"] == "live"
    assert write.returncode == 1 and "cannot be written" in write.stderr


def test_read_only_bus_from_python(read_only_bus: Path) -> None:
    script = (
        "import sys\n"
        "from bus import Bus\n"
        "from bus.storage.errors import BusReadOnly\n"
        f"bus = Bus.open({str(read_only_bus)!r})\n"
        "print(len(bus.poll('worker', 1000)), bus.last_messages(1)[0].payload == "
        f"{BIG!r})\n"
        "try:\n"
        "    bus.publish('a', 't', {})\n"
        "except BusReadOnly as exc:\n"
        "    print(type(exc).__name__, exc.reason)\n"
    )
    result = run_as_other_user(["-c", script])
    assert result.returncode == 0, result.stderr
    counted, reason = result.stdout.splitlines()
    assert counted == "296 True"
    assert reason.startswith("BusReadOnly the ") and "not writable by this user" in reason


def test_init_in_an_unwritable_directory(shared_dir: Path) -> None:
    if IS_ROOT and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: cannot act as another user")
    locked = shared_dir / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    result = bus_cli(locked / "sub" / "bus.db", "init")
    assert result.returncode == 1
    assert result.stderr.startswith(f"Error: {locked / 'sub' / 'bus.db'} cannot be written: "
                                    f"the directory {locked} is not writable by this user")
    assert list(locked.iterdir()) == []


def test_read_only_mount(tmp_path: Path) -> None:
    mount = tmpfs(tmp_path, "4m")
    make_bus(mount / "bus.db", 20)
    subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
    before = snapshot(mount)
    with Bus.open(mount / "bus.db") as bus:
        assert bus.last_seq() == 21
        with pytest.raises(BusReadOnly, match="is on a read-only filesystem"):
            bus.publish("a", "t", BIG)
    assert snapshot(mount) == before


# --- a full disk --------------------------------------------------------------------------


def tmpfs(tmp_path: Path, size: str) -> Path:
    """A small tmpfs under tmp_path, unmounted at the end of the test (root only)."""
    if not IS_ROOT:
        pytest.skip("mounting a small tmpfs needs root")
    mount = tmp_path / "mnt"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    _mounts.append(mount)
    return mount


_mounts: list[Path] = []


@pytest.fixture(autouse=True)
def _unmount():
    yield
    while _mounts:
        subprocess.run(["umount", "-l", str(_mounts.pop())], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem has no byte left; return it."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096, 1):  # the last bytes of the last page too
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                continue
    finally:
        os.close(fd)
    return filler


@pytest.fixture
def full_disk(tmp_path: Path):
    """(bus, its directory, the filler file): an open bus on a tmpfs with no space left."""
    mount = tmpfs(tmp_path, "4m")
    path = mount / "bus.db"
    make_bus(path, 100)
    bus = Bus.open(path)
    bus.ack("worker", 101)
    bus.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()  # the next write needs space
    filler = fill(mount)
    yield bus, mount, filler
    bus.close()


def test_full_disk_writes_raise_disk_full_and_leave_nothing(full_disk) -> None:
    bus, mount, filler = full_disk
    before = snapshot(mount)
    batch = [{"from_agent": "a", "type": "t", "payload": {"pad": "q" * 3000}}] * 40
    for write in (lambda: bus.publish_many(batch),
                  lambda: bus.publish("a", "big", {"b": "z" * 9000}),
                  lambda: bus.claims.claim("t1", "a"), lambda: bus.compact(0),
                  lambda: bus.export_jsonl()):
        with pytest.raises(DiskFull, match="nothing was written"):
            write()
    after = snapshot(mount)
    assert after.keys() - before.keys() <= {"bus.jsonl"}
    assert after.get("bus.jsonl", b"") in (b"",)  # no torn line
    assert {k: v for k, v in after.items() if k != "bus.jsonl"} == before
    filler.unlink()
    assert bus.publish("a", "t", {"after": "space came back"}).seq == 102
    assert bus.export_jsonl() == 102
    assert check_database(mount / "bus.db", full=True).ok


def test_full_disk_cli_exits_1_without_traceback(full_disk) -> None:
    bus, mount, _filler = full_disk
    big = mount.parent / "big.json"
    big.write_text('{"text": "' + "w" * 300_000 + '"}')
    before = snapshot(mount)
    for args in (["publish", "--from", "a", "--type", "t", "--payload-file", str(big)],
                 ["export"]):
        result = run(args, mount / "bus.db")
        assert result.exit_code == 1
        assert result.output.startswith("Error: no space left for ")
    after = snapshot(mount)
    assert after.pop("bus.jsonl", b"") == b""  # no torn line
    assert after == before
