"""Docs are tests: every `console` session in README.md and in each page of docs/ runs,
in order, in a scratch directory, and prints what the page shows
(tests/support/readme_transcripts.py has the rules and the placeholders for ids, times and
hashes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.readme_transcripts import Step
from tests.support.readme_transcripts import Transcript
from tests.support.readme_transcripts import normalize
from tests.support.readme_transcripts import prepare
from tests.support.readme_transcripts import run
from tests.support.readme_transcripts import scratch_env
from tests.support.readme_transcripts import transcripts

README = REPO_ROOT / "README.md"
# replication.md's sessions need a real Litestream and nats-server beside them:
# tests/replication/test_docs_replication.py starts those and runs that page's sessions.
RUN_ELSEWHERE = {REPO_ROOT / "docs" / "replication.md"}
PAGES = [README, *sorted(set((REPO_ROOT / "docs").rglob("*.md")) - RUN_ELSEWHERE)]
SESSIONS = [(page, transcript) for page in PAGES for transcript in transcripts(page.read_text())]
TOOLS = ("git", "jq")  # programs the sessions call besides bus and worker


def _page_name(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


def test_readme_and_guides_have_their_sessions() -> None:
    # The README's five-minute path at least; the guides hold the walkthroughs (workers,
    # channels, the pump, coordination, agents).
    pages = {_page_name(page) for page, _ in SESSIONS}
    assert "README.md" in pages, pages
    assert len(SESSIONS) >= 10, [(_page_name(p), t.line) for p, t in SESSIONS]
    assert all(t.steps for _, t in SESSIONS)


@pytest.mark.parametrize(("page", "transcript"), SESSIONS,
                         ids=[f"{_page_name(p)}:{t.name}" for p, t in SESSIONS])
def test_session_prints_what_the_page_shows(page: Path, transcript: Transcript,
                                            tmp_path: Path) -> None:
    for tool in TOOLS:
        if any(f"{tool} " in step.command for step in transcript.steps) and not shutil.which(tool):
            pytest.skip(f"{tool} is not installed; this session of {_page_name(page)} needs it")
    scratch = tmp_path / "app"
    prepare(scratch, transcript, REPO_ROOT)
    outputs = run(transcript, scratch, scratch_env(scratch))
    assert len(outputs) == len(transcript.steps), outputs
    for step, output in zip(transcript.steps, outputs):
        assert normalize(output, scratch) == normalize(step.expected), (
            f"{_page_name(page)}:{transcript.line}: `{step.command}` printed:\n{output}")


def test_transcripts_parse_commands_outputs_and_refuse_an_unclosed_block() -> None:
    text = "intro\n```console\n$ echo a\na\n$ true\n```\n```sh\n$ not a session\n```\n"
    [found] = transcripts(text)
    assert found == Transcript(2, (Step("echo a", "a"), Step("true", "")))
    with pytest.raises(ValueError, match="never closed"):
        transcripts("```console\n$ echo a\n")


def test_normalize_hides_what_changes_between_runs(tmp_path: Path) -> None:
    shown = (f"{tmp_path}/x 5efc7cf8-edbb-4a24-9958-c8688b13c9b1 2026-11-22T18:15:53.312Z"
             " 1795371354983 487a75aa49eb 12s ago  a   b  (schema version 16)\n")
    assert normalize(shown, tmp_path) == ("~/app/x <uuid> <time> <ms> <hash> <age> a b"
                                          " (schema version <version>)")
    assert normalize("(schema version 17)") == normalize("(schema version 16)")


def test_a_session_that_prints_something_else_fails(tmp_path: Path) -> None:
    scratch = tmp_path / "app"
    scratch.mkdir()
    wrong = Transcript(1, (Step("cd /; echo moved", "moved"), Step("pwd", "~/app")))
    outputs = run(wrong, scratch, scratch_env(scratch))
    assert outputs == ["moved", "/"]  # `cd` carried over: the second step does not match
    assert normalize(outputs[1], scratch) != normalize(wrong.steps[1].expected)
