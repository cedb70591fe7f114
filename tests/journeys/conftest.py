"""Journeys: what a person does, end to end, from the built wheel.

The wheel is built once per session from a copy of this tree (so the build
writes nothing here), installed into fresh venvs with no source tree on the
path, and every journey acts through the installed `bus` and `worker`
commands only. A venv per set of extras is made once and shared.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a wheel is built from: the tree as a user gets it, not its caches and outputs.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "venv", "demo", "build", "dist",
                                    "*.egg-info", "__pycache__", ".pytest_cache",
                                    ".hypothesis", ".worker-state")

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Installed:
    """A venv with the wheel installed, and a scratch directory to act in."""

    prefix: Path
    home: Path  # the working directory of every command: far from the source tree

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a person who activated the venv, and nothing of ours."""
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "BUS_DB", "VIRTUAL_ENV", "PYTHONHOME")}
        env["PATH"] = os.pathsep.join([str(self.prefix / "bin"), env.get("PATH", "")])
        env["VIRTUAL_ENV"] = str(self.prefix)
        env.update(extra)
        return env

    def command(self, name: str) -> str:
        return str(self.prefix / "bin" / name)

    def run(self, *argv: str, cwd: Path | None = None, input: str | None = None,
            timeout: float = 120, env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """Run an installed command (`bus`, `worker`, `python`) and capture its output."""
        return subprocess.run([self.command(argv[0]), *argv[1:]], cwd=cwd or self.home,
                              env=env or self.env(), input=input, text=True,
                              capture_output=True, timeout=timeout)

    def popen(self, *argv: str, cwd: Path | None = None, env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen[str]:
        return subprocess.Popen([self.command(argv[0]), *argv[1:]], cwd=cwd or self.home,
                                env=env or self.env(), text=True, **kwargs)


def build_wheel(out: Path, scratch: Path) -> Path:
    source = scratch / "source"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--wheel-dir", str(out), str(source)], check=True)
    (wheel,) = out.glob("agentbus-*.whl")
    return wheel


def install(wheel: Path, prefix: Path, extras: str) -> None:
    venv.EnvBuilder(with_pip=True, clear=True).create(prefix)
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    subprocess.run([str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    target], check=True)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("build"))


@pytest.fixture(scope="session")
def install_wheel(wheel: Path, tmp_path_factory: pytest.TempPathFactory):
    """`install_wheel("views")`: a venv with the wheel and those extras ("" for the core)."""
    made: dict[str, Installed] = {}

    def installed(extras: str = "all") -> Installed:
        if extras not in made:
            prefix = tmp_path_factory.mktemp(f"venv-{extras or 'core'}")
            install(wheel, prefix, extras)
            made[extras] = Installed(prefix, tmp_path_factory.mktemp("home"))
        return made[extras]

    return installed


@pytest.fixture(scope="session")
def installed(install_wheel) -> Installed:
    """The wheel with every extra, as the README's commands install it."""
    return install_wheel("all")


@pytest.fixture
def home(installed: Installed, tmp_path: Path) -> Path:
    """A scratch working directory for one journey."""
    return tmp_path
