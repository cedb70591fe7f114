"""The report's charts: plotly draws them in report.html, matplotlib as --png images.

A Chart is the data and labels of one chart, computed once from the
collected rows; plotly_figure and png_figure draw the same Chart, so the
page and the images agree. Time axes are real time axes: each bar spans
its bucket (an hour) and the axis covers at least a bucket and a half
around the data, so one bucket reads "12:00-13:00", not a sliver over
half a millisecond. Durations are in the unit that fits the data (units).
plotly and matplotlib are imported only when drawing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from datetime import timezone
from pathlib import Path
from typing import Any
from typing import Callable
from typing import Sequence

from bus.history.units import duration_unit
from bus.history.units import in_unit
from bus.history.units import parse_time

PNG_SIZE = (10.0, 4.0)  # inches, at PNG_DPI: 1000 x 400 pixels
PNG_DPI = 100
TASK_EVENT_TYPES = ("task_released", "task_reclaimed", "task_dead")
HOUR = timedelta(hours=1)  # the volume query's bucket
SMALL_COUNT = 10  # below this many, plotly's count axes tick every whole number


@dataclass(frozen=True)
class Chart:
    """One chart, drawn the same by plotly (report.html) and matplotlib (--png).

    `series` maps a legend name to (x values, y values); bars stack per x
    value. Without `bucket` the x values are categories (states, latency
    buckets); with it they are aware UTC datetimes, each the start of a
    bucket that wide.
    """

    name: str
    title: str
    kind: str  # "stacked" (series share the x axis, sorted) or "bar" (one series, as given)
    x_title: str
    y_title: str
    series: dict[str, tuple[list[Any], list[Any]]]
    bucket: timedelta | None = None

    def counts(self) -> bool:
        """Are the y values counts (whole numbers), so the axis ticks whole numbers only?"""
        return all(isinstance(y, int) for _, ys in self.series.values() for y in ys)

    def tallest(self) -> float:
        """The highest stack of bars (0 with no data)."""
        stacks: dict[Any, float] = defaultdict(float)
        for xs, ys in self.series.values():
            for x, y in zip(xs, ys):
                stacks[x] += y
        return max(stacks.values(), default=0)

    def time_range(self) -> tuple[datetime, datetime] | None:
        """The x axis of a time chart: from half a bucket before the first bucket to
        half a bucket after the last one ends; None for a category chart or no data."""
        starts = [x for xs, _ in self.series.values() for x in xs]
        if self.bucket is None or not starts:
            return None
        return min(starts) - self.bucket / 2, max(starts) + self.bucket * 3 / 2


def charts(results: Sequence[Any]) -> list[Chart]:
    """The charts the results (report.Result) allow: each needs its query to have run."""
    by_name = {result.name: result for result in results}
    made = []
    if "volume" in by_name:
        volume = by_name["volume"].records()
        made.append(Chart("volume", "Messages per hour by type", "stacked", "hour (UTC)",
                          "messages", _per_hour(volume, lambda kind: True), HOUR))
    if "lifecycle" in by_name:
        made.append(_time_in_state(by_name["lifecycle"].records()))
    if "threads" in by_name:
        made.append(_thread_latency(by_name["threads"].records()))
    if "volume" in by_name:
        made.append(Chart("takeovers", "Takeovers and dead tasks per hour", "stacked",
                          "hour (UTC)", "events",
                          _per_hour(volume, lambda kind: kind in TASK_EVENT_TYPES), HOUR))
    return made


def _per_hour(volume: list[dict[str, Any]], keep: Callable[[str], bool]
              ) -> dict[str, tuple[list[Any], list[Any]]]:
    counts: dict[str, dict[datetime, int]] = defaultdict(lambda: defaultdict(int))
    for record in volume:
        if keep(record["type"]):
            counts[record["type"]][parse_time(record["hour"])] += record["messages"]
    return {kind: (sorted(hours), [hours[h] for h in sorted(hours)])
            for kind, hours in sorted(counts.items())}


# Latency buckets (upper bounds in ms, labels): log-like steps, because a
# thread's median reply ranges from milliseconds to hours.
LATENCY_BUCKETS = [(100, "< 0.1 s"), (1_000, "0.1-1 s"), (5_000, "1-5 s"),
                   (15_000, "5-15 s"), (60_000, "15-60 s"), (300_000, "1-5 min"),
                   (900_000, "5-15 min"), (3_600_000, "15-60 min"), (None, ">= 1 h")]


def _thread_latency(threads: list[dict[str, Any]]) -> Chart:
    counts = {label: 0 for _, label in LATENCY_BUCKETS}
    for record in threads:
        if record["scope"] == "thread":
            counts[_bucket(record["p50_ms"])] += 1
    return Chart("thread_latency", "Thread latency: threads by median reply time", "bar",
                 "median request-to-reply latency", "threads",
                 {"threads": (list(counts), list(counts.values()))})


def _bucket(ms: int) -> str:
    return next(label for bound, label in LATENCY_BUCKETS if bound is None or ms < bound)


def _time_in_state(lifecycle: list[dict[str, Any]]) -> Chart:
    """Total time in each state over all workers, in the unit that fits the longest."""
    seconds: dict[str, float] = defaultdict(float)
    for record in lifecycle:
        seconds[record["state"]] += record["total_s"]
    unit, size = duration_unit(seconds.values())
    states = sorted(seconds, key=lambda state: -seconds[state])
    return Chart("time_in_state", f"Time in each worker state, all workers ({unit})", "bar",
                 "state", f"time ({unit})",
                 {unit: (states, [in_unit(seconds[s], unit, size) for s in states])})


# --- plotly (report.html) ---------------------------------------------------------------


def plotly_figure(chart: Chart) -> Any:
    """The chart as a plotly Figure; a time chart's bars span their bucket."""
    import plotly.graph_objects as go  # only with --out

    figure = go.Figure()
    for name, (xs, ys) in chart.series.items():
        if chart.bucket is None:
            figure.add_trace(go.Bar(x=xs, y=ys, name=name))
        else:  # bars from the bucket's start, a bucket wide (ms on a date axis)
            figure.add_trace(go.Bar(x=[_plotly_time(x) for x in xs], y=ys, name=name,
                                    offset=0, width=chart.bucket / timedelta(milliseconds=1),
                                    marker_line={"width": 0.5, "color": "white"}))
    figure.update_layout(title=chart.title, barmode="stack", xaxis_title=chart.x_title,
                         yaxis_title=chart.y_title, height=420, margin={"t": 60},
                         showlegend=chart.kind == "stacked")  # a lone series too: which type
    if chart.counts() and chart.tallest() < SMALL_COUNT:
        figure.update_yaxes(dtick=1)  # no 0.2-event ticks under a bar of 1
    span = chart.time_range()
    if span is not None:
        figure.update_xaxes(type="date", range=[_plotly_time(end) for end in span])
    return figure


