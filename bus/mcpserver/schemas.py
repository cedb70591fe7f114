"""Tools' input schemas as listed: what a model needs of pydantic's, and no more.

Every model request carries the listed schemas, so each byte is paid on every
turn. pydantic's schema of a tool's arguments gives each one a `title` (its own
name again), spells an optional argument `anyOf: [T, null]` with `default: null`,
and titles the whole object. The listed schema leaves those out: an optional
argument is one not in `required`. The arguments are still validated by the
tool's pydantic model, which accepts null for an optional argument as before.
"""

from __future__ import annotations

from typing import Any

NULL = {"type": "null"}
# Keywords whose value maps names to schemas, not a schema itself (a property may be
# named "title").
NAMED_SCHEMAS = ("properties", "$defs")


def lean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` without titles, null defaults and the null branch of an optional argument."""
    lean: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" or (key == "default" and value is None):
            continue
        if key in NAMED_SCHEMAS:
            lean[key] = {name: lean_schema(sub) for name, sub in value.items()}
        elif key == "items" and isinstance(value, dict):
            lean[key] = lean_schema(value)
        elif key == "anyOf":
            branches = [lean_schema(branch) for branch in value if branch != NULL]
            if _optional(schema) and len(branches) == 1 and len(value) == 2:
                lean.update(branches[0])  # T or null, null by default: T, optional
            else:
                lean[key] = [lean_schema(branch) for branch in value]
        else:
            lean[key] = value
    return lean


def _optional(schema: dict[str, Any]) -> bool:
    """Whether the argument is null when left out (so leaving it out is the way to say null)."""
    return "default" in schema and schema["default"] is None
