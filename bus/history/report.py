"""What the history job shows of its results: the summary, tables and files.

The job (bus.history.job) computes each query once and hands the collected
rows here; nothing here runs Spark or imports pyspark. The terminal gets a
summary (totals and the top rows of each query, under 100 lines) or, with
--full, every row; `--out DIR` gets a Parquet and a CSV file per query and
`report.html`, one page with the charts (bus.history.charts: plotly, its
JavaScript inline, so the page works offline) and the summary tables;
`--png` the same charts as images (matplotlib). pyarrow, plotly and
matplotlib are imported only for --out.
"""

from __future__ import annotations

import csv
import html
import json
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Sequence
from typing import TextIO

from bus.history.charts import Chart
from bus.history.charts import charts
from bus.history.charts import plotly_figure
from bus.history.charts import write_pngs
from bus.history.units import duration_unit
from bus.history.units import in_unit
from bus.history.units import parse_time

SUMMARY_TOP = 8  # rows per query in the summary: 7 sections of at most 13 lines


@dataclass(frozen=True)
class Result:
    """One query's collected rows (a result is an aggregate: small enough for the driver)."""

    name: str
    title: str
    columns: list[str]
    rows: list[tuple]
    arrow_schema: Any = None  # pyarrow.Schema, for the Parquet file
    times: tuple[str, ...] = ()  # the columns that hold ISO time text (queries.Query.times)

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row)) for row in self.rows]


@dataclass(frozen=True)
class Section:
    """A table for people: a title, its rows, and how many rows there were in all."""

    title: str
    columns: list[str]
    rows: list[tuple]
    total: int | None = None  # rows before the top-N cut; None when nothing was cut

    def heading(self) -> str:
        cut = f" (top {len(self.rows)} of {self.total})" if self.total else ""
        return f"== {self.title}{cut} =="


@dataclass(frozen=True)
class Overview:
    """What the export holds, with the lines that were not records."""

    messages: int
    agents: int
    first_ms: int | None
    last_ms: int | None
    malformed: int
    first_malformed: str | None  # FILE:LINE (1-based), None when every line is a record

    def malformed_note(self, verb: str = "skipped") -> str | None:
        """"3 malformed lines skipped, first at FILE:LINE", or None when there are none."""
        if not self.malformed:
            return None
        lines = "line" if self.malformed == 1 else "lines"
        return f"{self.malformed} malformed {lines} {verb}, first at {self.first_malformed}"


@dataclass(frozen=True)
class Output:
    """How results are shown: `fmt` on stdout (table, json, csv), files under `out_dir`.

    The table is a summary (`top` rows per query) unless `full`; JSON and
    CSV always carry every row (up to `limit`), for machines.
    """

    fmt: str = "table"
    full: bool = False
    limit: int | None = None
    top: int = SUMMARY_TOP
    out_dir: str | None = None
    png: bool = False


def show(seen: Overview, results: Sequence[Result], output: Output, out: TextIO) -> None:
    """The summary, or every row (up to output.limit) as tables, JSON lines or CSV."""
    if output.fmt == "table" and not output.full:
        write_sections(summary(totals(seen), results, output.top), out)
        return
    several = len(results) > 1
    for index, result in enumerate(results):
        rows = result.rows[:output.limit] if output.limit else result.rows
        if output.fmt == "json":  # several queries in one stream: each line says which
            write_json(result.columns, rows, out, {"query": result.name} if several else None)
        elif output.fmt == "csv":
            write_csv(result.columns, rows, out)
        else:
            out.write(("" if index == 0 else "\n") + f"== {result.name}: {result.title} ==\n")
            write_table(result.columns, rows, out)


def output_problem(fmt: str, query: str, out_dir: str | None, png: bool) -> str | None:
    """Why these output choices do not go together, or None."""
    if fmt == "csv" and query == "all":
        return ("CSV prints one query (each has its own columns): name it with --query,"
                " or write a CSV file per query with --out DIR")
    if png and not out_dir:
        return "--png writes images beside report.html: give --out DIR too"
    return None


