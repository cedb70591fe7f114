"""The history job's output and input: summary, --full, --out files, charts, bad lines.

One generated export (scripts/gen_history.py, 20,000 messages) goes through
the job once with --out and --png; the tests read what it wrote: the
summary's length, the Parquet and CSV files against the queries (the
Parquet time columns as timestamps), report.html in headless Chromium with
the network off, the PNGs' sizes. The charts' units and time axes are read
from the figures plotly and matplotlib build. The input tests
build directories with backup, temporary and hidden files and bad lines.
Skipped where PySpark or Java is not installed (Chromium: that test alone).
"""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
    pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)", allow_module_level=True)

import matplotlib.dates as mdates  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import orjson  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from click.testing import CliRunner  # noqa: E402
from lxml import html as lxml_html  # noqa: E402
from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402
from pyspark.testing import assertDataFrameEqual  # noqa: E402

from bus.cli import history as history_cli  # noqa: E402
from bus.history import charts  # noqa: E402
from bus.history import extract  # noqa: E402
from bus.history import job  # noqa: E402
from bus.history import queries  # noqa: E402
from bus.history import report  # noqa: E402
from bus.history import units  # noqa: E402

from tests.support.history_support import MEANING  # noqa: E402
from tests.support.history_support import T0  # noqa: E402
from tests.support.history_support import iso  # noqa: E402
from tests.support.history_support import load_script  # noqa: E402
from tests.support.history_support import spark  # noqa: E402,F401 (the fixture)

gen = load_script("gen_history")
CHARTS = ["volume", "time_in_state", "thread_latency", "takeovers"]
HOUR_PATTERN = "yyyy-MM-dd'T'HH:mm'Z'"  # volume's hours, as Spark parses them
ISO_PATTERN = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"  # every other time column


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("gen") / "history.jsonl"
    assert gen.main(["--out", str(path), "-n", "20000", "--seed", "3"]) == 0
    return path


