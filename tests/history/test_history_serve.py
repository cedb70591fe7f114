"""`bus history serve` (a warm Spark Connect server) and a local history session: on 127.0.0.1.

Everything runs through the installed `bus` command in processes of its
own: the server starts in the background, a run over it must print what a
run in a JVM of its own prints, and a state file whose process is gone is
found stale and removed. Slow: two JVMs on a small machine. A local session's JVM, started for one
run, takes the quick compiler unless the launch chose its JVM options.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("grpc")  # the Spark Connect client, in the [spark] extra
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

from bus.history.serve import state_path  # noqa: E402
from bus.history.session import ONE_SHOT_JVM  # noqa: E402
from bus.history.session import server_settings  # noqa: E402

from tests.support.history_support import load_script  # noqa: E402
from tests.support.history_support import spark_env  # noqa: E402,F401 (the fixture)

BUS = [sys.executable, "-m", "bus.cli"]  # as the bus_command fixture runs it


def bus(*args: str, env: dict[str, str], cwd: Path, timeout: float = 600) -> dict | list:
    done = subprocess.run([*BUS, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture
def served(tmp_path: Path, spark_env: dict[str, str]) -> Iterator[Path]:
    db = tmp_path / "bus.db"
    started = bus("--db", str(db), "history", "serve", "--json", env=spark_env, cwd=tmp_path)
    try:
        yield db
    finally:
        bus("--db", str(db), "history", "serve", "--stop", "--json", env=spark_env,
            cwd=tmp_path)
        assert not state_path(db).exists()
        with pytest.raises(ProcessLookupError):
            os.kill(started[0]["pid"], 0)


def listening_addresses(group: int) -> set[str]:
    """The local addresses of the TCP sockets that the processes of `group` listen on,
    as /proc/net/tcp and tcp6 spell them (hex IP:port)."""
    inodes = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != group:
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[len("socket:["):-1])
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue  # gone meanwhile
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                found.add(fields[1])
    return found


LOOPBACK_HEX = ("0100007F:", "0000000000000000FFFF00000100007F:",
                "00000000000000000000000001000000:")  # 127.0.0.1, ::ffff:127.0.0.1, ::1


@pytest.mark.slow
def test_history_over_the_warm_server_gives_the_report_of_a_cold_run(
        served: Path, tmp_path: Path, spark_env: dict[str, str]) -> None:
    export = tmp_path / "bus.jsonl"
    assert load_script("gen_history").main(["--out", str(export), "-n", "3000", "--seed", "8"]) == 0
    status = bus("--db", str(served), "history", "serve", "--status", "--json", env=spark_env,
                 cwd=tmp_path)[0]
    assert status["running"] and status["url"].startswith("sc://127.0.0.1:")
    state = json.loads(state_path(served).read_text())
    assert status["url"] == f"sc://127.0.0.1:{state['port']}"
    # Every port the server's processes listen on is on loopback: Spark Connect's, and a
    # local driver's own (its RPC and block manager).
    listening = listening_addresses(state["pid"])
    assert listening and all(a.startswith(LOOPBACK_HEX) for a in listening), listening
    args = ["history", "--export", str(export), "--json", "--stuck-after-seconds", "300"]
    warm = bus("--db", str(served), *args, "--lake", str(tmp_path / "warm.lake"),
               env=spark_env, cwd=tmp_path)
    cold = bus("--db", str(tmp_path / "other.db"), *args, "--lake", str(tmp_path / "cold.lake"),
               env=spark_env, cwd=tmp_path)
    assert warm == cold and warm
    # The server wrote the warm lake: its log names the app, and its files are there.
    assert (tmp_path / "warm.lake" / "messages").is_dir()
    # Its session has the settings of a local job on local[1] (one shuffle partition...).
    client = subprocess.run(
        [sys.executable, "-c", SERVER_SETTINGS, status["url"], *server_settings("local[1]")],
        env=spark_env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert client.returncode == 0, client.stderr[-2000:]
    assert json.loads(client.stdout) == server_settings("local[1]")


# A client of the warm server: the values of the settings named, as JSON.
SERVER_SETTINGS = """
import json, sys
from bus.history.session import connect_spark
spark = connect_spark(sys.argv[1])
print(json.dumps({key: spark.conf.get(key) for key in sys.argv[2:]}))
"""


@pytest.mark.parametrize(("master", "partitions"), [
    ("local", "1"), ("local[1]", "1"), ("local[4]", "2"), ("local[7,3]", "3"),
    ("local[*]", str(-(-(os.cpu_count() or 1) // 3)))])
def test_a_server_on_a_local_master_gets_the_settings_of_a_local_job(
        master: str, partitions: str) -> None:
    settings = server_settings(master)
    assert settings["spark.sql.shuffle.partitions"] == partitions
    assert settings["spark.sql.adaptive.enabled"] == "false"
    assert settings["spark.driver.bindAddress"] == settings["spark.driver.host"] == "127.0.0.1"


def test_a_server_on_a_local_cluster_keeps_its_driver_on_loopback_only() -> None:
    assert server_settings("local-cluster[2,1,512]") == {
        "spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}


@pytest.mark.parametrize("master", ["spark://127.0.0.1:7077", "yarn"])
def test_a_server_on_a_cluster_keeps_the_clusters_settings(master: str) -> None:
    assert server_settings(master) == {}


def test_a_server_record_whose_process_is_gone_is_stale_and_removed(
        tmp_path: Path, spark_env: dict[str, str]) -> None:
    db = tmp_path / "bus.db"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    state_path(db).write_text(json.dumps({"pid": gone.pid, "port": 1}))
    status = bus("--db", str(db), "history", "serve", "--status", "--json", env=spark_env,
                 cwd=tmp_path)[0]
    assert status == {"running": False, "stale_removed": True}
    assert not state_path(db).exists()


# A local `bus history` session, held open until stdin closes.
LOCAL_SESSION = """
import sys
from bus.history.session import start_spark
spark = start_spark(quiet=sys.argv[1] == "quiet")
print("ready", flush=True)
sys.stdin.read()
spark.stop()
"""


def java_command_line(group: int) -> list[str]:
    """The arguments of the JVM among the processes of `group`."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getpgid(int(pid)) != group:
                continue
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
        if argv and argv[0].endswith(b"java"):
            return [arg.decode() for arg in argv if arg]
    raise AssertionError(f"no JVM in process group {group}")


