"""Library errors in the words of the command line: the flag typed, not the Python name.

The library names its arguments (`ValidationFailed.field` is "from_agent",
"type", "seq"...); a person typed `--from`, `--type`, `--seq`. Every command
receives its context through `pass_context_of`, which turns a library error
whose field is one of the command's parameters into a usage error about that
parameter (exit 2, `Invalid value for '--from': ...`), as click does for the
values its own types refuse. With --json the error's `field` is the flag.
"""

from __future__ import annotations

import functools
import re
from typing import Any
from typing import Callable
from typing import TypeVar

import click

from bus.storage.errors import BusError
from bus.storage.errors import ValidationFailed

T = TypeVar("T")

# Library fields whose parameter may have another name on the command line,
# tried after the field's own name.
_OTHER_NAMES = {
    "message": ("seq",),            # bus channel acknowledge --seq: the message's seq
    "id": ("dead_letter_id",),      # bus dlq show/replay/discard ID
    "channel": ("name",),           # bus channel join/show/pause... NAME
    "client": ("client_id",),       # bus pump send --from
}
_KEYWORD_TRUE = re.compile(r"\b([a-z_]+)=True\b")  # "pass force=True" in a library reason


def pass_context_of(kind: type[T]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like click.make_pass_decorator(kind); a library error naming a parameter of
    the command becomes a usage error about the flag the user typed."""
    def decorator(f: Callable[..., Any]) -> Callable[..., Any]:
        def new_func(*args: Any, **kwargs: Any) -> Any:
            ctx = click.get_current_context()
            obj = ctx.find_object(kind)
            if obj is None:
                raise RuntimeError(f"no {kind.__name__} on the context of {ctx.command.name}")
            try:
                return ctx.invoke(f, obj, *args, **kwargs)
            except BusError as exc:
                refused = as_refusal(ctx, exc)
                if refused is not None:
                    raise refused from exc
                usage = as_usage_error(ctx, exc)
                if usage is None:
                    exc.args = (in_flags(ctx.command, str(exc)),)  # allow_empty=True: --allow-empty
                    raise
                raise usage from exc
        return functools.update_wrapper(new_func, f)
    return decorator


class FlagRefused(click.ClickException):
    """A well-formed value the bus's state refuses (a stale --fence): exit 1, not a
    usage error (exit 2), and with --json the error's `field` is the flag typed."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def as_refusal(ctx: click.Context, exc: BusError) -> FlagRefused | None:
    """The refusal naming the flag of `exc.field`, for library errors that say the
    value is out of date (`refused_by_state`), or None."""
    field = getattr(exc, "field", None)
    if not getattr(exc, "refused_by_state", False) or not isinstance(field, str):
        return None
    param = parameter_of(ctx.command, field)
    if param is None:
        return None
    flag = typed_name(param)
    reason = getattr(exc, "reason", None) or str(exc).removeprefix(f"{field}: ")
    return FlagRefused(f"{flag} {in_flags(ctx.command, reason)}", flag)


def as_usage_error(ctx: click.Context, exc: BusError) -> click.BadParameter | None:
    """The usage error naming the parameter `exc.field` is, or None when it is none of them."""
    field = getattr(exc, "field", None)
    param = parameter_of(ctx.command, field) if isinstance(field, str) else None
    if param is None:
        return None
    param = _given_instead(ctx, param)
    if isinstance(exc, ValidationFailed):
        reason = exc.reason
    else:  # a BusError with a field: its message starts with "field: "
        reason = str(exc).removeprefix(f"{field}: ")
    return click.BadParameter(in_flags(ctx.command, reason), ctx=ctx, param=param)


def parameter_of(command: click.Command, field: str) -> click.Parameter | None:
    """The command's parameter a library field names: `from_agent` is --from, `type` --type."""
    field = field.rsplit(".", 1)[-1]  # "filter.limit": the filter's limit
    for name in (field, *_OTHER_NAMES.get(field, ())):
        dashed = "--" + name.replace("_", "-")
        for param in command.params:
            if param.expose_value and (param.name in (name, f"{name}_") or dashed in param.opts):
                return param
    return None


def _given_instead(ctx: click.Context, param: click.Parameter) -> click.Parameter:
    """The sibling the value came from when `param` was not typed (--payload-file for --payload)."""
    if ctx.get_parameter_source(param.name) not in (None, click.core.ParameterSource.DEFAULT):
        return param
    typed = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    return next((p for p in ctx.command.params if p.name and p.name.startswith(f"{param.name}_")
                 and ctx.get_parameter_source(p.name) in typed), param)


def typed_name(param: click.Parameter) -> str:
    """What the user typed for `param`: its long flag (--from), or its argument's name (AGENT)."""
    if isinstance(param, click.Option):
        return next((o for o in param.opts if o.startswith("--")), param.opts[0])
    return param.human_readable_name.strip("[]")  # an optional argument's metavar is [SEQ]


def in_flags(command: click.Command, reason: str) -> str:
    """`reason` with each `name=True` of a flag of `command` written as that flag."""
    flags = {p.name: typed_name(p) for p in command.params
             if isinstance(p, click.Option) and p.is_flag}

    def flag(match: re.Match[str]) -> str:
        return flags.get(match.group(1), match.group(0))
    return _KEYWORD_TRUE.sub(flag, reason)
