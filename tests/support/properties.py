"""A property's own example count, scaled to the profile that runs it.

A test that asks for `max_examples=N` would override any profile, so `make check`'s
("check": a fifth of the examples, fewer steps) would not reach it. `scaled_settings`
keeps each test's count in proportion instead: the full count under the default
profile (`make test`, CI), the same share as the profile's under "check".
"""

from __future__ import annotations

from typing import Any

from hypothesis import settings

FULL_PROFILE = "agentbus"  # tests/conftest.py registers it and `make test` runs it


def scaled_settings(max_examples: int, stateful_step_count: int | None = None,
                    **more: Any) -> settings:
    """`settings(max_examples=..., stateful_step_count=..., **more)`, in the running
    profile's proportion to the full one."""
    full, running = settings.get_profile(FULL_PROFILE), settings.default
    examples = max(1, round(max_examples * running.max_examples / full.max_examples))
    if stateful_step_count is not None:
        more["stateful_step_count"] = max(5, round(
            stateful_step_count * running.stateful_step_count / full.stateful_step_count))
    return settings(max_examples=examples, **more)