def totals(seen: Overview) -> list[tuple[str, Any]]:
    """The summary's first section: how much history there is, and what was skipped."""
    rows: list[tuple[str, Any]] = [("messages", seen.messages), ("agents", seen.agents)]
    if seen.first_ms is not None:
        rows += [("first", _iso_text(seen.first_ms)), ("last", _iso_text(seen.last_ms))]
    if seen.malformed:
        rows.append(("malformed lines skipped",
                     f"{seen.malformed}, first at {seen.first_malformed}"))
    return rows


def write_report(seen: Overview, results: Sequence[Result], export: str,
                 out_dir: Path, png: bool) -> None:
    """Parquet and CSV per query, report.html, and with `png` each chart as an image."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_query_files(results, out_dir)
    made = charts(results)
    notes = [note for note in [seen.malformed_note()] if note]
    write_html(out_dir / "report.html", f"agentbus history of {export}", notes, made,
               summary(totals(seen), results))
    if png:
        write_pngs(made, out_dir)


def _iso_text(ms: int) -> str:
    moment = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


# --- the summary ---------------------------------------------------------------------


def summary(totals: list[tuple[str, Any]], results: Sequence[Result],
            top: int = SUMMARY_TOP) -> list[Section]:
    """Totals, then each query cut to its `top` most telling rows."""
    sections = [Section("totals", ["what", "value"], totals)]
    for result in results:
        sections.append(SUMMARIZERS.get(result.name, _first_rows)(result, top))
    return sections


def _cut(title: str, columns: list[str], rows: list[tuple], top: int) -> Section:
    return Section(title, columns, rows[:top], len(rows) if len(rows) > top else None)


def _first_rows(result: Result, top: int) -> Section:
    """Results already ordered worst first (stuck, silence)."""
    return _cut(f"{result.name}: {result.title}", result.columns, result.rows, top)


def _volume_by_type(result: Result, top: int) -> Section:
    counts: dict[str, int] = defaultdict(int)
    for record in result.records():
        counts[record["type"]] += record["messages"]
    everything = sum(counts.values()) or 1
    rows = [(kind, n, round(100.0 * n / everything, 1))
            for kind, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]
    return _cut("volume: messages by type", ["type", "messages", "percent"], rows, top)


def _lifecycle_by_state(result: Result, top: int) -> Section:
    """Over all workers: visits, total time in the state (in the unit that fits the
    longest total), the worst worker's p95 and the longest visit."""
    by_state: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in result.records():
        by_state[record["state"]].append(record)
    totals = {state: sum(r["total_s"] for r in group) for state, group in by_state.items()}
    unit, size = duration_unit(totals.values())
    rows = [(state, sum(r["visits"] for r in group), in_unit(totals[state], unit, size),
             max(r["p95_s"] for r in group), max(r["max_s"] for r in group))
            for state, group in by_state.items()]
    rows.sort(key=lambda row: (-totals[row[0]], row[0]))
    return _cut("lifecycle: time in each state, all workers",
                ["state", "visits", f"total_{unit}", "worst_p95_s", "max_s"], rows, top)


def _slowest_threads(result: Result, top: int) -> Section:
    """The overall row, then the threads with the slowest p95."""
    scope, thread = result.columns.index("scope"), result.columns.index("correlation_id")
    p95, longest = result.columns.index("p95_ms"), result.columns.index("max_ms")
    overall = [row for row in result.rows if row[scope] == "all"]
    threads = sorted((row for row in result.rows if row[scope] != "all"),
                     key=lambda row: (-row[p95], -row[longest], row[thread] or ""))
    section = _cut("threads: slowest threads by p95 (ms)", result.columns, threads, top - 1)
    return Section(section.title, section.columns, overall + section.rows,
                   section.total and section.total + len(overall))


def _latest_dead(result: Result, top: int) -> Section:
    last_at = result.columns.index("last_at")
    rows = sorted(result.rows, key=lambda row: (row[last_at] or "", row[0]), reverse=True)
    return _cut("dead_tasks: latest released, reclaimed or dead tasks", result.columns, rows,
                top)


SUMMARIZERS: dict[str, Callable[[Result, int], Section]] = {
    "volume": _volume_by_type,
    "lifecycle": _lifecycle_by_state,
    "threads": _slowest_threads,
    "dead_tasks": _latest_dead,
}


