"""Text codecs of the scalar types `@xmlify` supports, one XSD built-in type each.

Encoding refuses what the XSD type cannot hold (NaN decimals, time zone
offsets with seconds, characters XML 1.0 cannot carry); decoding refuses
what Python cannot hold exactly (a year past 9999, more than microsecond
precision), each with a named error instead of a rounded or truncated value.
Decoding trims whitespace for every type but str, as the XSD types do.
"""

from __future__ import annotations

import enum
import math
import re
from dataclasses import dataclass
from datetime import datetime
from datetime import timedelta
from datetime import timezone
from decimal import Decimal
from decimal import InvalidOperation
from typing import Any
from typing import Callable

from bus.xml.errors import XmlUnrepresentable
from bus.xml.errors import XmlValueInvalid

# XML 1.0 Char production; anything else cannot appear in a document at all.
_NOT_XML_CHAR = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_DATETIME = re.compile(
    r"(-?\d{4,})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?")
_MAX_OFFSET = timedelta(hours=14)  # xs:dateTime's time zone range


@dataclass(frozen=True)
class Scalar:
    """How one Python type becomes element text and back."""

    label: str  # for usage texts: "int", "one of red|green"
    xs_type: str  # the XSD built-in type (the base type for an enumeration)
    accepts: tuple[type, ...]
    encode: Callable[[Any, str], str]
    decode: Callable[[str, str], Any]
    example: str
    values: tuple[str, ...] = ()  # enumeration facet, for Enum types


def check_type(scalar: Scalar, value: Any, path: str) -> None:
    if isinstance(value, bool) and bool not in scalar.accepts:
        ok = False
    else:
        ok = isinstance(value, scalar.accepts)
    if not ok:
        raise XmlUnrepresentable(path, f"expected {scalar.label}, got {type(value).__name__} "
                                       f"{value!r}; pass a {scalar.label}")


def _encode_str(value: str, path: str) -> str:
    bad = _NOT_XML_CHAR.search(value)
    if bad is not None:
        raise XmlUnrepresentable(
            path, f"character U+{ord(bad.group()):04X} at index {bad.start()} cannot appear "
                  "in XML 1.0; remove it or encode the value (e.g. base64) into a str field")
    return value


def _decode_str(text: str, path: str) -> str:
    return text


def _decode_int(text: str, path: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise XmlValueInvalid(path, f"{text!r} is not an integer; write digits like 42") from None


def _encode_float(value: float, path: str) -> str:
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return repr(value)


def _decode_float(text: str, path: str) -> float:
    try:
        return float(text.strip())
    except ValueError:
        raise XmlValueInvalid(path, f"{text!r} is not a number; write e.g. 1.5, 1e-3 or INF") \
            from None


def _decode_bool(text: str, path: str) -> bool:
    word = text.strip()
    if word in ("true", "1"):
        return True
    if word in ("false", "0"):
        return False
    raise XmlValueInvalid(path, f"{text!r} is not a boolean; write true or false")


def _encode_decimal(value: Decimal | int, path: str) -> str:
    value = Decimal(value)
    if not value.is_finite():
        raise XmlUnrepresentable(path, f"{value} has no xs:decimal form; pass a finite Decimal")
    return format(value, "f")


def _decode_decimal(text: str, path: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        value = None
    if value is None or not value.is_finite():
        raise XmlValueInvalid(path, f"{text!r} is not a decimal; write digits like 12.50")
    return value


def _encode_datetime(value: datetime, path: str) -> str:
    offset = value.utcoffset()
    if offset is not None and (offset % timedelta(minutes=1) or abs(offset) > _MAX_OFFSET):
        raise XmlUnrepresentable(
            path, f"time zone offset {offset} is not whole minutes within +-14:00, which "
                  "xs:dateTime needs; convert the value to UTC first")
    return value.isoformat()


def _decode_datetime(text: str, path: str) -> datetime:
    found = _DATETIME.fullmatch(text.strip())
    if found is None:
        raise XmlValueInvalid(path, f"{text!r} is not a date-time; write e.g. "
                                    "2026-01-31T12:00:00+00:00")
    year, month, day, hour, minute, second, fraction, zone = found.groups()
    fraction = (fraction or "").rstrip("0")
    if len(fraction) > 6:
        raise XmlValueInvalid(path, f"{text!r} has more than microsecond precision; round it "
                                    "to 6 fractional digits")
    try:
        return datetime(int(year), int(month), int(day), int(hour), int(minute), int(second),
                        int(fraction.ljust(6, "0")), _zone(zone))
    except ValueError as exc:
        raise XmlValueInvalid(path, f"{text!r} is outside Python's datetime ({exc}); use a "
                                    "year 1-9999 and hours 00-23") from None


def _zone(zone: str | None) -> timezone | None:
    if zone is None:
        return None
    if zone == "Z":
        return timezone.utc
    sign = -1 if zone[0] == "-" else 1
    return timezone(sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))


def _plain(value: Any, path: str) -> str:
    return str(value)


SCALARS: dict[type, Scalar] = {
    str: Scalar("str", "string", (str,), _encode_str, _decode_str, "text"),
    int: Scalar("int", "integer", (int,), _plain, _decode_int, "1"),
    float: Scalar("float", "double", (float, int), _encode_float, _decode_float, "1.5"),
    bool: Scalar("bool", "boolean", (bool,), lambda v, p: "true" if v else "false",
                 _decode_bool, "true"),
    Decimal: Scalar("decimal", "decimal", (Decimal, int), _encode_decimal, _decode_decimal,
                    "12.50"),
    datetime: Scalar("datetime", "dateTime", (datetime,), _encode_datetime, _decode_datetime,
                     "2026-01-31T12:00:00+00:00"),
}


def enum_scalar(cls: type[enum.Enum]) -> Scalar | str:
    """The codec of an Enum whose values are all str or all int; else why not."""
    members = list(cls)
    if not members:
        return "has no members"
    kinds = {type(m.value) for m in members}
    if kinds not in ({str}, {int}):
        return "values must be all str or all int"
    texts = tuple(str(m.value) for m in members)
    if len(set(texts)) != len(texts) or any(_NOT_XML_CHAR.search(t) for t in texts):
        return "values must be distinct and XML characters only"
    by_text = dict(zip(texts, members))

    def decode(text: str, path: str) -> enum.Enum:
        if text not in by_text:
            raise XmlValueInvalid(path, f"{text!r} is not one of {'|'.join(texts)}")
        return by_text[text]

    return Scalar(f"one of {'|'.join(texts)}", "string", (cls,),
                  lambda v, p: str(v.value), decode, texts[0], texts)