def _plotly_time(moment: datetime) -> str:
    """plotly.js date axes have no time zones: UTC wall time as text, read as it is."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


# --- matplotlib (--png) -----------------------------------------------------------------


def write_pngs(made: Sequence[Chart], out_dir: Path) -> list[Path]:
    """Each chart as `<name>.png`, PNG_SIZE at PNG_DPI."""
    import matplotlib.pyplot as plt

    written = []
    for chart in made:
        figure = png_figure(chart)
        path = out_dir / f"{chart.name}.png"
        figure.savefig(path, dpi=PNG_DPI)
        plt.close(figure)
        written.append(path)
    return written


def png_figure(chart: Chart) -> Any:
    """The chart as a matplotlib Figure (close it with plt.close when done)."""
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=PNG_SIZE, dpi=PNG_DPI)
    if chart.bucket is None:
        _draw_categories(axes, chart)
    else:
        _draw_times(axes, chart)
    if chart.kind == "stacked":  # a lone series too: which type it is
        axes.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    if chart.counts():
        axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_title(chart.title)
    axes.set_xlabel(chart.x_title)
    axes.set_ylabel(chart.y_title)
    figure.tight_layout()
    return figure


def _draw_categories(axes: Any, chart: Chart) -> None:
    """Bars at category positions, stacked; a tick label every few categories."""
    categories = _categories(chart)
    position = {category: index for index, category in enumerate(categories)}
    _stack(axes, chart, lambda x: position[x], {"align": "center"})
    step = max(1, len(categories) // 12)
    axes.set_xticks(range(0, len(categories), step),
                    [str(category) for category in categories[::step]], rotation=30, ha="right")


def _draw_times(axes: Any, chart: Chart) -> None:
    """Bars from each bucket's start, a bucket wide, on a UTC date axis over time_range."""
    import matplotlib.dates as mdates

    _stack(axes, chart, lambda x: x, {"width": chart.bucket, "align": "edge",
                                      "edgecolor": "white", "linewidth": 0.5})
    axes.set_xlim(*chart.time_range())
    locator = mdates.AutoDateLocator(tz=timezone.utc)
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator, tz=timezone.utc))


def _stack(axes: Any, chart: Chart, place: Callable[[Any], Any], bar: dict[str, Any]) -> None:
    """Each series' bars on top of the ones drawn before at the same x."""
    import matplotlib.pyplot as plt

    heights: dict[Any, float] = defaultdict(float)
    colors = plt.get_cmap("tab20")  # 20 colours: every message type its own
    for index, (name, (xs, ys)) in enumerate(chart.series.items()):
        axes.bar([place(x) for x in xs], ys, bottom=[heights[x] for x in xs], label=name,
                 color=colors(index % 20), **bar)
        for x, y in zip(xs, ys):
            heights[x] += y


def _categories(chart: Chart) -> list[Any]:
    if chart.kind == "stacked":
        return sorted({x for xs, _ in chart.series.values() for x in xs})
    return [x for xs, _ in chart.series.values() for x in xs]
