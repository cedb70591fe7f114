"""The Spark session of the history job: master, log level, tuning."""

from __future__ import annotations

import math
import os
import re
import sys
import tempfile
from contextlib import contextmanager
from typing import Any
from typing import Callable
from typing import Iterator

from pyspark import SparkConf
from pyspark import SparkContext
from pyspark.sql import SparkSession

APP_NAME = "agentbus-history"
QUERY_THREADS = 3  # the job's queries in flight at once (job.compute)
# A local job's JVM lives for one run, most of it spent compiling Spark's
# engine on the cores its tasks need: the quick compiler alone and the
# throughput collector make the cold 1M-message run about a fifth shorter
# (docs/benchmarks.md). A long-lived JVM (`bus history serve`) keeps the
# defaults, whose slower compiler pays off over many runs.
ONE_SHOT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC"
# A local Spark's driver listens too (its RPC and block manager), on the machine's
# address unless told: on one machine nothing from elsewhere needs it. A cluster's
# executors must reach the driver, so there it is left be.
LOOPBACK_DRIVER = {"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"}
QUIET_LOG_LEVEL = "WARN"  # Spark's INFO lines are for debugging Spark, not for reading history


def start_spark(quiet: bool = False) -> SparkSession:
    """The active session, or a new one.

    No master is set when spark-submit (or spark-defaults.conf) gives one;
    otherwise SPARK_MASTER, else local[*]. On a local master a few SQL
    settings suit one machine better (tune_for_one_machine). `quiet` keeps
    the JVM's start-up chatter (log4j banners, native-library warnings) off
    the terminal: the JVM's stderr goes to an anonymous file that is shown
    only if Java fails to start. The progress bar is always off, and the log
    level WARN unless the launch sets spark.log.level.
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        active.conf.set("spark.sql.session.timeZone", "UTC")
        return active
    builder = (SparkSession.builder.appName(APP_NAME)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.showConsoleProgress", "false"))
    master = _configured_master()
    if master is not None:
        builder = builder.master(master)
    launch = {}  # what the JVM must be started with: set before it starts, or never
    if master is not None and master.startswith("local"):
        launch |= LOOPBACK_DRIVER
        if not _java_options_given():
            launch["spark.driver.extraJavaOptions"] = ONE_SHOT_JVM
    for key, value in launch.items():
        builder = builder.config(key, value)
    if quiet:
        builder = builder.config("spark.log.level", "ERROR")
        with _jvm_stderr_captured() as captured:
            try:
                spark = builder.getOrCreate()
            except Exception as exc:
                raise SparkStartError(captured()) from exc
    else:
        spark = builder.config("spark.log.level", _log_level(launch)).getOrCreate()
    tune_for_one_machine(spark)
    return spark


def connect_spark(url: str) -> SparkSession:
    """A new Spark Connect session on the server at `url` (sc://HOST:PORT), in UTC.

    New, not the process's last one: a long-lived caller (the console) may
    find the server restarted at another port. The server (`bus history
    serve`) keeps its JVM and its settings; the session's time zone is set
    here, as start_spark sets a local one's.
    """
    spark = SparkSession.builder.remote(url).create()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def tune_for_one_machine(spark: SparkSession) -> None:
    """On a local master, the SQL settings of one_machine_settings (unless set already)."""
    context = spark.sparkContext
    if not context.master.startswith("local"):
        return
    given = context.getConf()
    for key, value in one_machine_settings(context.defaultParallelism).items():
        if not given.contains(key):
            spark.conf.set(key, value)


def one_machine_settings(parallelism: int) -> dict[str, str]:
    """SQL settings that suit one small machine of `parallelism` cores.

    Spark's defaults are for clusters: 200 shuffle partitions are 200 tasks
    per stage, run a few at a time here. The job runs QUERY_THREADS queries
    at once, so each query's shuffle gets about cores / QUERY_THREADS of the
    cores: one partition each (two on 6 cores...), as any more only add
    tasks (on 2 cores, 8 partitions cost the six queries 3-5 CPU s more
    than 1, measured in docs/benchmarks.md). 128 MB file splits make a 300 MB
    export 3 tasks on 2 cores (one idles for the last third); compressing
    a cache costs more CPU than the 20% of memory it saves. Adaptive
    execution re-plans each query after every shuffle, which costs the
    driver more than it saves on results of a few thousand rows, and its
    coalescing leaves the largest stage (silence's window) 3 tasks on 2
    cores.
    """
    return {
        "spark.sql.shuffle.partitions": str(math.ceil(parallelism / QUERY_THREADS)),
        "spark.sql.files.maxPartitionBytes": "32m",
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        "spark.sql.adaptive.enabled": "false",
    }


def server_settings(master: str) -> dict[str, str]:
    """What a warm server on `master` is started with: on a local master the loopback
    driver and, for `local`, `local[N]`, `local[*]` or `local[N,F]`, one_machine_settings;
    nothing on a cluster's."""
    if not master.startswith("local"):
        return {}
    found = re.fullmatch(r"local(?:\[(\d+|\*)(?:,\d+)?\])?", master)
    if found is None:  # local-cluster[N,C,M]: executors of their own, on this machine
        return dict(LOOPBACK_DRIVER)
    cores = found[1] or "1"  # `local` is one core
    return {**LOOPBACK_DRIVER,
            **one_machine_settings((os.cpu_count() or 1) if cores == "*" else int(cores))}


def _log_level(launch: dict[str, str]) -> str:
    """WARN, unless the launch set spark.log.level (`spark-submit --conf spark.log.level=INFO`).

    Applied to log4j at once, before the SparkContext starts, so the INFO
    lines of its start (about 60 on a cluster) never print; the builder
    passes it on so the context keeps it.
    """
    # The JVM spark-submit started, or a new one with the `launch` settings.
    SparkContext._ensure_initialized(conf=SparkConf(loadDefaults=False).setAll(launch.items()))
    level = SparkConf().get("spark.log.level", QUIET_LOG_LEVEL)
    jvm = SparkContext._jvm
    # spark-submit resets Spark's logging before it runs the script, and the
    # first Spark class to log sets it up again at INFO: set it up now (a
    # protected Scala method, public to Java) so the level below stays.
    jvm.org.apache.spark.SparkConf(False).initializeLogIfNecessary(False)
    log4j = jvm.org.apache.logging.log4j
    log4j.core.config.Configurator.setRootLevel(log4j.Level.toLevel(level))
    return level


class SparkStartError(RuntimeError):
    """Java could not start Spark; the message is the tail of what the JVM printed."""


def _configured_master() -> str | None:
    """The master to set ourselves, or None when spark-submit's choice stands."""
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # launched by spark-submit: it chose
        return None
    if os.environ.get("SPARK_MASTER"):
        return os.environ["SPARK_MASTER"]
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    if "--master" in submit_args or _defaults_set("spark.master"):
        return None
    return "local[*]"


def _java_options_given() -> bool:
    """Did the launch choose the driver's JVM options (ours would replace them)?"""
    submit_args = os.environ.get("PYSPARK_SUBMIT_ARGS", "")
    return ("--driver-java-options" in submit_args
            or "spark.driver.extraJavaOptions" in submit_args
            or _defaults_set("spark.driver.extraJavaOptions"))


def _defaults_set(key: str) -> bool:
    """Does spark-defaults.conf (SPARK_CONF_DIR, else SPARK_HOME/conf) set `key`?"""
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(
        os.environ.get("SPARK_HOME", ""), "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as conf:
            # A Java properties file: "key value", "key=value" or "key: value".
            return any(re.split(r"[\s=:]", line.strip(), maxsplit=1)[0] == key
                       for line in conf)
    except OSError:
        return False


@contextmanager
def _jvm_stderr_captured() -> Iterator[Callable[[], str]]:
    """Point fd 2 at an anonymous file while the JVM is spawned (it inherits it)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield lambda: _tail(sink)
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _tail(sink: Any, limit: int = 4000) -> str:
    sink.flush()
    sink.seek(0)
    return sink.read().decode(errors="replace")[-limit:].strip()
