"""Running Litestream beside the bus: `litestream replicate` on the configuration, and restore.

`bus replicate` replaces itself with Litestream (exec), so the process a
supervisor starts, signals and waits for is Litestream's own: a SIGTERM lets
it finish its last sync, and a kill -9 is a kill -9 of Litestream.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bus.storage.db import check_database
from bus.replica.binary import locate_litestream
from bus.replica.config import config_path
from bus.replica.config import validate_url
from bus.replica.errors import RestoreFailed
from bus.replica.errors import RestoreTargetExists

RESTORE_TIMEOUT_S = 600.0
_SIDECARS = ("", "-wal", "-shm")


def replicate_argv(db_path: str | os.PathLike[str]) -> list[str]:
    """The command line that replicates the bus by its litestream.yml."""
    return [locate_litestream(), "replicate", "-config", os.fspath(config_path(db_path))]


def exec_replicate(db_path: str | os.PathLike[str]) -> None:
    """Become `litestream replicate` for the bus at `db_path` (never returns)."""
    argv = replicate_argv(db_path)
    os.execv(argv[0], argv)


def restore(url: str, target: str | os.PathLike[str]) -> Path:
    """Restore the replica at `url` into the new file `target`, and check what came back.

    Litestream checks the file it wrote (`-integrity-check full`); then the
    bus's own check must pass too (integrity_check on a read-only connection,
    which also refuses a file that is not a bus). Raises RestoreTargetExists
    when `target` (or its -wal/-shm) is there: a restore never overwrites.
    Raises RestoreFailed, leaving nothing at `target`, when either step fails.
    """
    validate_url(url)
    path = Path(target).absolute()
    for suffix in _SIDECARS:
        if Path(f"{path}{suffix}").exists():
            raise RestoreTargetExists(str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([locate_litestream(), "restore", "-integrity-check", "full",
                           "-o", str(path), url],
                          capture_output=True, text=True, timeout=RESTORE_TIMEOUT_S)
    if done.returncode != 0:
        _remove(path)
        raise RestoreFailed(url, _last_line(done.stderr or done.stdout))
    report = check_database(path, full=True)
    if not report.ok:
        _remove(path)
        raise RestoreFailed(url, "the restored file fails the bus's integrity check: "
                            + "; ".join(report.problems))
    return path


def _remove(path: Path) -> None:
    for suffix in _SIDECARS:
        Path(f"{path}{suffix}").unlink(missing_ok=True)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "litestream said nothing"
