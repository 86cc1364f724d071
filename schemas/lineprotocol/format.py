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

import functools
import math
import operator
import re
from collections.abc import Callable, Iterable

from hpcbus.schemas.lineprotocol.model import Line

INT64_MIN, INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
FLOAT_MIN_NORMAL = 2.2250738585072014e-308
"""The smallest normal double: smaller magnitudes (subnormals) are written as 0.0."""

_MEAS_SPECIAL = re.compile(r"[, \\\n\r]")
_KEY_SPECIAL = re.compile(r"[,= \\\n\r]")
_MEAS_SUB = re.compile(r"([, ])")
_KEY_SUB = re.compile(r"([,= ])")
_STR_SPECIAL = re.compile(r'["\\\n\r]')


def plain_measurement(text: str) -> bool:
    """`text` is written as it is as a measurement: not empty, nothing to escape."""
    return bool(text) and _MEAS_SPECIAL.search(text) is None


def plain_tag_text(text: str) -> bool:
    """`text` is written as it is as a tag key or value: not empty, nothing to escape (the test `tag_set`
    makes, for writers that build tag text from templates)."""
    return bool(text) and _KEY_SPECIAL.search(text) is None


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
        if -FLOAT_MIN_NORMAL < value < FLOAT_MIN_NORMAL:  # type: ignore[operator]
            return "0.0"  # subnormals: strtod-based readers (line_protocol_parser) reject them as ERANGE
        return repr(value)
    if kind is int:
        if INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
            return f"{value}i"
        if 0 <= value <= _UINT64_MAX:  # type: ignore[operator]
            return f"{value}u"
        raise FormatError(f"field {key}: {value} is outside 64-bit range")
    if kind is str:
        return _string_field(value)  # type: ignore[arg-type]
    if kind is bool:
        return "true" if value else "false"
    raise FormatError(f"field {key}: unsupported type {kind.__name__}")


def tag_set(tags: dict[str, str]) -> str:
    """`,k=v,...` as it stands in a line (sorted by key, InfluxDB's escaping, empty values left out);
    FormatError when impossible.

    Why a template: tag dicts come in a handful of key sets per stream (a node's, a hwthread's, a process'),
    so sorting the keys and checking them for escapes is done once per key set (`_template`); a line's own
    work is one check of its values and one `%`. Values that need an escape take the general way."""
    getter, template = _template(tuple(tags))
    if getter is not None:
        values = getter(tags)
        if "" not in values and _KEY_SPECIAL.search("".join(values)) is None:
            return template % values
    return "".join(escape_tag(key, val) for key, val in sorted(tags.items()) if val != "")


@functools.lru_cache(maxsize=1024)
def _template(keys: tuple[str, ...]) -> tuple[Callable[[dict[str, str]], tuple[str, ...]] | None, str]:
    """(getter of a tag dict's values in sorted key order, `%` template of its tag set) for the key set
    `keys` (in insertion order); no getter when a key needs escaping (or there is none)."""
    order = sorted(keys)
    if not order or "" in keys or _KEY_SPECIAL.search("".join(keys)) is not None:
        return None, ""
    template = "".join(f",{k.replace('%', '%%')}=%s" for k in order)
    if len(order) == 1:
        only = order[0]
        return (lambda tags: (tags[only],)), template
    return operator.itemgetter(*order), template


def plain_value(value: object) -> str | None:
    """A metric value as written after `value=` when it is of the two common kinds (an int64, a finite
    normal float); None for anything else, which `format_line`'s general rules write. The one place these
    two cases are written, for every writer that skips building or formatting a whole `Line`."""
    kind = type(value)
    if kind is float:
        if not -FLOAT_MIN_NORMAL < value < FLOAT_MIN_NORMAL and value - value == 0.0:  # type: ignore[operator]
            return repr(value)
    elif kind is int and INT64_MIN <= value <= INT64_MAX:  # type: ignore[operator]
        return f"{value}i"
    return None


def format_line(line: Line) -> str:
    """One line of valid line protocol (no trailing newline), timestamp in seconds.

    Tags are sorted by key (what InfluxDB indexes fastest, and one canonical text per point); empty tag values
    are omitted (invalid in line protocol). The common line (a plain name, one `value` field holding a
    finite, normal float or an int64) is written inline; everything else by the general rules below.
    """
    name = line.measurement
    if not name or _MEAS_SPECIAL.search(name) is not None:
        name = _escape(name, _MEAS_SPECIAL, _MEAS_SUB, "measurement")
    tags = tag_set(line.tags)
    fields = line.fields
    if len(fields) == 1 and "value" in fields:
        text = plain_value(fields["value"])
        if text is not None:
            return f"{name}{tags} value={text} {line.time}"
    if not fields:
        raise FormatError("a line needs at least one field")
    text = ",".join(
        f"{_escape(k, _KEY_SPECIAL, _KEY_SUB, 'field key')}={_field_value(v, k)}" for k, v in fields.items()
    )
    return f"{name}{tags} {text} {line.time}"


def format_lines(lines: Iterable[Line]) -> str:
    """Many lines, each ending in a newline — the payload of one NATS message."""
    out = [format_line(line) for line in lines]
    out.append("")
    return "\n".join(out)
