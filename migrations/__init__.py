"""The schema's NNNN_name.sql files, installed as the package `bus.migrations`.

A package so that the code finds them one way, by importing it, both in a
checkout (setup.cfg's package_dir maps it here) and in a wheel (bus/migrations/).
"""

from __future__ import annotations

import os
import re

NAME = re.compile(r"(\d{4})_(\w+)\.sql")  # NNNN_name.sql: NNNN is the schema version it makes


def newest_version() -> int:
    """The schema version the newest file here makes: the one this code reads and writes.

    Read from the file names alone, so that a Claude Code hook's fast path
    (bus/cli/entry.py) can check a file's version without loading the runner.
    """
    found = [NAME.fullmatch(name) for name in os.listdir(os.path.dirname(__file__))]
    return max((int(match.group(1)) for match in found if match), default=0)
