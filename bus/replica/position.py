"""How far the replica is: the last transaction Litestream wrote locally and the replica's.

Litestream turns each change of the WAL into an LTX file named by the
transaction ids it holds (`<min txid>-<max txid>.ltx`), first in the
`.<db>-litestream/ltx/` directory beside the database, then at the replica
under `ltx/<level>/`. The highest txid on each side is its position; the
replica lags by the difference, and by the age of the oldest local file it
has not got. A file:// replica is read directly; another is asked with
`litestream ltx -json` (only where the caller allows a network call).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from bus.replica.binary import locate_litestream
from bus.replica.config import read_config
from bus.replica.errors import LitestreamMissing

REMOTE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ReplicaPosition:
    """The replica of one bus file, as `bus status` shows it.

    `local_txid`: the last transaction Litestream has taken from the WAL (0
    before it ran); `replica_txid`: the last one at the replica (None when it
    could not be read); `lag_txns` and `lag_ms` are 0 when the replica has
    everything Litestream took; `synced_ms` is when the replica last received
    a file (file:// only).
    """

    url: str
    sync_interval: str
    local_txid: int
    replica_txid: int | None
    lag_txns: int | None
    lag_ms: int | None
    synced_ms: int | None


@dataclass(frozen=True)
class _Ltx:
    min_txid: int
    max_txid: int
    mtime_ms: int


def replica_position(db_path: str | os.PathLike[str], *, remote: bool = False,
                     now_ms: int | None = None) -> ReplicaPosition | None:
    """The replica's position for the bus at `db_path`; None when `bus replicate` never ran."""
    config = read_config(db_path)
    if config is None:
        return None
    db = Path(config.db_path)
    local = _ltx_files(db.parent / f".{db.name}-litestream" / "ltx")
    replica = _replica_files(config.url, remote)
    local_txid = max((f.max_txid for f in local), default=0)
    if replica is None:
        return ReplicaPosition(config.url, config.sync_interval, local_txid, None, None, None, None)
    replica_txid = max((f.max_txid for f in replica), default=0)
    behind = [f for f in local if f.max_txid > replica_txid]
    at = int(time.time() * 1000) if now_ms is None else now_ms
    lag_ms = at - min(f.mtime_ms for f in behind) if behind else 0
    synced = max((f.mtime_ms for f in replica), default=None) if replica and \
        replica[0].mtime_ms else None
    return ReplicaPosition(config.url, config.sync_interval, local_txid, replica_txid,
                           max(0, local_txid - replica_txid), max(0, lag_ms), synced)


def _ltx_files(root: Path) -> list[_Ltx]:
    """Every `<min>-<max>.ltx` under `root` (any level), with its modification time."""
    found = []
    for path in root.glob("*/*.ltx") if root.is_dir() else ():
        low, _, high = path.stem.partition("-")
        try:
            found.append(_Ltx(int(low, 16), int(high, 16), int(path.stat().st_mtime * 1000)))
        except (ValueError, FileNotFoundError):  # not Litestream's, or compacted away just now
            continue
    return found


def _replica_files(url: str, remote: bool) -> list[_Ltx] | None:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return _ltx_files(Path(parts.path) / "ltx")
    if not remote:
        return None
    try:
        done = subprocess.run([locate_litestream(), "ltx", "-json", "-level", "all", url],
                              capture_output=True, text=True, timeout=REMOTE_TIMEOUT_S)
        listed = json.loads(done.stdout) if done.returncode == 0 else None
    except (LitestreamMissing, subprocess.TimeoutExpired, ValueError):
        return None
    return [_Ltx(int(f["min_txid"], 16), int(f["max_txid"], 16), 0) for f in listed or []]