# --- text, JSON lines, CSV -------------------------------------------------------------


def write_sections(sections: Sequence[Section], out: TextIO) -> None:
    for index, section in enumerate(sections):
        out.write(("" if index == 0 else "\n") + section.heading() + "\n")
        write_table(section.columns, section.rows, out)


def write_table(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    if not rows:
        out.write("(no rows)\n")
        return
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    right = [all(isinstance(row[i], (int, float)) or row[i] is None for row in rows)
             and not all(row[i] is None for row in rows) for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        return "  ".join(v.rjust(w) if r else v.ljust(w)
                         for v, w, r in zip(values, widths, right)).rstrip()

    out.write(line(columns) + "\n")
    out.write(line(["-" * w for w in widths]) + "\n")
    for r in cells:
        out.write(line(r) + "\n")


def write_json(columns: list[str], rows: list[tuple], out: TextIO,
               extra: dict[str, Any] | None = None) -> None:
    for row in rows:
        out.write(json.dumps({**(extra or {}), **dict(zip(columns, row))}) + "\n")


def write_csv(columns: list[str], rows: list[tuple], out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.0f}"
    return str(value)


# --- files: Parquet and CSV per query ------------------------------------------------------


def write_query_files(results: Sequence[Result], out_dir: Path) -> list[Path]:
    """`<query>.parquet` and `<query>.csv` for each result; the paths written.

    The CSV has the rows as printed (times as ISO text); the Parquet file
    has the time columns as UTC timestamps, for tools that filter or
    plot by time.
    """
    import pyarrow.parquet as pq  # only with --out: the terminal report needs none of these

    written = []
    for result in results:
        pq.write_table(arrow_table(result), out_dir / f"{result.name}.parquet")
        with open(out_dir / f"{result.name}.csv", "w", encoding="utf-8", newline="") as out:
            write_csv(result.columns, result.rows, out)
        written += [out_dir / f"{result.name}.parquet", out_dir / f"{result.name}.csv"]
    return written


def arrow_table(result: Result) -> Any:
    """The result as a pyarrow Table, its time columns as timestamp[ms, UTC]."""
    import pyarrow as pa

    records = result.records()
    for record in records:
        for column in result.times:
            record[column] = parse_time(record[column])
    schema = result.arrow_schema
    if schema is not None:
        for column in result.times:
            index = schema.get_field_index(column)
            schema = schema.set(index, schema.field(index).with_type(pa.timestamp("ms", tz="UTC")))
    return pa.Table.from_pylist(records, schema=schema)


# --- report.html -------------------------------------------------------------------------


def write_html(path: Path, heading: str, notes: Sequence[str], made: Sequence[Chart],
               sections: Sequence[Section]) -> None:
    """One page: plotly's JavaScript inline once, then each chart and the summary tables."""
    parts = [f"<h1>{html.escape(heading)}</h1>"]
    parts += [f"<p class=note>{html.escape(note)}</p>" for note in notes]
    for index, chart in enumerate(made):
        parts.append(plotly_figure(chart).to_html(full_html=False, include_plotlyjs=index == 0,
                                                   div_id=f"chart-{chart.name}"))
    parts += [_html_table(section) for section in sections]
    path.write_text(_PAGE.format(title=html.escape(heading), body="\n".join(parts)),
                    encoding="utf-8")


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
table {{ border-collapse: collapse; margin-bottom: 2em; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 2px 8px; text-align: left; }}
td.n {{ text-align: right; font-variant-numeric: tabular-nums; }}
.note {{ color: #a40; }}
</style></head>
<body>
{body}
</body></html>
"""


def _html_table(section: Section) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in section.columns)
    body = "".join(
        "<tr>" + "".join(f"<td class=n>{html.escape(_cell(v))}</td>"
                         if isinstance(v, (int, float)) and not isinstance(v, bool)
                         else f"<td>{html.escape(_cell(v))}</td>" for v in row) + "</tr>"
        for row in section.rows)
    return (f"<h2>{html.escape(section.heading().strip('= '))}</h2>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
