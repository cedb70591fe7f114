"""The installed commands run the installed package, not this checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_installed_package_is_the_wheels_not_the_checkout(installed, home: Path) -> None:
    found = installed.run("python", "-c", "import bus, workers; print(bus.__file__)", cwd=home)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(installed.prefix)
    version = installed.run("bus", "--version", cwd=home)
    assert version.returncode == 0 and "0.1.0" in version.stdout


def test_installed_package_finds_its_migrations_in_the_wheel(installed, home: Path) -> None:
    """The schema files ship as bus.migrations; a new bus is created at the newest version."""
    shipped = sorted(p.name for p in (ROOT / "migrations").glob("*.sql"))
    found = installed.run("python", "-c", "from bus.storage.schema import MIGRATIONS_DIR as d,"
                          " available_migrations as a; print(d);"
                          " print(*[m.path.name for m in a()])", cwd=home)
    assert found.returncode == 0, found.stderr
    where, names = found.stdout.splitlines()
    assert Path(where).is_relative_to(installed.prefix) and Path(where).name == "migrations"
    assert names.split() == shipped
    created = installed.run("bus", "--db", str(home / "b.db"), "init", cwd=home)
    assert created.returncode == 0, created.stderr
    status = installed.run("bus", "--db", str(home / "b.db"), "migrate", "--status", cwd=home)
    assert status.returncode == 0, status.stderr
    assert status.stdout.startswith(f"schema version {len(shipped)} (latest {len(shipped)})")
