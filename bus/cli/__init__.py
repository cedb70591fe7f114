"""The `bus` command: the bus from the shell (the click group is in bus/cli/root.py).

`bus.cli.main` and the other names of root.py are loaded when first used, so
the console script (bus/cli/entry.py) can answer a Claude Code hook without
loading click and the commands.
"""

from __future__ import annotations

import importlib


def __getattr__(name: str) -> object:
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("bus.cli.root"), name)
