"""The history job on a real standalone Spark cluster: a master and a worker on 127.0.0.1.

Both start from the installed pyspark (`spark-class ... Master` / `Worker`,
as docs/spark.md says), the job's file, found with `bus history
--job-path`, goes in with `spark-submit --master spark://127.0.0.1:PORT`
streams the export into a lake of its own and queries it, and its JSON
lines must equal local mode's; then both processes are stopped. Slow: three JVMs on a small machine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

pyspark = pytest.importorskip("pyspark")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

import io  # noqa: E402

import pyarrow.dataset as ds  # noqa: E402

from bus.history import job  # noqa: E402
from bus.history import queries  # noqa: E402
from bus.history import report  # noqa: E402

from tests.support.history_support import QUICK_JVM  # noqa: E402
from tests.support.history_support import load_script  # noqa: E402
from tests.support.history_support import spark  # noqa: E402,F401 (the fixture)

SPARK_HOME = Path(pyspark.__file__).parent
START_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def spark_class(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A Spark daemon in the foreground, in a process group of its own (to stop it whole)."""
    return subprocess.Popen([str(SPARK_HOME / "bin" / "spark-class"), *args], env=env,
                            stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def alive_workers(ui_port: int) -> int:
    """What the master's own status page says (polled: the worker registers when it can)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=5) as page:
            return int(json.load(page).get("aliveworkers", 0))
    except OSError:
        return 0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[str]:
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOG_DIR": str(tmp_path),
           "SPARK_LOCAL_DIRS": str(tmp_path), "SPARK_WORKER_DIR": str(tmp_path / "work"),
           "SPARK_DAEMON_MEMORY": "256m", "SPARK_NO_DAEMONIZE": "1",
           "SPARK_DAEMON_JAVA_OPTS": QUICK_JVM}
    port, ui_port = free_port(), free_port()
    master_url = f"spark://127.0.0.1:{port}"
    master = spark_class(["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                          "--port", str(port), "--webui-port", str(ui_port)],
                         tmp_path / "master.log", env)
    worker = spark_class(["org.apache.spark.deploy.worker.Worker", master_url, "--host",
                          "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port",
                          str(free_port()), "--work-dir", str(tmp_path / "work")],
                         tmp_path / "worker.log", env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while alive_workers(ui_port) < 1:
            assert master.poll() is None, (tmp_path / "master.log").read_text()[-3000:]
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the worker did not register with the master"
            time.sleep(0.5)
        yield master_url
    finally:
        stop(worker)
        stop(master)
    assert master.poll() is not None and worker.poll() is not None  # both stopped


@pytest.mark.slow
def test_spark_submit_to_a_standalone_cluster_gives_local_modes_results(
        spark: object, cluster: str, tmp_path: Path, bus_command: list[str],
        python_env: dict[str, str]) -> None:
    export = tmp_path / "history"
    assert load_script("gen_history").main(["--out", str(export), "-n", "3000", "--seed", "8",
                                            "--partition-by", "date"]) == 0
    found = subprocess.run([*bus_command, "history", "--job-path"], env=python_env,
                           capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    job_file = Path(found.stdout.strip())
    assert job_file == Path(job.__file__).resolve()
    env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_DIRS": str(tmp_path)}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    submitted = subprocess.run(
        [str(SPARK_HOME / "bin" / "spark-submit"), "--master", cluster,
         "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
         "--conf", "spark.cores.max=1", "--driver-memory", "512m",
         "--driver-java-options", QUICK_JVM,
         str(job_file), "--export", str(export), "--lake", str(tmp_path / "cluster.lake"),
         "--format", "json", "--stuck-after-seconds", "300"],
        env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr[-3000:]
    assert " INFO " not in submitted.stderr  # Spark's INFO lines are off by default
    # The cluster's executors streamed the export into the lake: every message once.
    ids = ds.dataset(tmp_path / "cluster.lake" / "messages", format="parquet",
                     partitioning="hive").to_table().column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 3000
    local = io.StringIO()  # a lake of its own, beside the export
    job.run(spark, str(export), queries.query_names("all"), report.Output("json"),
            queries.Options(stuck_after_seconds=300), out=local)
    on_cluster = [json.loads(line) for line in submitted.stdout.splitlines()]
    assert on_cluster == [json.loads(line) for line in local.getvalue().splitlines()]
    # Each has rows but `blocked`: the generator's workers never report being blocked.
    assert {row["query"] for row in on_cluster} == set(queries.QUERIES) - {"blocked"}
