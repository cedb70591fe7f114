"""What the history tests share: the job's modules, one small local Spark, row builders.

Imported by tests/history/test_history*.py after they have skipped where PySpark or
Java is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from datetime import datetime
from datetime import timezone
from pathlib import Path
from types import ModuleType
from typing import Any
from typing import Iterator

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import SparkSession

from bus.history import extract
from bus.history import queries

from tests.conftest import REPO_ROOT

T0 = 1_767_600_000_000  # 2026-01-05T08:00:00.000Z
# A short-lived JVM on a small machine: the C1 compiler alone and the serial
# collector leave the CPU to the work instead of to C2 compile threads; and
# no hsperfdata file in /tmp.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -XX:-UsePerfData"

# What each query means: the functions of the messages, which the lake's answers
# from its smaller tables must equal.
MEANING = {
    "volume": lambda m, o: queries.volume(m),
    "lifecycle": lambda m, o: queries.lifecycle(m),
    "stuck": lambda m, o: queries.stuck(m, o.stuck_after_seconds),
    "threads": lambda m, o: queries.threads(m),
    "silence": lambda m, o: queries.silence(m, o.silence_top),
    "dead_tasks": lambda m, o: queries.dead_tasks(m),
    "lead_time": lambda m, o: queries.lead_time(queries.task_events(m)),
    "blocked": lambda m, o: queries.blocked(queries.task_events(m)),
    "throughput": lambda m, o: queries.throughput(queries.task_events(m)),
}


def load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"script_{name}",
                                                  REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def spark_vars(scratch: Path) -> dict[str, str]:
    """What a `bus history` (or `bus history serve`) process is run with here: a small
    local JVM whose scratch files stay under `scratch`."""
    return {"SPARK_MASTER": "local[1]", "SPARK_LOCAL_DIRS": str(scratch), "TMPDIR": str(scratch),
            "PYSPARK_SUBMIT_ARGS": f"--driver-java-options '-Djava.io.tmpdir={scratch}"
                                   f" {QUICK_JVM}' --conf spark.ui.enabled=false pyspark-shell"}


@pytest.fixture
def spark_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, **spark_vars(tmp_path)}


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    """One small local JVM for the session; its scratch files stay under tmp_path."""
    scratch = tmp_path_factory.mktemp("spark")
    session = (SparkSession.builder.master("local[1]").appName("agentbus-tests")
               .config("spark.sql.shuffle.partitions", "1")
               .config("spark.default.parallelism", "1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.memory", "512m")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.log.level", "ERROR")
               .config("spark.local.dir", str(scratch))
               .config("spark.sql.warehouse.dir", str(scratch / "warehouse"))
               # Tiny data: compiling whole-stage code and re-planning adaptively
               # cost more than they save, so the module runs in half the time.
               .config("spark.sql.codegen.wholeStage", "false")
               .config("spark.sql.adaptive.enabled", "false")
               .config("spark.driver.extraJavaOptions", f"-Djava.io.tmpdir={scratch} {QUICK_JVM}")
               .getOrCreate())
    yield session
    session.stop()


def iso(ts_ms: int) -> str:
    moment = datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ts_ms % 1000:03d}Z"


def msg(seq: int, ts_ms: int, from_agent: str, type_: str, payload: Any = None, *,
        to: str | None = None, corr: str | None = None, reply_to: str | None = None,
        id_: str | None = None) -> tuple:
    """A MESSAGES_SCHEMA row; the payload as the JSON text the extract step yields."""
    text = None if payload is None else json.dumps(payload, separators=(",", ":"))
    return (seq, id_ or f"m{seq}", ts_ms, iso(ts_ms), from_agent, to, type_, corr, reply_to,
            None, text)


def change(seq: int, ts_ms: int, worker: str, task: str, before: str | None, after: str,
           command: str) -> tuple:
    return msg(seq, ts_ms, worker, "state_change",
               {"from": before, "to": after, "command": command}, corr=task)


def messages_df(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, extract.MESSAGES_SCHEMA)


def expected(spark: SparkSession, schema: str, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, schema)
