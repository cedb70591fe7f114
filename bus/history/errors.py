"""The history lake's errors (re-exported by bus.storage.errors, as every part's are), and how
one is told in a line."""

from __future__ import annotations

from pathlib import Path

from bus.storage.errors import BusError


class LakeError(BusError):
    """The lake or the export cannot be used as they are."""


class LakeTooNew(LakeError):
    """The lake was written by a newer agentbus, whose tables this one may misread."""

    def __init__(self, path: Path, found: int, supported: int) -> None:
        super().__init__(f"the history lake {path} has schema version {found}, newer than"
                         f" {supported}, the newest this agentbus reads; upgrade agentbus"
                         " or give a new --lake directory")
        self.path, self.found, self.supported = path, found, supported


class LakeTooOld(LakeError):
    """The lake was written by an older agentbus, without tables this one reads."""

    def __init__(self, path: Path, found: int, supported: int) -> None:
        super().__init__(f"the history lake {path} has schema version {found}, older than"
                         f" {supported}, and lacks tables this agentbus reads; delete it (or"
                         " give a new --lake directory) and run again: it is rebuilt from"
                         " the export")
        self.path, self.found, self.supported = path, found, supported


class ServerError(BusError):
    """The history's Spark Connect server (`bus history serve`) could not be started."""


def first_line(exc: BaseException) -> str:
    """The first line of an error's text (Spark's run to pages of plan), else its type."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
