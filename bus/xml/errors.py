"""Errors of the XML side: every refusal is a `BusError` with a stable `code`.

Each error carries where it happened (`line`, `column`, 1-based; 0 when
libxml2 does not say) and a message that names the problem and the fix, so
the pipeline can turn it into a `<huh>` the sender can learn from.
"""

from __future__ import annotations

from bus.storage.errors import BusError


class XmlRejected(BusError):
    """Input the XML side refuses; `code` is stable, the message is for people."""

    error_code = "invalid_xml"

    code = "rejected"

    def __init__(self, reason: str, line: int = 0, column: int = 0) -> None:
        where = f"line {line}, column {column}: " if line else ""
        super().__init__(f"{where}{reason}")
        self.reason = reason
        self.line = line
        self.column = column


class XmlEmpty(XmlRejected):
    code = "empty"

    def __init__(self) -> None:
        super().__init__("the input is empty or only whitespace; send one XML element")


class XmlTooLarge(XmlRejected):
    code = "too-large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the input is {size} bytes; the limit is {limit}. "
                         "Send a smaller document (large content belongs in a blob)")
        self.size = size
        self.limit = limit


class _LimitExceeded(XmlRejected):
    """A parser limit (`limit`) was exceeded at line:column; `template` says which and the fix."""

    template = ""

    def __init__(self, limit: int, line: int, column: int) -> None:
        super().__init__(self.template.format(limit=limit), line, column)
        self.limit = limit


class XmlTooDeep(_LimitExceeded):
    code = "too-deep"
    template = "elements are nested deeper than {limit} levels; flatten the document"


class XmlTextTooLong(_LimitExceeded):
    code = "text-too-long"
    template = "a text node is longer than {limit} bytes; split it or send it as a blob"


class XmlDoctypeRefused(XmlRejected):
    code = "doctype"

    def __init__(self, line: int = 0, column: int = 0) -> None:
        super().__init__("a DOCTYPE (DTD) is not accepted: no DTDs, no entity "
                         "declarations; remove the <!DOCTYPE ...> declaration", line, column)


class XmlEncodingInvalid(XmlRejected):
    code = "encoding"

    def __init__(self, offset: int, line: int, column: int) -> None:
        super().__init__(f"byte {offset} is not valid UTF-8; send UTF-8 text", line, column)
        self.offset = offset


class XmlMultipleRoots(XmlRejected):
    code = "multiple-roots"

    def __init__(self, line: int, column: int) -> None:
        super().__init__("more than one root element; wrap the elements in one root "
                         "or send them as separate messages", line, column)


class XmlMalformed(XmlRejected):
    """Not well-formed, and no lossless repair applies; `detail` is libxml2's message."""

    code = "malformed"

    def __init__(self, detail: str, line: int, column: int) -> None:
        super().__init__(f"not well-formed XML ({detail}); fix the markup there", line, column)
        self.detail = detail


class XmlInvalid(XmlRejected):
    """Well-formed, but the schema refuses it; `part` is "envelope" or "payload"."""

    _FIX = {
        "envelope": "an envelope is <env:message> holding <env:from>, an optional <env:to>, "
                    "<env:thread> and one payload element, in that order",
        "payload": "the tool description shows a valid example",
    }

    def __init__(self, part: str, detail: str, line: int, column: int = 0) -> None:
        fix = self._FIX.get(part, "fix the element there")
        super().__init__(f"the {part} does not match its schema: {detail.rstrip('.')}; {fix}",
                         line, column)
        self.code = f"{part}-invalid"
        self.part = part
        self.detail = detail


class XmlValueInvalid(XmlRejected):
    """A value passed the schema but cannot become the Python type (`field` says which)."""

    code = "value-invalid"

    def __init__(self, field: str, reason: str, line: int = 0) -> None:
        super().__init__(f"{field}: {reason}", line)
        self.field = field


class XmlUnrepresentable(XmlRejected):
    """`to_xml` refused a value XML cannot carry (`field` names it)."""

    code = "unrepresentable"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


class XmlifyUnsupported(BusError):
    """`@xmlify` was given a class or field type it cannot map to XML."""

    def __init__(self, cls: str, field: str, reason: str) -> None:
        super().__init__(f"{cls}.{field}: {reason}" if field else f"{cls}: {reason}")
        self.cls = cls
        self.field = field
        self.reason = reason
