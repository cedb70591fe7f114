"""The history lake's files: its layout, its schema version, and the landing of the export.

The lake is a directory of plain Parquet tables (docs/history.md lists their
columns) that the streaming pipeline (bus.history.pipeline) appends to:

    <lake>/_lake.json           the schema version that wrote it
    <lake>/_landing/            immutable copies of the export's new bytes
    <lake>/_checkpoints/export  the stream's offsets and commits
    <lake>/<table>/day=YYYY-MM-DD/batch_id=N/part-*.parquet

Why a landing step: the exporter appends to its files, and Spark's file
source reads a file once, when it first sees it; lines appended later would
never reach the lake. So each run first copies the bytes each export file
gained since the last run, up to its last complete line, into a new file
that never changes again (a chunk). The stream then reads only new chunks.
A chunk's name says where its bytes came from (file, byte range, line
range), so the landing needs no state beside the chunks themselves: a chunk
appears whole (written under a hidden name, then renamed) or not at all.

Nothing here imports pyspark: the `bus` command checks a lake's version
without the extra.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from bus.history.errors import LakeError
from bus.history.errors import LakeTooNew
from bus.history.errors import LakeTooOld

LAKE_SCHEMA_VERSION = 2  # 2: the volume, replies and silences tables
LAKE_FILE = "_lake.json"
LANDING = "_landing"
CHECKPOINT = "_checkpoints/export"
LOCK_FILE = ".lake.lock"
STREAMED_FILE = ".streamed"  # in _landing: how many chunks the last whole stream run had
PART_SUFFIX = ".jsonl"  # the exporter's part files; anything else beside them is not read
COPY_BLOCK = 8 << 20
SEPARATOR = "+"  # stands for "/" in a chunk's name (export part names never hold a "+")
_CHUNK_NAME = re.compile(r"^(?P<source>.+)@(?P<start>\d+)-(?P<end>\d+)@(?P<first>\d+)-(?P<next>\d+)"
                         + re.escape(PART_SUFFIX) + "$")


@dataclass(frozen=True)
class Chunk:
    """Bytes [start, end) of one export file, lines [first_line, next_line) (0-based)."""

    source: str  # the file's path relative to the export ("" names the export file itself)
    start: int
    end: int
    first_line: int
    next_line: int

    @property
    def name(self) -> str:
        flat = (self.source or "export").replace("/", SEPARATOR)
        return (f"{flat}@{self.start:015d}-{self.end:015d}"
                f"@{self.first_line:012d}-{self.next_line:012d}{PART_SUFFIX}")

    @classmethod
    def parse(cls, name: str) -> Chunk | None:
        """The chunk a landing file name describes; None for any other name."""
        found = _CHUNK_NAME.match(name)
        if found is None:
            return None
        source = found["source"].replace(SEPARATOR, "/")
        return cls("" if source == "export" else source, int(found["start"]),
                   int(found["end"]), int(found["first"]), int(found["next"]))


def default_lake(export: str) -> str:
    """The lake beside the export: `bus.jsonl` -> `bus.lake`, `history/` -> `history.lake`."""
    path = Path(export.rstrip("/"))
    return str(path.with_name(f"{path.stem if path.suffix == PART_SUFFIX else path.name}.lake"))


def open_lake(lake: str | os.PathLike[str]) -> Path:
    """The lake's directory, created with its schema version if new.

    Raises LakeTooNew when a newer agentbus wrote it, LakeError when the
    directory holds something else.
    """
    root = Path(lake).absolute()
    marker = root / LAKE_FILE
    if marker.exists():
        check_version(root)
        return root
    # Hidden names are ours (the lock, a marker a killed run left half written).
    if root.exists() and any(not child.name.startswith(".") for child in root.iterdir()):
        raise LakeError(f"{root} is not a history lake (it has no {LAKE_FILE}) and is not"
                        " empty; give --lake a new or empty directory")
    root.mkdir(parents=True, exist_ok=True)
    _write_atomically(marker, json.dumps({"format": "agentbus-history-lake",
                                          "schema_version": LAKE_SCHEMA_VERSION}).encode())
    return root


def check_version(root: Path) -> int:
    """The lake's schema version; LakeTooNew or LakeTooOld if this agentbus cannot read it."""
    try:
        version = int(json.loads((root / LAKE_FILE).read_text())["schema_version"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise LakeError(f"{root / LAKE_FILE} cannot be read ({exc}); the lake is damaged:"
                        " move it away and run again to rebuild it from the export") from exc
    if version > LAKE_SCHEMA_VERSION:
        raise LakeTooNew(root, version, LAKE_SCHEMA_VERSION)
    if version < LAKE_SCHEMA_VERSION:
        raise LakeTooOld(root, version, LAKE_SCHEMA_VERSION)
    return version


@contextmanager
def lake_lock(root: Path) -> Iterator[None]:
    """One writer at a time (flock: a killed writer's lock goes with it)."""
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LakeError(f"another `bus history` is updating {root}; wait for it") from None
        yield
    finally:
        os.close(fd)


def remove_leftovers(root: Path) -> list[Path]:
    """Delete what a killed writer left in the tables: Spark's staging directories of a
    write that never committed (under the lock, no write is in progress); the paths."""
    removed = []
    for table in root.iterdir():
        if not table.is_dir() or table.name.startswith(("_", ".")):
            continue
        for entry in table.iterdir():
            if entry.is_dir() and (entry.name.startswith(".spark-staging-")
                                   or entry.name == "_temporary"):
                shutil.rmtree(entry)
                removed.append(entry)
    return removed


# --- landing -----------------------------------------------------------------------------


def export_sources(export: Path) -> list[tuple[str, Path]]:
    """(relative name, path) of each export file: the file, or a directory's `*.jsonl`
    files at any depth, leaving out hidden names (`.x`, `_x`) as Spark does."""
    if export.is_file():
        return [("", export)]
    if not export.is_dir():
        raise LakeError(f"no export at {export}; run `bus export` first")
    found = []
    for path in sorted(export.rglob(f"*{PART_SUFFIX}")):
        relative = path.relative_to(export)
        if path.is_file() and not any(part[0] in "._" for part in relative.parts):
            found.append((relative.as_posix(), path))
    return found


def landed(landing: Path) -> dict[str, Chunk]:
    """The last chunk landed of each source."""
    last: dict[str, Chunk] = {}
    for entry in os.scandir(landing):
        chunk = Chunk.parse(entry.name)
        if chunk is not None and (chunk.source not in last or chunk.end > last[chunk.source].end):
            last[chunk.source] = chunk
    return last


def land(export: Path, root: Path) -> list[Chunk]:
    """Copy what each export file gained since the last landing, up to its last complete
    line, into a new chunk each; the chunks made. A torn last line waits for its end.

    Raises LakeError when a file is shorter than what was landed of it (it was
    truncated or replaced: the lake no longer describes it).
    """
    landing = root / LANDING
    landing.mkdir(parents=True, exist_ok=True)
    previous = landed(landing)
    made = []
    for source, path in export_sources(export):
        last = previous.get(source)
        chunk = _land_one(source, path, landing, last.end if last else 0,
                          last.next_line if last else 0)
        if chunk is not None:
            made.append(chunk)
    return made


def _land_one(source: str, path: Path, landing: Path, start: int, first_line: int
              ) -> Chunk | None:
    with open(path, "rb") as file:
        size = os.fstat(file.fileno()).st_size
        if size < start:
            raise LakeError(f"{path} has {size} bytes but {start} of it are in the lake; it was"
                            " truncated or replaced: give --lake a new directory to start over")
        if size == start:
            return None
        file.seek(start)
        temporary = landing / f".{source.replace('/', SEPARATOR) or 'export'}.landing"
        lines, end = 0, start
        with open(temporary, "wb") as out:
            position = start
            while position < size:
                block = file.read(min(COPY_BLOCK, size - position))
                if not block:
                    break
                out.write(block)
                position += len(block)
                newline = block.rfind(b"\n")
                if newline >= 0:
                    end = position - len(block) + newline + 1
                lines += block.count(b"\n")
            out.truncate(end - start)  # the torn line stays for the next landing
            out.flush()
            os.fsync(out.fileno())
    if end == start:
        temporary.unlink()
        return None
    chunk = Chunk(source, start, end, first_line, first_line + lines)
    os.replace(temporary, landing / chunk.name)
    _fsync_directory(landing)
    return chunk


def chunk_count(root: Path) -> int:
    """How many chunks the landing holds."""
    landing = root / LANDING
    if not landing.is_dir():
        return 0
    return sum(1 for entry in os.scandir(landing) if Chunk.parse(entry.name) is not None)


def all_streamed(root: Path, chunks: int) -> bool:
    """Did a stream run that ended take in all of `chunks` landed chunks? Chunks are
    never removed, so the count says; a run killed before its end left no mark of it."""
    try:
        return int((root / LANDING / STREAMED_FILE).read_text()) == chunks
    except (OSError, ValueError):
        return False


def mark_streamed(root: Path, chunks: int) -> None:
    """Record that a stream run took in every one of `chunks` landed chunks."""
    _write_atomically(root / LANDING / STREAMED_FILE, str(chunks).encode())


def locate_lines(chunk_path: Path, texts: list[str]) -> list[tuple[str, int | None, int | None]]:
    """Each text as (text, 1-based line, byte offset) in the export file the chunk came
    from, found in the chunk in order; (text, None, None) for one not found."""
    chunk = Chunk.parse(chunk_path.name)
    wanted: dict[str, int] = {}
    for text in texts:
        wanted[text] = wanted.get(text, 0) + 1
    found = []
    offset = chunk.start if chunk else 0
    line = chunk.first_line if chunk else 0
    with open(chunk_path, "rb") as file:
        for raw in file:
            text = raw.rstrip(b"\r\n").decode("utf-8", "replace")
            if wanted.get(text):
                wanted[text] -= 1
                found.append((text, line + 1, offset))
            offset += len(raw)
            line += 1
    return found + [(text, None, None) for text, left in wanted.items() for _ in range(left)]


def _write_atomically(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    _fsync_directory(path.parent)


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
