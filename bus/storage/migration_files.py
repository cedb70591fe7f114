"""The schema versions this code knows: the migrations/NNNN_name.sql files (bus.migrations).

Apart from the runner (bus/storage/schema.py) so that opening a file (bus/storage/db.py) can
refuse a schema newer than the code before it changes anything, without the
runner and the connection importing each other.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import bus.migrations

# One place: the package `bus.migrations` (setup.cfg maps it to the top-level
# migrations/ folder), wherever the install put it.
MIGRATIONS_DIR = Path(bus.migrations.__file__).resolve().parent
# A migration whose leading comments hold this line changes nothing a reader
# sees (the same tables, columns and rows to SELECT): the read-only views of
# this code read a file that still lacks it, as they read one that has it.
READERS_UNCHANGED = "-- readers: unchanged"


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    def sql(self) -> str:
        return self.path.read_text(encoding="utf-8")

    def readers_unchanged(self) -> bool:
        """Whether the file says (READERS_UNCHANGED) that readers see no change."""
        with self.path.open(encoding="utf-8") as lines:
            for line in lines:
                if not line.startswith("--"):
                    return False
                if line.startswith(READERS_UNCHANGED):
                    return True
        return False


def migrations_in(directory: Path) -> tuple[Migration, ...]:
    """The migration files of `directory` in version order; numbering must run 1, 2, 3, ..."""
    found = []
    for path in directory.glob("*.sql"):
        match = bus.migrations.NAME.fullmatch(path.name)
        if match:
            found.append(Migration(int(match.group(1)), match.group(2), path))
    found.sort(key=lambda m: m.version)
    versions = [m.version for m in found]
    if versions != list(range(1, len(found) + 1)):
        raise RuntimeError(f"migrations in {directory} are not numbered 1..n: {versions}")
    return tuple(found)


@functools.cache
def supported_version() -> int:
    """The newest schema version this code can read and write (the last migration's)."""
    return bus.migrations.newest_version()
