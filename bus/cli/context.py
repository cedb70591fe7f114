"""What every `bus` command shares: the root context, error mapping, --json."""

from __future__ import annotations

from typing import Any

import click

from bus.api import MAX_PAYLOAD_BYTES
from bus.api import Bus
from bus.db import ENVIRONMENT_ERRORS
from bus.db import environment_error
from bus.errors import BusBusy
from bus.errors import BusError

DEFAULT_DB = ".worker-state/bus.db"
EXIT_BUSY = 75  # EX_TEMPFAIL from sysexits.h: try again later


class BusyExit(click.ClickException):
    exit_code = EXIT_BUSY


class BusGroup(click.Group):
    """Turns library errors into `Error: ...` with exit 1 (75 when busy).

    SQLite and OS failures of the environment that reach this far (a full
    disk, a corrupt or read-only file) get their named error too: no traceback.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (*ENVIRONMENT_ERRORS, OSError) as exc:
            named = environment_error(exc, getattr(ctx.obj, "db", ""))
            if named is None:
                raise
            raise _click_error(named) from exc
        except BusError as exc:
            raise _click_error(exc) from exc


def _click_error(exc: BusError) -> click.ClickException:
    if isinstance(exc, BusBusy):
        return BusyExit(str(exc))
    return click.ClickException(str(exc))


class BusContext:
    """What the root command knows; opens the bus on first use, closes it at exit."""

    def __init__(self, ctx: click.Context, db: str, durability: str,
                 max_payload_bytes: int = MAX_PAYLOAD_BYTES) -> None:
        self.ctx = ctx
        self.db = db
        self.durability = durability
        self.max_payload_bytes = max_payload_bytes

    def open(self, create: bool = False) -> Bus:
        return self.ctx.with_resource(Bus.open(self.db, self.durability, create=create,
                                               max_payload_bytes=self.max_payload_bytes))


pass_bus_context = click.make_pass_decorator(BusContext)
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON; streams print one object per line.")
