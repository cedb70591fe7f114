"""The date-partitioned export (`--partition-by date`): layout, crash recovery, errors."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from click.testing import CliRunner

from bus import Bus
from bus.cli import main
from bus.log.export import ExportError
from bus.log.export import JsonlExporter
from bus.log.export import _ROWS_SQL
from bus.log.export import format_line

DAY_MS = 86_400_000
BASE_MS = 1_795_000_000_000  # 2026-11-18T...Z


def publish_over_days(bus: Bus, count: int, per_day: int, first_day: int = 0) -> None:
    """Publish `count` messages, then spread their times over consecutive days."""
    start = bus.last_seq()
    bus.publish_many([{"from_agent": "a", "type": "t", "payload": {"n": i}} for i in range(count)])
    bus.conn.execute(
        "UPDATE messages SET ts_ms = ? + (? + (seq - ? - 1) / ?) * ? + seq WHERE seq > ?",
        (BASE_MS, first_day, start, per_day, DAY_MS, start))


def exported(directory: Path) -> list[tuple[str, int]]:
    """(partition file, seq) for every line, files in name order."""
    return [(str(path.relative_to(directory)), orjson.loads(line)["seq"])
            for path in sorted(directory.rglob("*.jsonl"))
            for line in path.read_bytes().splitlines()]


def test_export_partitions_by_date_with_parts_named_by_first_seq(bus: Bus, tmp_path: Path) -> None:
    publish_over_days(bus, 25, per_day=10)
    out = tmp_path / "history"
    assert bus.export_jsonl(out, partition_by="date") == 25
    lines = exported(out)
    assert [seq for _, seq in lines] == list(range(1, 26))
    assert sorted({part for part, _ in lines}) == [
        "date=2026-11-18/part-000000000001.jsonl",
        "date=2026-11-19/part-000000000011.jsonl",
        "date=2026-11-20/part-000000000021.jsonl",
    ]
    for part, seq in lines:
        row = bus.conn.execute(_ROWS_SQL.replace("seq > ?", "seq >= ?"), (seq, 1)).fetchone()
        assert orjson.loads(format_line(row))["ts"].startswith(part[5:15])


def test_export_partitions_appends_to_the_open_part_across_runs(bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "history"
    publish_over_days(bus, 3, per_day=10)
    bus.export_jsonl(out, partition_by="date")
    publish_over_days(bus, 3, per_day=10)  # same day as the first three
    assert bus.export_jsonl(out, partition_by="date") == 3
    assert {part for part, _ in exported(out)} == {"date=2026-11-18/part-000000000001.jsonl"}
    assert bus.conn.execute("SELECT part, bytes FROM export_state").fetchone() == (
        "date=2026-11-18/part-000000000001.jsonl",
        (out / "date=2026-11-18/part-000000000001.jsonl").stat().st_size)


def test_export_partitions_adopts_a_new_part_a_crash_left_with_a_torn_line(
        bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "history"
    publish_over_days(bus, 10, per_day=10)
    bus.export_jsonl(out, partition_by="date")
    publish_over_days(bus, 5, per_day=10, first_day=3)
    rows = bus.conn.execute(_ROWS_SQL, (10, 5)).fetchall()
    # What a crash after writing one and a half lines of a new part leaves behind:
    part = out / "date=2026-11-21" / "part-000000000011.jsonl"
    part.parent.mkdir()
    torn = format_line(rows[0]) + format_line(rows[1])[:25]
    part.write_bytes(torn)
    assert bus.export_jsonl(out, partition_by="date") == 3
    assert part.read_bytes().startswith(torn)  # completed, never cut
    assert [seq for _, seq in exported(out)] == list(range(1, 16))


def test_export_partitions_refuses_a_part_that_does_not_match_the_bus(
        bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "history"
    publish_over_days(bus, 10, per_day=10)
    bus.export_jsonl(out, partition_by="date")
    publish_over_days(bus, 2, per_day=10, first_day=3)
    part = out / "date=2026-11-21" / "part-000000000011.jsonl"
    part.parent.mkdir()
    part.write_bytes(b'{"seq": 11, "hand": "written"}\n')
    before = bus.conn.execute("SELECT * FROM export_state").fetchone()
    with pytest.raises(ExportError, match="does not match the bus"):
        bus.export_jsonl(out, partition_by="date")
    assert bus.conn.execute("SELECT * FROM export_state").fetchone() == before


def test_export_partitions_and_single_file_do_not_mix(bus: Bus, tmp_path: Path) -> None:
    publish_over_days(bus, 3, per_day=10)
    out = tmp_path / "history"
    bus.export_jsonl(out, partition_by="date")
    with pytest.raises(ExportError, match="is a directory; export into it with --partition-by"):
        bus.export_jsonl(out)
    with Bus.open(tmp_path / "other.db") as other:
        single = tmp_path / "bus.jsonl"
        single.write_text("")
        with pytest.raises(ExportError, match="is a file; a partitioned export needs a directory"):
            JsonlExporter(other.conn, single, "date").open()


def test_export_partitions_refuses_a_directory_with_foreign_files(bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "history"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    bus.publish("a", "t")
    with pytest.raises(ExportError, match="did not write"):
        bus.export_jsonl(out, partition_by="date")
    assert bus.conn.execute("SELECT path FROM export_state").get is None


def test_export_partitions_second_exporter_is_locked_out(bus: Bus, tmp_path: Path) -> None:
    out = tmp_path / "history"
    with JsonlExporter(bus.conn, out, "date"):
        with pytest.raises(ExportError, match="another exporter"):
            JsonlExporter(bus.conn, out, "date").open()


def test_export_partitions_rejects_unknown_partitioning(bus: Bus, tmp_path: Path) -> None:
    from bus import ValidationFailed
    with pytest.raises(ValidationFailed, match="partition_by"):
        JsonlExporter(bus.conn, tmp_path / "x", "hour")


def test_export_cli_partition_by_date(bus: Bus, db_path: Path, tmp_path: Path) -> None:
    publish_over_days(bus, 12, per_day=10)
    out = tmp_path / "history"
    result = CliRunner().invoke(main, ["--db", str(db_path), "export", "--out", str(out),
                                       "--partition-by", "date", "--json"])
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout) == {"path": str(out), "exported": 12}
    assert len(list(out.rglob("part-*.jsonl"))) == 2
    bad = CliRunner().invoke(main, ["--db", str(db_path), "export", "--partition-by", "hour"])
    assert bad.exit_code == 2


def test_export_cli_remembers_the_partitioning_with_the_path(bus: Bus, db_path: Path,
                                                             tmp_path: Path) -> None:
    publish_over_days(bus, 2, per_day=10)
    out = tmp_path / "history"
    first = CliRunner().invoke(main, ["--db", str(db_path), "export", "--out", str(out),
                                      "--partition-by", "date", "--json"])
    assert orjson.loads(first.stdout) == {"path": str(out), "exported": 2}
    publish_over_days(bus, 2, per_day=10)
    again = CliRunner().invoke(main, ["--db", str(db_path), "export", "--json"])
    assert again.exit_code == 0, again.output
    assert orjson.loads(again.stdout) == {"path": str(out), "exported": 2}
    assert bus.export_partition_by() == "date"
    lines = [orjson.loads(line)["seq"] for part in sorted(out.rglob("part-*.jsonl"))
             for line in part.read_bytes().splitlines()]
    assert sorted(lines) == [1, 2, 3, 4]


def test_export_remembers_a_single_file_too(bus: Bus, tmp_path: Path) -> None:
    bus.publish("a", "t")
    bus.export_jsonl(tmp_path / "one.jsonl")
    bus.publish("a", "t")
    assert (bus.export_partition_by(), bus.export_jsonl()) == (None, 1)