@pytest.fixture(scope="module")
def reported(spark: SparkSession, generated: Path,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The job over the generated export: the summary printed, the files under out/."""
    out_dir = tmp_path_factory.mktemp("report") / "out"
    printed = io.StringIO()
    seen = job.run(spark, str(generated), queries.query_names("all"),
                   report.Output(out_dir=str(out_dir), png=True), out=printed)
    return {"summary": printed.getvalue(), "out": out_dir, "overview": seen}


def test_summary_is_under_100_lines_with_totals_and_every_query(
        reported: dict[str, Any]) -> None:
    lines = reported["summary"].splitlines()
    assert len(lines) < 100
    headings = [line for line in lines if line.startswith("== ")]
    assert headings[0] == "== totals =="
    assert [h.split(":")[0][3:] for h in headings[1:]] == list(queries.QUERIES)
    assert "messages  20000" in [" ".join(line.split()).replace(" ", "  ", 1)
                                 for line in lines[:6]]
    assert any(h.startswith("== volume: messages by type") for h in headings)


def test_summary_threads_section_starts_with_the_overall_row_then_slowest(
        reported: dict[str, Any]) -> None:
    lines = reported["summary"].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("== threads"))
    rows = [line.split() for line in lines[start + 3:start + 3 + report.SUMMARY_TOP]]
    assert rows[0][0] == "all"
    p95s = [int(row[4]) for row in rows[1:]]
    assert p95s == sorted(p95s, reverse=True) and len(p95s) == report.SUMMARY_TOP - 1


def test_out_writes_parquet_and_csv_per_query_equal_to_the_query(
        spark: SparkSession, reported: dict[str, Any], generated: Path) -> None:
    out_dir = reported["out"]
    messages = extract.extract(spark, str(generated))
    for name, query in queries.QUERIES.items():
        expected = MEANING[name](messages, queries.Options())
        header = (out_dir / f"{name}.csv").read_text().splitlines()
        assert header[0].split(",") == expected.columns
        assert len(header) == expected.count() + 1
        # The Parquet file holds the time columns as timestamps: the query's ISO text, parsed.
        expected = expected.withColumns({
            column: F.to_timestamp(column, HOUR_PATTERN if column == "hour" else ISO_PATTERN)
            for column in query.times})
        parquet = pq.read_table(out_dir / f"{name}.parquet")
        from_parquet = spark.createDataFrame(parquet.to_pylist(), expected.schema)
        assertDataFrameEqual(from_parquet, expected)


def test_parquet_time_columns_are_utc_timestamps_and_the_rest_keep_their_types(
        reported: dict[str, Any]) -> None:
    timestamp = pa.timestamp("ms", tz="UTC")
    times = {name: pq.read_schema(reported["out"] / f"{name}.parquet")
             for name in queries.QUERIES}
    assert {name: [field.name for field in schema if field.type == timestamp]
            for name, schema in times.items()} == {
        "volume": ["hour"], "lifecycle": [], "stuck": ["since"], "threads": [],
        "silence": ["start", "end"], "dead_tasks": ["last_at"], "lead_time": ["started", "ended"],
        "blocked": ["first_blocked"], "throughput": []}
    assert not any(pa.types.is_string(schema.field(column).type)
                   for name, schema in times.items() for column in queries.QUERIES[name].times)
    assert times["volume"].field("messages").type == pa.int64()
    first_hour = pq.read_table(reported["out"] / "volume.parquet").column("hour")[0].as_py()
    assert first_hour == datetime(2026, 1, 5, 8, tzinfo=timezone.utc)  # gen_history's start


def test_png_writes_each_chart_as_an_image_of_the_stated_size(reported: dict[str, Any]) -> None:
    for name in CHARTS:
        data = (reported["out"] / f"{name}.png").read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
        width, height = struct.unpack(">II", data[16:24])
        assert (width, height) == (int(charts.PNG_SIZE[0] * charts.PNG_DPI),
                                   int(charts.PNG_SIZE[1] * charts.PNG_DPI))


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(chromium() is None, reason="headless Chromium is not installed"
                    " (`make test` installs Debian's chromium package when it can)")
@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is missing")
def test_report_html_draws_every_chart_offline_in_headless_chromium(
        reported: dict[str, Any], tmp_path: Path) -> None:
    page = reported["out"] / "report.html"
    assert b"<script src=\"http" not in page.read_bytes()  # plotly's JS is in the page
    # A network namespace of its own: no network at all, not even loopback.
    done = subprocess.run(
        ["unshare", "--net", chromium(), "--headless", "--no-sandbox", "--disable-gpu",
         "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
         "--virtual-time-budget=15000", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=180)
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"cannot make a network namespace here: {done.stderr.strip()[:200]}")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = lxml_html.fromstring(done.stdout)
    for name in CHARTS:
        chart = dom.get_element_by_id(f"chart-{name}")
        assert chart.xpath(".//*[local-name()='svg' and contains(@class, 'main-svg')]"), name
        bars = chart.xpath(".//*[local-name()='g' and contains(@class, 'point')]")
        assert bars, f"chart {name} drew no bar"
    tables = dom.xpath("//table")
    assert len(tables) == 1 + len(queries.QUERIES)  # totals, then each query's summary


# --- input: which files, which lines ----------------------------------------------------


def line(seq: int, **fields: Any) -> bytes:
    record = {"seq": seq, "id": f"m{seq}", "ts_ms": T0 + seq, "ts": iso(T0 + seq), "from": "w1",
              "to": None, "type": "note", "correlation_id": None, "in_reply_to": None,
              "payload_ref": None, "payload": None, **fields}
    return orjson.dumps(record) + b"\n"


def test_directory_reads_only_jsonl_part_files(spark: SparkSession, tmp_path: Path) -> None:
    day = tmp_path / "export" / "date=2026-01-05"
    day.mkdir(parents=True)
    part = line(1) + line(2) + line(3)
    (day / "part-000000000001.jsonl").write_bytes(part)
    for stray in ["part-000000000001.jsonl.bak", "part-000000000001.jsonl~",
                  "part-000000000001.jsonl.tmp", ".part-000000000001.jsonl.swp",
                  "_part-000000000001.jsonl", "#part-000000000001.jsonl#", "notes.txt"]:
        (day / stray).write_bytes(part)
    (tmp_path / "export" / ".staging").mkdir()
    (tmp_path / "export" / ".staging" / "part-000000000001.jsonl").write_bytes(part)
    seen, results = job.compute(spark, str(tmp_path / "export"), ["volume"], queries.Options())
    assert (seen.messages, seen.malformed) == (3, 0)
    assert results[0].rows == [("2026-01-05T08:00Z", "w1", "note", 3)]


def test_a_file_named_explicitly_is_read_whatever_its_name(
        spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "copy.jsonl.bak"
    path.write_bytes(line(1) + line(2))
    assert extract.extract(spark, str(path)).count() == 2


def test_malformed_lines_are_counted_and_the_first_located(
        spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "export"
    (root / "date=2026-01-05").mkdir(parents=True)
    (root / "date=2026-01-06").mkdir()
    (root / "date=2026-01-05" / "part-000000000001.jsonl").write_bytes(
        line(1) + b"\n" + line(2) + b"not json at all\n" + line(3) + b'{"seq": "x"}\n')
    (root / "date=2026-01-06" / "part-000000000004.jsonl").write_bytes(
        line(4) + b"[1, 2]\n" + line(5)[:30])  # an array, then a torn last line
    seen = extract.overview(spark, extract.read_export(spark, str(root)))
    first = root / "date=2026-01-05" / "part-000000000001.jsonl"
    assert (seen.messages, seen.malformed) == (4, 4)
    assert seen.first_malformed == f"{first}:4"  # line 2 is blank: skipped, not malformed
    assert seen.malformed_note() == f"4 malformed lines skipped, first at {first}:4"
    assert extract.extract(spark, str(root)).count() == 4
    # The lake quarantines the three complete bad lines; the torn last line waits for its
    # end (an exporter may be writing it), so it is not in the lake yet.
    with pytest.raises(extract.MalformedExport,
                       match=f"3 malformed lines in the export, first at {first}:4;"):
        job.compute(spark, str(root), ["volume"], queries.Options(), strict=True)


def test_the_first_malformed_line_is_found_past_the_first_split(
        spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "bus.jsonl"
    body = b"".join(line(seq, payload={"pad": "x" * 200}) for seq in range(1, 3001))
    path.write_bytes(body + b"}{\n" + line(3001))
    spark.conf.set("spark.sql.files.maxPartitionBytes", "65536")  # about 12 splits
    try:
        seen = extract.overview(spark, extract.read_export(spark, str(path)))
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert (seen.messages, seen.malformed, seen.first_malformed) == (3001, 1, f"{path}:3001")


# --- the command ------------------------------------------------------------------------


@pytest.fixture
def bus_cli(monkeypatch: pytest.MonkeyPatch) -> Any:
    import bus.cli

    monkeypatch.setitem(bus.cli.main.commands, "history", history_cli.history)
    return bus.cli.main


def test_history_strict_exits_1_naming_the_first_bad_line(
        spark: SparkSession, bus_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "bus.jsonl"
    path.write_bytes(line(1) + b"oops\n" + line(2))
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(path), "--strict"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: 1 malformed line in the export, first at {path}:2;")
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(path), "--query", "volume",
                                          "--json"])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == ['{"hour": "2026-01-05T08:00Z", "agent": "w1",'
                                          ' "type": "note", "messages": 2}']
    assert f"1 malformed line skipped, first at {path}:2" in result.stderr


def test_history_out_that_cannot_be_written_exits_1_naming_it(
        spark: SparkSession, bus_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "bus.jsonl"
    path.write_bytes(line(1))
    (tmp_path / "a-file").write_text("")
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(path), "--out",
                                          str(tmp_path / "a-file" / "out")])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"Error: cannot write the report to --out"
                                    f" {tmp_path / 'a-file' / 'out'}: Not a directory")


@pytest.mark.parametrize("args, message", [
    (["--csv"], "CSV prints one query"),
    (["--png"], "--png writes images beside report.html"),
    (["--json", "--csv"], "--json and --csv exclude each other"),
])
def test_history_refuses_output_choices_that_do_not_go_together(
        bus_cli: Any, tmp_path: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(tmp_path), *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_history_out_writes_the_report_and_says_where(
        spark: SparkSession, bus_cli: Any, tmp_path: Path) -> None:
    path = tmp_path / "bus.jsonl"
    path.write_bytes(line(1) + line(2, type="task_released",
                                    payload={"task": "t1", "agent": "w1"}))
    result = CliRunner().invoke(bus_cli, ["history", "--export", str(path), "--out",
                                          str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"report written to {tmp_path / 'out' / 'report.html'}" in result.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(
        ["report.html"] + [f"{name}.{ext}" for name in queries.QUERIES
                           for ext in ("csv", "parquet")])


# --- the views, on rows built by hand ------------------------------------------------------


def result(name: str, columns: str, rows: list[tuple]) -> Any:
    times = {"volume": ("hour",)}.get(name, ())
    return report.Result(name, name, columns.split(), rows, times=times)


def test_charts_bucket_thread_latency_and_stack_task_events_per_hour() -> None:
    made = {chart.name: chart for chart in charts.charts([
        result("volume", "hour agent type messages", [
            ("2026-01-05T09:00Z", "bus", "task_dead", 1), ("2026-01-05T08:00Z", "w1", "note", 5),
            ("2026-01-05T08:00Z", "bus", "task_released", 2),
            ("2026-01-05T09:00Z", "bus", "task_released", 1)]),
        result("threads", "scope correlation_id replies p50_ms p95_ms max_ms", [
            ("thread", "t1", 1, 99, 99, 99), ("thread", "t2", 1, 100, 100, 100),
            ("thread", "t3", 1, 7_200_000, 7_200_000, 7_200_000),
            ("all", None, 3, 100, 7_200_000, 7_200_000)])])}
    eight, nine = (datetime(2026, 1, 5, hour, tzinfo=timezone.utc) for hour in (8, 9))
    assert made["takeovers"].series == {"task_dead": ([nine], [1]),
                                        "task_released": ([eight, nine], [2, 1])}
    labels, counts = made["thread_latency"].series["threads"]
    assert dict(zip(labels, counts)) == {"< 0.1 s": 1, "0.1-1 s": 1, "1-5 s": 0, "5-15 s": 0,
                                         "15-60 s": 0, "1-5 min": 0, "5-15 min": 0,
                                         "15-60 min": 0, ">= 1 h": 1}  # "all" is no thread
    assert set(made) == {"volume", "thread_latency", "takeovers"}  # no lifecycle: no chart


def test_summary_cuts_each_query_to_top_rows_and_says_of_how_many() -> None:
    sections = report.summary([("messages", 9)], [
        result("volume", "hour agent type messages", [
            ("h1", "w1", "heartbeat", 6), ("h1", "w2", "note", 1), ("h2", "w1", "heartbeat", 2)]),
        result("lifecycle", "worker state visits p50_s p95_s max_s total_s", [
            ("w1", "WORKING", 2, 30.0, 60.0, 60.0, 90.0),
            ("w2", "WORKING", 1, 7200.0, 7200.0, 7200.0, 7200.0),
            ("w1", "ASSIGNED", 1, 10.0, 10.0, 10.0, 10.0)]),
        result("stuck", "worker task state since stuck_s", [("w1", "t1", "WORKING", "x", 9.0)]),
    ], top=1)
    assert [(s.heading(), s.rows) for s in sections] == [
        ("== totals ==", [("messages", 9)]),
        ("== volume: messages by type (top 1 of 2) ==", [("heartbeat", 8, 88.9)]),
        ("== lifecycle: time in each state, all workers (top 1 of 2) ==",
         [("WORKING", 3, 2.0, 7200.0, 7200.0)]),  # 7290 s in all: hours
        ("== stuck: stuck ==", [("w1", "t1", "WORKING", "x", 9.0)]),
    ]
    assert sections[2].columns == ["state", "visits", "total_h", "worst_p95_s", "max_s"]


LIFECYCLE = "worker state visits p50_s p95_s max_s total_s"


@pytest.mark.parametrize("working_s, unit, shown", [
    (9.6, "s", 9.6), (0.0425, "s", 0.043), (119.0, "s", 119.0), (150.0, "min", 2.5),
    (7290.0, "h", 2.0)])
def test_time_in_state_is_shown_in_the_unit_the_longest_total_fits(
        working_s: float, unit: str, shown: float) -> None:
    lifecycle = result("lifecycle", LIFECYCLE, [
        ("w1", "WORKING", 1, working_s, working_s, working_s, working_s),
        ("w1", "ASSIGNED", 1, 1.2, 1.2, 1.2, 1.2)])
    chart, = charts.charts([lifecycle])
    states, shown_values = chart.series[unit]
    assert dict(zip(states, shown_values)) == {
        "WORKING": shown, "ASSIGNED": units.in_unit(1.2, *units.duration_unit([working_s]))}
    figure = charts.plotly_figure(chart)
    assert figure.layout.yaxis.title.text == f"time ({unit})"
    assert figure.layout.title.text == f"Time in each worker state, all workers ({unit})"
    drawn = charts.png_figure(chart)
    try:
        assert drawn.axes[0].get_ylabel() == f"time ({unit})"
        assert shown in [bar.get_height() for bar in drawn.axes[0].patches]
    finally:
        plt.close(drawn)
    section = report.summary([], [lifecycle])[1]
    assert section.columns[2] == f"total_{unit}"
    assert ("WORKING", 1, shown) in [row[:3] for row in section.rows]


def test_a_single_hour_is_drawn_a_bucket_wide_on_an_axis_of_two_hours() -> None:
    """One bucket (12:00) is a bar from 12:00 to 13:00 on an axis from 11:30 to 13:30,
    in report.html (plotly) and in the PNG (matplotlib)."""
    made = {chart.name: chart for chart in charts.charts([result(
        "volume", "hour agent type messages", [("2026-01-05T12:00Z", "bus", "task_dead", 1)])])}
    takeovers = made["takeovers"]
    figure = charts.plotly_figure(takeovers)
    assert figure.layout.xaxis.type == "date"
    assert figure.layout.xaxis.range == ("2026-01-05 11:30:00", "2026-01-05 13:30:00")
    bar, = figure.data
    assert (bar.x, bar.offset, bar.width) == (("2026-01-05 12:00:00",), 0, 3_600_000)
    assert figure.layout.yaxis.dtick == 1 and figure.layout.showlegend  # 1 event, task_dead
    drawn = charts.png_figure(takeovers)
    try:
        axes = drawn.axes[0]
        left, right = (mdates.num2date(x) for x in axes.get_xlim())
        assert (left, right) == (datetime(2026, 1, 5, 11, 30, tzinfo=timezone.utc),
                                 datetime(2026, 1, 5, 13, 30, tzinfo=timezone.utc))
        patch, = axes.patches
        assert mdates.num2date(patch.get_x()) == datetime(2026, 1, 5, 12, tzinfo=timezone.utc)
        assert patch.get_width() == pytest.approx(1 / 24)  # an hour, in days
        assert "12:00" in [label.get_text() for label in axes.get_xticklabels()]
        assert all(tick == int(tick) for tick in axes.get_yticks())  # events come whole
        assert [text.get_text() for text in axes.get_legend().get_texts()] == ["task_dead"]
    finally:
        plt.close(drawn)


def test_time_charts_span_from_half_an_hour_before_the_first_to_after_the_last_hour() -> None:
    volume = result("volume", "hour agent type messages", [
        ("2026-01-05T08:00Z", "w1", "note", 5), ("2026-01-05T11:00Z", "w1", "note", 1)])
    chart = next(chart for chart in charts.charts([volume]) if chart.name == "volume")
    assert chart.time_range() == (datetime(2026, 1, 5, 7, 30, tzinfo=timezone.utc),
                                  datetime(2026, 1, 5, 12, 30, tzinfo=timezone.utc))
    assert next(c for c in charts.charts([volume]) if c.name == "takeovers").time_range() is None


def test_parse_time_reads_both_formats_of_the_queries_and_refuses_others() -> None:
    assert units.parse_time("2026-01-05T08:00Z") == datetime(2026, 1, 5, 8, tzinfo=timezone.utc)
    assert units.parse_time("2026-01-05T08:00:01.250Z") == datetime(
        2026, 1, 5, 8, 0, 1, 250_000, tzinfo=timezone.utc)
    assert units.parse_time(None) is None
    with pytest.raises(ValueError, match="not a time the history queries write: '08:00'"):
        units.parse_time("08:00")
