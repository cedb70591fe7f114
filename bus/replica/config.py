"""The Litestream configuration `bus replicate` writes beside the bus file.

One database, one replica. Litestream checks the WAL every `monitor-interval`
and ships what it found every `sync-interval`, so a write waits up to the sum
of the two (plus the upload) before it is at the replica. The interval the
user gives is that bound: Litestream gets a tenth of it to notice a write and
eight tenths to ship it, which leaves a tenth for the upload. What a lost host
can lose is the writes newer than that (docs/replication.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from bus.replica.errors import ReplicaUrlInvalid
from bus.replica.errors import SyncIntervalInvalid

CONFIG_NAME = "litestream.yml"
DEFAULT_SYNC_INTERVAL = "1s"
MIN_SYNC_MS = 100
# The replica types Litestream 0.5 takes as a URL (https://litestream.io/reference/config/).
SCHEMES = ("file", "s3", "sftp", "gs", "abs", "webdav", "webdavs")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class ReplicaConfig:
    """What `bus replicate` configured for one bus file."""

    db_path: str  # absolute
    url: str
    sync_interval: str  # a Go duration, as Litestream reads it

    @property
    def sync_seconds(self) -> float:
        return duration_seconds(self.sync_interval)


def config_path(db_path: str | os.PathLike[str]) -> Path:
    """Where the configuration of the bus at `db_path` lives: beside it."""
    return Path(db_path).absolute().parent / CONFIG_NAME


def duration_seconds(text: str) -> float:
    """`"500ms"` -> 0.5; raises SyncIntervalInvalid for anything else than one number and unit."""
    found = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if found is None or float(found.group(1)) <= 0:
        raise SyncIntervalInvalid(str(text))
    return float(found.group(1)) * _SECONDS[found.group(2)]


def sync_interval_seconds(text: str) -> float:
    """A --sync-interval in seconds: a duration of at least MIN_SYNC_MS (a tenth of it is
    Litestream's monitor interval, which must stay a whole, non-zero number of ms)."""
    seconds = duration_seconds(text)
    if seconds * 1000 < MIN_SYNC_MS:
        raise SyncIntervalInvalid(str(text), f"is under {MIN_SYNC_MS}ms")
    return seconds


def validate_url(url: str) -> str:
    """The URL as Litestream takes it; raises ReplicaUrlInvalid naming what is wrong."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise ReplicaUrlInvalid(url, "is not a replica URL: it must start with one of "
                                + ", ".join(f"{s}://" for s in SCHEMES))
    if parts.scheme == "file" and (parts.netloc or not parts.path.startswith("/")):
        raise ReplicaUrlInvalid(url, "must name an absolute directory: file:///path/to/replica")
    if parts.scheme != "file" and not parts.netloc:
        raise ReplicaUrlInvalid(url, f"names no bucket or host after {parts.scheme}://")
    return url


def replica_config(db_path: str | os.PathLike[str], url: str,
                   sync_interval: str = DEFAULT_SYNC_INTERVAL) -> ReplicaConfig:
    """A checked configuration for replicating `db_path` to `url`."""
    sync_interval_seconds(sync_interval)
    return ReplicaConfig(os.fspath(Path(db_path).absolute()), validate_url(url),
                         sync_interval.strip())


def config_text(config: ReplicaConfig) -> str:
    """The litestream.yml for `config`, in Litestream's own keys."""
    monitor_ms, ship_ms = litestream_intervals_ms(config.sync_seconds)
    return yaml.safe_dump({"dbs": [{
        "path": config.db_path,
        "monitor-interval": f"{monitor_ms}ms",
        "replica": {"url": config.url, "sync-interval": f"{ship_ms}ms"},
    }]}, sort_keys=False)


def litestream_intervals_ms(sync_seconds: float) -> tuple[int, int]:
    """Litestream's (monitor-interval, sync-interval) in ms for a write-to-replica bound:
    a tenth to notice, the bound less two tenths to ship (the last tenth is the upload's)."""
    bound_ms = round(sync_seconds * 1000)
    monitor_ms = bound_ms // 10
    return monitor_ms, bound_ms - 2 * monitor_ms


def _bound_text(monitor: str, ship: str) -> str:
    """The user's interval back from the two litestream_intervals_ms wrote."""
    bound_ms = round((2 * duration_seconds(monitor) + duration_seconds(ship)) * 1000)
    return f"{bound_ms // 1000}s" if bound_ms % 1000 == 0 else f"{bound_ms}ms"


def write_config(config: ReplicaConfig) -> Path:
    """Write litestream.yml beside the bus (replacing an earlier one atomically)."""
    target = config_path(config.db_path)
    scratch = target.with_name(f".{CONFIG_NAME}.tmp")
    scratch.write_text(config_text(config))
    os.replace(scratch, target)
    return target


def read_config(db_path: str | os.PathLike[str]) -> ReplicaConfig | None:
    """The configuration `bus replicate` wrote for `db_path`, or None (not replicated)."""
    try:
        loaded = yaml.safe_load(config_path(db_path).read_text())
    except (FileNotFoundError, yaml.YAMLError):
        return None
    wanted = os.fspath(Path(db_path).absolute())
    for db in (loaded or {}).get("dbs", []) if isinstance(loaded, dict) else []:
        replica = db.get("replica") if isinstance(db, dict) else None
        if db.get("path") == wanted and isinstance(replica, dict) and replica.get("url"):
            monitor = str(db.get("monitor-interval", "100ms"))
            ship = str(replica.get("sync-interval", "800ms"))
            return ReplicaConfig(wanted, str(replica["url"]), _bound_text(monitor, ship))
    return None