@contextmanager
def local_session(cwd: Path, env: dict[str, str], quiet: bool = True) -> Iterator[int]:
    """A local `bus history` session held open (quiet: as `bus history` starts it, else
    as the job's file does); its process group."""
    env = {key: value for key, value in env.items() if key != "SPARK_MASTER"}
    # No JVM options chosen by the launch: the session picks its own.
    env["PYSPARK_SUBMIT_ARGS"] = "--conf spark.ui.enabled=false pyspark-shell"
    session = subprocess.Popen([sys.executable, "-c", LOCAL_SESSION, "quiet" if quiet else "loud"],
                               env=env, cwd=cwd,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert session.stdout.readline().strip() == "ready"
        yield session.pid
    finally:
        session.stdin.close()
        session.wait(timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("quiet", [True, False], ids=["bus history", "the job's file"])
def test_a_local_history_session_listens_on_loopback_only_in_a_one_shot_jvm(
        tmp_path: Path, spark_env: dict[str, str], quiet: bool) -> None:
    with local_session(tmp_path, spark_env, quiet) as group:
        listening = listening_addresses(group)
        assert listening and all(a.startswith(LOOPBACK_HEX) for a in listening), listening
        assert set(ONE_SHOT_JVM.split()) <= set(java_command_line(group))


@pytest.mark.slow
def test_jvm_options_from_spark_defaults_are_kept(
        tmp_path: Path, spark_env: dict[str, str]) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.driver.extraJavaOptions -Dagentbus.mine=1\n")
    with local_session(tmp_path, {**spark_env, "SPARK_CONF_DIR": str(conf)}) as group:
        java = java_command_line(group)
        assert "-Dagentbus.mine=1" in java
        assert not set(ONE_SHOT_JVM.split()) & set(java)
