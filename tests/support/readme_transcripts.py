"""Run the shell sessions of a Markdown file (README.md, a page of docs/) and compare them
with what they show.

A session is a fenced block tagged `console`: lines starting with `$ ` are
commands, the lines after each command (up to the next `$ `) its output,
stdout and stderr together. The whole block runs as ONE bash script in a
scratch directory `.../app`, so `cd`, variables, `&` and `kill %1` carry
from one command to the next; each command's output is cut out of the
script's output by markers echoed between commands. Background jobs still
running at the end are waited for, and what they print counts as the last
command's output (`kill %1` then shows what the killed job printed).

What differs from run to run is replaced by placeholders on both sides
(`normalize`): the scratch directory shows as `~/app`, UUIDs, ISO times,
epoch milliseconds, git hashes, `Ns ago` and the schema version (`bus init`
names the newest, which each migration moves); runs of spaces count as one.

    python -m tests.support.readme_transcripts docs/channels.md   # print each block as it runs now

(a quick way to refresh a transcript after changing a command's output).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

FENCE = "```"
LANGUAGE = "console"
PROMPT = "$ "
SHOWN_AS = "~/app"  # how the scratch directory appears in the pages
_PLACEHOLDERS = [
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<uuid>"),
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"), "<time>"),
    (re.compile(r"\b1\d{12}\b"), "<ms>"),
    (re.compile(r"\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"), "<hash>"),
    (re.compile(r"\b\d+s ago\b"), "<age>"),
    # The newest schema version goes up with each migration; the README shows one of them.
    (re.compile(r"\bschema version \d+\b"), "schema version <version>"),
    (re.compile(r"[ \t]+"), " "),
]


@dataclass(frozen=True)
class Step:
    command: str
    expected: str  # the output as the page shows it


@dataclass(frozen=True)
class Transcript:
    line: int  # where the block starts in the file (1-based), for messages
    steps: tuple[Step, ...]

    @property
    def name(self) -> str:
        return f"line-{self.line}"


def transcripts(markdown: str) -> list[Transcript]:
    """The `console` blocks of `markdown`, in order."""
    found, block, start = [], None, 0
    for number, line in enumerate(markdown.splitlines(), 1):
        if block is None and line.strip() == FENCE + LANGUAGE:
            block, start = [], number
        elif block is not None and line.strip() == FENCE:
            found.append(Transcript(start, tuple(_steps(block, start))))
            block = None
        elif block is not None:
            block.append(line)
    if block is not None:
        raise ValueError(f"the {LANGUAGE} block at line {start} is never closed")
    return found


def _steps(lines: list[str], start: int) -> list[Step]:
    if lines and not lines[0].startswith(PROMPT):
        raise ValueError(f"the {LANGUAGE} block at line {start} must start with a `$ ` command")
    steps: list[tuple[str, list[str]]] = []
    for line in lines:
        if line.startswith(PROMPT):
            steps.append((line[len(PROMPT):], []))
        else:
            steps[-1][1].append(line)
    return [Step(command, "\n".join(output)) for command, output in steps]


def run(transcript: Transcript, scratch: Path, env: dict[str, str],
        timeout: float = 300) -> list[str]:
    """Run the block's commands in `scratch` with bash; each command's output."""
    marker = f"@@step-{uuid.uuid4().hex}@@"
    script = ["exec 2>&1"]
    for number, step in enumerate(transcript.steps):
        script += [f"echo '{marker}{number}'", step.command]
    script += ["wait", f"echo '{marker}end'"]
    done = subprocess.run(["bash", "-c", "\n".join(script)], cwd=scratch, env=env,
                          stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                          timeout=timeout)
    parts = re.split(re.escape(marker) + r"(?:\d+|end)\n", done.stdout)
    return [part.rstrip("\n") for part in parts[1:len(transcript.steps) + 1]]


def normalize(text: str, scratch: Path | None = None) -> str:
    if scratch is not None:
        for shown in {str(scratch.resolve()), str(scratch)}:
            text = text.replace(shown, SHOWN_AS)
    for pattern, placeholder in _PLACEHOLDERS:
        text = pattern.sub(placeholder, text)
    return "\n".join(line.rstrip() for line in text.splitlines())


def scratch_env(scratch: Path, bin_dir: Path | None = None) -> dict[str, str]:
    """The commands' environment: `bin_dir`'s `bus` and `worker` first on PATH (this
    checkout's by default; an installed wheel's for a journey), a HOME and git identity of
    their own, fixed git dates (so commit ids repeat), unbuffered Python (so stdout and
    stderr interleave as on a terminal)."""
    home = scratch.parent / "home"
    home.mkdir(exist_ok=True)
    bin_dir = str(bin_dir or Path(sys.executable).parent)
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("BUS_", "GIT_", "CLAUDE_"))}
    env.update({
        "PATH": os.pathsep.join([bin_dir, env.get("PATH", "")]),
        "HOME": str(home), "GIT_CONFIG_GLOBAL": str(home / "gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CEILING_DIRECTORIES": str(scratch.parent),
        "GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada", "GIT_COMMITTER_EMAIL": "ada@example.com",
        "GIT_AUTHOR_DATE": "2026-11-22T12:00:00Z", "GIT_COMMITTER_DATE": "2026-11-22T12:00:00Z",
        "PYTHONUNBUFFERED": "1",
    })
    return env


def prepare(scratch: Path, transcript: Transcript, project: Path) -> None:
    """Copy into `scratch` the project files a block uses (examples/ for the pump)."""
    scratch.mkdir(parents=True, exist_ok=True)
    if any("examples/" in step.command for step in transcript.steps):
        shutil.copytree(project / "examples", scratch / "examples")


def main(argv: list[str]) -> int:
    import tempfile

    path = Path(argv[0])
    project = Path(__file__).resolve().parents[2]
    for transcript in transcripts(path.read_text()):
        with tempfile.TemporaryDirectory() as tmp:
            scratch = Path(tmp) / "app"
            prepare(scratch, transcript, project)
            outputs = run(transcript, scratch, scratch_env(scratch))
            print(f"--- {path}:{transcript.line}")
            for step, output in zip(transcript.steps, outputs):
                print(PROMPT + step.command)
                if output:
                    print(output.replace(str(scratch), SHOWN_AS))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
