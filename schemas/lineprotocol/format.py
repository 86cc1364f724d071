"""Writing line protocol by hand (no library does it fast): InfluxDB's escaping rules, stable field types.

Escaping: measurement — comma, space; tag keys, tag values, field keys — comma, `=`, space; string field
values — `"` and `\\`. Other backslashes in names are written as they are (InfluxDB's reader unescapes only
`\\,`, `\\=` and `\\ `), so a name ending in a backslash cannot be written (it would escape the separator).
line_protocol_parser additionally reads a doubled backslash in a name as one: names holding a backslash right
before a special character or another backslash are read differently by the two; InfluxDB's reading wins here. No raw newline anywhere: in string
fields a newline is written as the two characters `\\n` (documented, lossy), in names it is an error.
Subnormal floats (below 2.2e-308) are written as 0.0: C readers using strtod reject them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

from schemas.lineprotocol.model import Line

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_FLOAT_MIN_NORMAL = 2.2250738585072014e-308

_MEAS_SPECIAL = re.compile(r"[, \\\n\r]")
_KEY_SPECIAL = re.compile(r"[,= \\\n\r]")
_MEAS_SUB = re.compile(r"([, ])")
_KEY_SUB = re.compile(r"([,= ])")
_STR_SPECIAL = re.compile(r'["\\\n\r]')


class FormatError(ValueError):
    """The line cannot be written as valid line protocol (empty name, newline in a tag, NaN, ...)."""


def _escape(text: str, special: re.Pattern[str], sub: re.Pattern[str], what: str) -> str:
    if not text:
        raise FormatError(f"{what} is empty")
    if special.search(text) is None:
        return text
    if "\n" in text or "\r" in text:
        raise FormatError(f"{what} {text!r} contains a newline")
    if text[-1] == "\\":
        raise FormatError(f"{what} {text!r} ends in a backslash, which line protocol cannot hold")
    return sub.sub(r"\\\1", text)


def escape_tag(key: str, value: str) -> str:
    """`,key=value` as it stands in a line's tag set (InfluxDB's escaping); FormatError when impossible."""
    return f",{_escape(key, _KEY_SPECIAL, _KEY_SUB, 'tag key')}={_escape(value, _KEY_SPECIAL, _KEY_SUB, f'tag {key}')}"


def _string_field(text: str) -> str:
    if _STR_SPECIAL.search(text) is None:
        return '"' + text + '"'
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "\\r").replace("\n", "\\n")
    return '"' + text + '"'


def _field_value(value: object, key: str) -> str:
    kind = type(value)
    if kind is float:
        if not math.isfinite(value):  # type: ignore[arg-type]
            raise FormatError(f"field {key}: {value} cannot be written in line protocol")
        if -_FLOAT_MIN_NORMAL < value < _FLOAT_MIN_NORMAL:  # type: ignore[operator]
            return "0.0"  # subnormals: strtod-based readers (line_protocol_parser) reject them as ERANGE
        return repr(value)
    if kind is int:
        if _INT64_MIN <= value <= _INT64_MAX:  # type: ignore[operator]
            return f"{value}i"
        if 0 <= value <= _UINT64_MAX:  # type: ignore[operator]
            return f"{value}u"
        raise FormatError(f"field {key}: {value} is outside 64-bit range")
    if kind is str:
        return _string_field(value)  # type: ignore[arg-type]
    if kind is bool:
        return "true" if value else "false"
    raise FormatError(f"field {key}: unsupported type {kind.__name__}")


def format_line(line: Line) -> str:
    """One line of valid line protocol (no trailing newline), timestamp in seconds.

    Tags are sorted by key (what InfluxDB indexes fastest, and one canonical text per point); empty tag values
    are omitted (invalid in line protocol).
    """
    parts = [_escape(line.measurement, _MEAS_SPECIAL, _MEAS_SUB, "measurement")]
    for key, val in sorted(line.tags.items()):
        if val == "":
            continue
        parts.append(escape_tag(key, val))
    if not line.fields:
        raise FormatError("a line needs at least one field")
    fields = ",".join(
        f"{_escape(k, _KEY_SPECIAL, _KEY_SUB, 'field key')}={_field_value(v, k)}"
        for k, v in line.fields.items()
    )
    return f"{''.join(parts)} {fields} {line.time}"


def format_lines(lines: Iterable[Line]) -> str:
    """Many lines, each ending in a newline — the payload of one NATS message."""
    return "".join(format_line(line) + "\n" for line in lines)
