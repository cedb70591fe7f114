"""Times and durations in the results, for the files and the charts.

The queries give times as ISO 8601 UTC text (`2026-01-05T08:00Z` for an
hour, `2026-01-05T08:00:01.250Z` for a moment), which JSON and CSV print as
they are; Parquet stores them as timestamps and the charts draw them on a
time axis, so both read them back here. Durations come in seconds; a person
reads 9.6 s, 25 min or 3.5 h, whichever fits the data (duration_unit).
"""

from __future__ import annotations

from datetime import datetime
from datetime import timezone
from typing import Iterable

# strptime formats of queries.ISO_FORMAT and queries.HOUR_FORMAT.
TIME_FORMATS = ("%Y-%m-%dT%H:%M:%S.%fZ", "%Y-%m-%dT%H:%MZ")
# (name, seconds): a duration is shown in the largest unit it holds at least twice.
DURATION_UNITS = (("s", 1.0), ("min", 60.0), ("h", 3600.0))
DECIMALS = {"s": 3, "min": 1, "h": 1}  # to the millisecond (export times are ms), else a tenth


def parse_time(text: str | None) -> datetime | None:
    """A result's ISO time text as an aware UTC datetime (None stays None).

    Raises ValueError for text in neither of the queries' formats.
    """
    if text is None:
        return None
    for pattern in TIME_FORMATS:
        try:
            return datetime.strptime(text, pattern).replace(tzinfo=timezone.utc)
        except ValueError:
            continue
    raise ValueError(f"not a time the history queries write: {text!r}")


def duration_unit(seconds: Iterable[float]) -> tuple[str, float]:
    """The unit that fits the longest of `seconds`: (name, seconds in one).

    The largest unit the longest duration holds at least twice, so 9.6 s
    stays seconds, 150 s is 2.5 min and 7,290 s is 2.0 h; no durations: s.
    """
    longest = max((abs(value) for value in seconds if value is not None), default=0.0)
    for name, size in reversed(DURATION_UNITS):
        if longest >= 2 * size:
            return name, size
    return DURATION_UNITS[0]


def in_unit(seconds: float, unit: str, size: float) -> float:
    """`seconds` in duration_unit's (unit, size), rounded as that unit is read."""
    return round(seconds / size, DECIMALS[unit])
