"""The README's five-minute path, as written, from the core wheel alone.

A newcomer runs `pip install agentbus` (no extras: no views, MCP or Spark), then the
README's `bus` session and its Python example. Both run here through the installed
commands and interpreter, in a scratch directory far from the source tree, and print what
the README shows (tests/support/readme_transcripts.py has the placeholders).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.journeys.conftest import ROOT
from tests.support.readme_transcripts import normalize
from tests.support.readme_transcripts import run
from tests.support.readme_transcripts import scratch_env
from tests.support.readme_transcripts import transcripts

pytestmark = pytest.mark.slow

README = (ROOT / "README.md").read_text()


def test_readme_path_runs_from_the_core_wheel(install_wheel, tmp_path: Path) -> None:
    core = install_wheel("")
    sessions = transcripts(README)
    assert sessions, "the README shows no `bus` session"
    for session in sessions:
        if any("git " in step.command for step in session.steps) and not shutil.which("git"):
            pytest.skip("git is not installed; a README session needs it")
        scratch = tmp_path / f"app-{session.line}" / "app"
        scratch.mkdir(parents=True)
        env = scratch_env(scratch, core.prefix / "bin")
        outputs = run(session, scratch, env)
        for step, output in zip(session.steps, outputs, strict=True):
            assert normalize(output, scratch) == normalize(step.expected), (
                f"README.md:{session.line}: `{step.command}` printed:\n{output}")

    [example] = [block for block in re.findall(r"```python\n(.*?)```", README, re.S)
                 if "process_loop(" in block]
    shown = [line.split("# prints ", 1)[1] for line in example.splitlines()
             if "# prints " in line]
    done = core.run("python", "-c", example, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == sorted(shown)
