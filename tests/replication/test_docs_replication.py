"""Docs are tests: the console sessions of docs/replication.md run as tests/project/test_readme.py
runs the README's (tests/support/readme_transcripts.py), with the real Litestream and nats-server."""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path

import pytest

from bus.replica.binary import locate_litestream
from bus.replica.errors import LitestreamMissing
from tests.conftest import REPO_ROOT
from tests.support.nats_servers import nats_server_binary
from tests.support.readme_transcripts import Transcript
from tests.support.readme_transcripts import normalize
from tests.support.readme_transcripts import prepare
from tests.support.readme_transcripts import run
from tests.support.readme_transcripts import scratch_env
from tests.support.readme_transcripts import transcripts

DOC = REPO_ROOT / "docs" / "replication.md"
# Both sessions share one scratch directory: the mirror's mirrors the replica's bus.
SESSIONS = transcripts(DOC.read_text())
_AGE = re.compile(r"\b\d+\.\d s ago\b")  # `bus consumers`' last ack, as it shows it


def _missing() -> str | None:
    try:
        locate_litestream()
    except LitestreamMissing:
        return "litestream"
    if nats_server_binary() is None:
        return "nats-server"
    with socket.socket() as sock:
        if sock.connect_ex(("127.0.0.1", 4222)) == 0:
            return "a free port 4222 (something listens there)"
    return None


def test_docs_replication_has_its_sessions() -> None:
    assert [t.steps[0].command for t in SESSIONS][:1] == ["bus init"]
    assert len(SESSIONS) == 3


def run_sessions(scratch: Path, env: dict[str, str]) -> None:
    """Every session of the doc in `scratch`, with `env`'s commands, printing what it shows."""
    missing = _missing()
    if missing:
        pytest.skip(f"docs/replication.md needs {missing}")
    for transcript in SESSIONS:
        prepare(scratch, transcript, REPO_ROOT)
        outputs = run(transcript, scratch, env, timeout=120)
        assert len(outputs) == len(transcript.steps), outputs
        for step, output in zip(transcript.steps, outputs):
            shown = _AGE.sub("<age>", normalize(output, scratch))
            assert shown == normalize(step.expected), (
                f"docs/replication.md:{transcript.line}: `{step.command}` printed:\n{output}")


def test_docs_replication_sessions_print_what_the_doc_shows(tmp_path: Path) -> None:
    scratch = tmp_path / "app"
    run_sessions(scratch, scratch_env(scratch))


def test_docs_replication_links_the_remote_doc() -> None:
    assert "(remote.md)" in DOC.read_text() and (REPO_ROOT / "docs" / "remote.md").is_file()
    assert shutil.which("bash")
