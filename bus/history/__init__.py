"""The Spark history job over the JSONL export, its report and charts (the `[spark]` extra).

Modules, in the order the job runs them: `session` starts Spark, `lake`
lands the export's new bytes in the history lake and `pipeline` streams them
into its Parquet tables (`errors` has the lake's errors), `extract` knows the
export's schema and totals the messages, `queries` transforms them, `job`
drives them (and is the file spark-submit runs), `report` shows the results
and writes the files, `charts` draws them. This module imports none of them, nor pyspark: the
`bus` command reads QUERY_NAMES and job_path() from here whether or not
the extra is installed, and imports `job` only when `bus history` runs.

The part reads only the export's files (bus/log/export.py's line format) and
imports nothing else of agentbus, so it ranks just above the log
(docs/architecture.md).
"""

from __future__ import annotations

from pathlib import Path

# The names of queries.QUERIES, in its order (a test keeps the two in step).
QUERY_NAMES = ("volume", "lifecycle", "stuck", "threads", "silence", "dead_tasks", "lead_time",
               "blocked", "throughput")
STUCK_AFTER_SECONDS = 3600.0  # a non-terminal state this much older than the newest message


def job_path() -> Path:
    """The job's file, for `spark-submit PATH --export ...` (`bus history --job-path`)."""
    return Path(__file__).resolve().with_name("job.py")
