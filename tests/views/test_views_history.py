"""The console's history page, in headless Chromium: without a warm Spark it says how to
start one; with `bus history serve` running it shows what `bus history` prints, from the
lake it brings up to date through the server. Real processes throughout: `bus serve`,
`bus history serve` (Spark Connect on a local JVM) and `bus history` for the answer."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from bus import Bus
from tests.views.test_views_console import needs_chromium
from tests.views.test_views_console import offline_page
from tests.views.test_views_console import screenshot
from tests.views.test_views_serve import Server

BUS = [sys.executable, "-m", "bus.cli"]
FIRST_RUN_MS = 180_000  # the first page on a new server: its JVM compiles what it runs


@pytest.fixture
def quiet_bus(db_path: Path) -> Path:
    with Bus.open(db_path) as bus:
        bus.publish("planner", "note", {"hello": "world"})
    return db_path


@needs_chromium
def test_history_page_without_a_warm_spark_says_how_to_start_one(
        quiet_bus: Path, python_env: dict[str, str]) -> None:
    console = Server(quiet_bus, python_env)
    try:
        with offline_page(console) as page:
            page.goto(console.url + "history")
            assert "bus history serve" in page.inner_text("#history-note")
            assert page.get_attribute("body", "data-last-seq") == "1"  # not shown as stale
            assert page.eval_on_selector("nav a[href='/history']", "a => a.textContent") == (
                "history")
    finally:
        console.stop()


def needs_spark() -> None:
    pytest.importorskip("pyspark")
    pytest.importorskip("grpc")  # the Spark Connect client, in the [spark] extra
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs Java (no java on PATH, no JAVA_HOME)")


@pytest.fixture
def warm_spark(quiet_bus: Path, python_env: dict[str, str],
               tmp_path: Path) -> Iterator[dict[str, str]]:
    """`bus history serve` for the bus; the environment its clients run in."""
    needs_spark()
    from tests.support.history_support import spark_vars

    env = {**python_env, **spark_vars(tmp_path)}
    bus(quiet_bus, env, "history", "serve")
    try:
        yield env
    finally:
        bus(quiet_bus, env, "history", "serve", "--stop")


def bus(db: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([*BUS, "--db", str(db), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def generated(lines: int, scratch: Path) -> bytes:
    """The first `lines` lines of the generator's history (seed 8): a longer one starts
    with a shorter one's lines."""
    from tests.support.history_support import load_script

    out = scratch / f"generated-{lines}.jsonl"
    assert load_script("gen_history").main(["--out", str(out), "-n", str(lines),
                                            "--seed", "8"]) == 0
    return out.read_bytes()


def shown_totals(page) -> dict[str, str]:
    return dict(page.eval_on_selector_all(
        "#history-totals tr", "rows => rows.slice(1).map(r => [r.cells[0].textContent,"
                              " r.cells[1].textContent])"))


@pytest.mark.slow
@needs_chromium
def test_history_page_reads_the_lake_through_the_warm_server_and_follows_the_export(
        quiet_bus: Path, warm_spark: dict[str, str], tmp_path: Path) -> None:
    export = quiet_bus.parent / "bus.jsonl"  # where the bus's export goes (none made yet)
    longer = generated(3400, tmp_path)
    first = b"".join(longer.splitlines(keepends=True)[:3000])
    export.write_bytes(first)
    console = Server(quiet_bus, warm_spark)
    try:
        with offline_page(console) as page:
            page.set_default_timeout(FIRST_RUN_MS)
            page.goto(console.url + "history", timeout=FIRST_RUN_MS)
            totals = shown_totals(page)
            assert totals["messages"] == "3000"
            # What `bus history` prints from the same lake, through the same server.
            printed = [json.loads(line) for line in bus(
                quiet_bus, warm_spark, "history", "--query", "volume", "--json").splitlines()]
            assert int(totals["agents"]) == len({row["agent"] for row in printed})
            by_type = Counter()
            for row in printed:
                by_type[row["type"]] += row["messages"]
            shown = page.eval_on_selector_all(
                "#history-volume tr", "rows => rows.slice(1).map(r => [r.cells[0].textContent,"
                                      " Number(r.cells[1].textContent)])")
            assert shown == [list(pair) for pair in sorted(
                by_type.items(), key=lambda pair: (-pair[1], pair[0]))][:10]
            assert (quiet_bus.parent / "bus.lake" / "messages").is_dir()
            screenshot(page, tmp_path, "console-history")
            # The export grows; the next view takes in what it gained.
            with export.open("ab") as out:
                out.write(longer[len(first):])
            page.reload(timeout=FIRST_RUN_MS)
            assert shown_totals(page)["messages"] == "3400"
    finally:
        console.stop()
