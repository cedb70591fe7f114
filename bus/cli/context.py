"""What every `bus` command shares: the root context, error mapping, --json, --db."""

from __future__ import annotations

from typing import Any

import click
import orjson

from bus.api import MAX_PAYLOAD_BYTES
from bus.api import Bus
from bus.cli.flags import pass_context_of
from bus.cli.flags import typed_name
from bus.storage.db import ENVIRONMENT_ERRORS
from bus.storage.db import environment_error
from bus.storage.errors import BusBusy
from bus.storage.errors import BusError

DEFAULT_DB = ".worker-state/bus.db"
EXIT_BUSY = 75  # EX_TEMPFAIL from sysexits.h: try again later
JSON_ERRORS = "json_errors"  # ctx.meta key: --json was on the command line


class BusyExit(click.ClickException):
    exit_code = EXIT_BUSY


class JsonError(click.ClickException):
    """An error shown as `{"error": ..., "field": ...}` on stderr, for --json callers."""

    def __init__(self, exc: click.ClickException) -> None:
        super().__init__(exc.format_message())
        self.exit_code = exc.exit_code
        self.field = _field_of(exc)

    def show(self, file: Any = None) -> None:
        click.echo(orjson.dumps({"error": self.message, "field": self.field}).decode(), err=True)


class BusGroup(click.Group):
    """The root group of `bus` and `worker`.

    Turns library errors into `Error: ...` with exit 1 (75 when busy), or into a
    JSON error object on stderr when --json is anywhere on the command line.
    SQLite and OS failures of the environment that reach this far (a full
    disk, a corrupt or read-only file) get their named error too: no traceback.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options = args[:args.index("--")] if "--" in args else args
        ctx.meta[JSON_ERRORS] = "--json" in options
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return self._invoke_mapped(ctx)
        except click.ClickException as exc:
            if ctx.meta.get(JSON_ERRORS) and not isinstance(exc, JsonError):
                raise JsonError(exc) from exc
            raise

    def _invoke_mapped(self, ctx: click.Context) -> Any:
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
                 max_payload_bytes: int = MAX_PAYLOAD_BYTES, as_json: bool = False) -> None:
        self.ctx = ctx
        self.db = db
        self.durability = durability
        self.max_payload_bytes = max_payload_bytes
        self.as_json = as_json

    def open(self, create: bool = False) -> Bus:
        return self.ctx.with_resource(Bus.open(self.db, self.durability, create=create,
                                               max_payload_bytes=self.max_payload_bytes))


def json_anywhere(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    """`bus --json CMD` and `bus CMD --json` mean the same."""
    root = ctx.find_object(BusContext)
    return value or bool(root and root.as_json)


def _db_anywhere(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    """`bus CMD --db PATH` sets what `bus --db PATH CMD` sets."""
    root = ctx.find_object(BusContext)
    if value is not None and root is not None:
        root.db = value


def _field_of(exc: BaseException) -> str | None:
    """The flag a bad parameter names as typed (--from), else a library error's field."""
    if isinstance(exc, click.BadParameter):
        if exc.param is not None:
            return typed_name(exc.param)
        if isinstance(exc.param_hint, str):
            return exc.param_hint
    if isinstance(getattr(exc, "field", None), str):  # flags.FlagRefused
        return exc.field
    cause = exc.__cause__
    if cause is not None and getattr(cause, "field", None):
        return str(getattr(cause, "field"))
    return None


pass_bus_context = pass_context_of(BusContext)
json_option = click.option("--json", "as_json", is_flag=True, callback=json_anywhere,
                           help="Print JSON; streams print one object per line.")
DB_OPTION_NAME = "db_after_command"


def db_option() -> click.Option:
    """The --db a subcommand accepts after its name (no envvar: the root reads BUS_DB)."""
    return click.Option(["--db", DB_OPTION_NAME], type=click.Path(dir_okay=False),
                        expose_value=False, callback=_db_anywhere,
                        help="Bus database file (also accepted before the command).")
