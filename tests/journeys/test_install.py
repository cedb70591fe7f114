"""The installed commands run the installed package, not this checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_installed_package_is_the_wheels_not_the_checkout(installed, home: Path) -> None:
    found = installed.run("python", "-c", "import bus, workers; print(bus.__file__)", cwd=home)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(installed.prefix)
    version = installed.run("bus", "--version", cwd=home)
    assert version.returncode == 0 and "0.1.0" in version.stdout
