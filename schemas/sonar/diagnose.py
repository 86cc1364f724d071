"""Every problem of an envelope that msgspec refused, not only the first.

msgspec stops at the first violation, which is right for speed but poor for the person fixing a producer:
Sonar's own fixture with `os`/`os-version` instead of `os_name`/`os_release` has five problems, and naming one
per attempt makes for a slow repair loop. So when the typed decode fails (rarely, and never on good data),
the envelope is decoded again into plain JSON values and walked here against the same struct definitions,
read with `msgspec.inspect`. The walk therefore applies exactly the constraints msgspec applies (types,
unknown and missing keys, bounds, lengths, patterns) plus the rules of `schemas.sonar.rules`, and explains
each in the spec's words (the `kind` in each type's `Meta.extra`) instead of quoting a regex.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
import msgspec.inspect as mi

from hpcbus.schemas.names import shown, sonar_host_problem
from hpcbus.schemas.sonar import rules
from hpcbus.schemas.sonar.types import (
    DATA_TYPES,
    AnyEnvelope,
    Metadata,
    SampleJob,
    SlurmJob,
)

MAX_PROBLEMS = 100
"""At most this many problems per envelope (then one summary): a systematically broken producer can put an
error in each of thousands of processes, and the first hundred say all there is to say."""

ENVELOPE_KEYS = frozenset({"meta", "data", "errors"})

_ENVELOPE_INFO = mi.type_info(AnyEnvelope)

Problems = list[tuple[str, str]]
"""(field path, reason) pairs; `schemas.sonar.validate` turns them into `Problem`s."""


def looks_like_envelope(value: object) -> bool:
    """An object with at least one of the envelope's keys; anything else gets one "not an envelope" problem
    (old-format Sonar output, some other JSON) instead of a problem per unknown key."""
    return isinstance(value, dict) and not ENVELOPE_KEYS.isdisjoint(value)


def diagnose(value: Any) -> Problems:
    """All problems of an envelope decoded to builtins, in the structs' field order, capped at `MAX_PROBLEMS`."""
    out: Problems = []
    if not looks_like_envelope(value):
        if isinstance(value, dict) and value:
            keys = ", ".join(list(value)[:6]) + (", ..." if len(value) > 6 else "")
            what = f"an object without any of them (keys: {keys}; old-format Sonar output?)"
        else:
            what = "an empty object" if isinstance(value, dict) else _describe(value)
        reason = (
            f"not a Sonar JSON envelope: expected an object with `meta` and `data` or `errors`, got {what}"
        )
        return [("", reason)]
    walker = _Walker(out)
    walker.walk(value, _ENVELOPE_INFO, "")
    found = rules.exclusive(value.get("data") is not None, bool(value.get("errors")))
    if found:
        walker.add(*found)
    if walker.more:
        out.append(("", f"... and {walker.more} more problems"))
    return out


def data_type(value: Any) -> str | None:
    """The envelope's `data.type` if it is one we know, for naming the kind of a rejected envelope."""
    if isinstance(value, dict):
        data = value.get("data")
        if isinstance(data, dict):
            tag = data.get("type")
            if isinstance(tag, str) and tag in DATA_TYPES:
                return tag
    return None


def join(path: str, key: str) -> str:
    """`a.b` + `c` -> `a.b.c`; the root path is empty."""
    return f"{path}.{key}" if path else key


class _Walker:
    """One walk over one envelope; `out` collects (path, reason) pairs."""

    def __init__(self, out: Problems):
        self.out = out
        self.more = 0
        """Problems found beyond `MAX_PROBLEMS`: counted, not kept."""

    def add(self, path: str, reason: str) -> None:
        if len(self.out) < MAX_PROBLEMS:
            self.out.append((path, reason))
        else:
            self.more += 1

    def walk(self, value: Any, info: mi.Type, path: str, kind: str = "") -> None:
        if isinstance(info, mi.Metadata):
            kind = (info.extra or {}).get("kind", kind)
            info = info.type
        handler = _HANDLERS.get(type(info))
        if handler is None:  # pragma: no cover - a type the structs do not use
            raise TypeError(f"diagnose cannot check {info!r}")
        handler(self, value, info, path, kind)

    def struct(self, value: Any, info: Any, path: str, kind: str) -> None:
        if not isinstance(value, dict):
            self.add(path, f"expected an object, got {_describe(value)}")
            return
        fields = {f.encode_name: f for f in info.fields}
        for key in value:
            if key not in fields and key != info.tag_field:
                self.add(join(path, key), "unknown field (not part of this object in the Sonar format)")
        for name, field in fields.items():
            if name in value:
                self.walk(value[name], field.type, join(path, name))
            elif field.required:
                self.add(join(path, name), "missing required field")
        check = _STRUCT_RULES.get(info.cls)
        if check is not None:
            check(self, value, path)

    def union(self, value: Any, info: Any, path: str, kind: str) -> None:
        members = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if value is None and len(members) < len(info.types):
            return
        structs = [t for t in members if isinstance(t, mi.StructType)]
        if len(structs) == 1 and len(members) == 1:
            self.walk(value, structs[0], path, kind)
            return
        # A tagged union: only `data` has one (`type` picks the data struct).
        if not isinstance(value, dict):
            self.add(path, f"expected an object or null, got {_describe(value)}")
            return
        tag_field = structs[0].tag_field or "type"
        tags = {t.tag: t for t in structs}
        tag = value.get(tag_field)
        if tag_field not in value:
            self.add(join(path, tag_field), f"missing required field (one of {_names(tags)})")
        elif not isinstance(tag, str) or tag not in tags:
            self.add(
                join(path, tag_field), f"unknown data type {_describe(tag)}: expected one of {_names(tags)}"
            )
        else:
            self.walk(value, tags[tag], path, kind)

    def list_(self, value: Any, info: Any, path: str, kind: str) -> None:
        if not isinstance(value, list):
            self.add(path, f"expected an array, got {_describe(value)}")
            return
        if info.min_length and len(value) < info.min_length:
            self.add(path, "must not be empty" if info.min_length == 1 else f"needs {info.min_length}+ items")
        for i, item in enumerate(value):
            self.walk(item, info.item_type, f"{path}[{i}]")

    def int_(self, value: Any, info: Any, path: str, kind: str) -> None:
        if type(value) is not int:
            want = "an unsigned integer" if (info.ge or 0) >= 0 else "an integer"
            self.add(path, f"expected {want}, got {_describe(value)}")
            return
        if info.ge is not None and value < info.ge:
            if kind == "NonzeroUint" and value == 0:
                self.add(path, "must not be 0 (NonzeroUint: zero is an error, not absence of data)")
            else:
                self.add(path, f"expected {kind or 'an integer'} >= {info.ge}, got {value}")
        elif info.le is not None and value > info.le:
            self.add(path, f"{value} is larger than {info.le}, the largest {kind or 'integer'} accepted")

    def float_(self, value: Any, info: Any, path: str, kind: str) -> None:
        if type(value) not in (int, float):
            self.add(path, f"expected a number, got {_describe(value)}")

    def bool_(self, value: Any, info: Any, path: str, kind: str) -> None:
        if type(value) is not bool:
            self.add(path, f"expected true or false, got {_describe(value)}")

    def str_(self, value: Any, info: Any, path: str, kind: str) -> None:
        if not isinstance(value, str):
            self.add(path, f"expected a string, got {_describe(value)}")
            return
        if kind in ("Timestamp", "OptionalTimestamp"):
            # The pattern implies the length limits msgspec checks, so this covers them.
            reason = rules.timestamp(value, optional=kind == "OptionalTimestamp")
            if reason:
                self.add(path, reason)
        elif info.min_length and len(value) < info.min_length:
            self.add(path, f"must not be empty ({kind})" if kind else "must not be empty")
        elif info.max_length is not None and len(value) > info.max_length:
            self.add(path, f"longer than {info.max_length} characters ({kind or 'string'})")
        elif info.pattern and not _compiled(info.pattern).search(value):
            self.add(path, _pattern_reason(value, info.pattern, kind))
        elif kind == "NodeRange":
            reason = rules.node_range(value)
            if reason:
                self.add(path, reason)

    def none(self, value: Any, info: Any, path: str, kind: str) -> None:
        if value is not None:
            self.add(path, f"expected null, got {_describe(value)}")


def _check_metadata(walker: _Walker, value: dict[str, Any], path: str) -> None:
    version = value.get("format", 0)
    if type(version) is int:
        reason = rules.data_format(version)
        if reason:
            walker.add(join(path, "format"), reason)


def _check_sample_job(walker: _Walker, value: dict[str, Any], path: str) -> None:
    job, epoch = value.get("job", 0), value.get("epoch", 0)
    if type(job) is int and type(epoch) is int:
        reason = rules.job_epoch(job, epoch)
        if reason:
            walker.add(join(path, "job"), reason)


def _check_slurm_job(walker: _Walker, value: dict[str, Any], path: str) -> None:
    nodes = value.get("nodes", [])
    if isinstance(nodes, list):
        for j, text in enumerate(nodes):
            if isinstance(text, str):
                reason = rules.job_nodes(text)
                if reason:
                    walker.add(f"{join(path, 'nodes')}[{j}]", reason)


_Handler = Callable[[_Walker, Any, Any, str, str], None]
_HANDLERS: dict[type, _Handler] = {
    mi.StructType: _Walker.struct,
    mi.UnionType: _Walker.union,
    mi.ListType: _Walker.list_,
    mi.IntType: _Walker.int_,
    mi.FloatType: _Walker.float_,
    mi.BoolType: _Walker.bool_,
    mi.StrType: _Walker.str_,
    mi.NoneType: _Walker.none,
}
_STRUCT_RULES: dict[type, Callable[[_Walker, dict[str, Any], str], None]] = {
    Metadata: _check_metadata,
    SampleJob: _check_sample_job,
    SlurmJob: _check_slurm_job,
}


def _compiled(pattern: str) -> re.Pattern[str]:
    # `re` caches compiled patterns itself; this path only runs for rejected envelopes.
    return re.compile(pattern)


def _pattern_reason(value: str, pattern: str, kind: str) -> str:
    if kind == "Hostname":
        if value == "":
            return "must not be empty (Hostname)"
        # the rule's own reason (`names.sonar_host_problem`): which character, which label, how long
        why = (sonar_host_problem(value) or "").removeprefix(f"Sonar Hostname {shown(value)}").lstrip(": ")
        return f"not a valid Hostname: {value!r}; {why or 'want dot-separated labels of letters, digits, inner hyphens'}"
    if kind == "Clustername":
        if value == "":
            return "must not be empty (Clustername)"
        return (
            f"not a valid Clustername: {value!r}; want letters, digits, '-' and '.' (Sonar's character set), "
            "in dot-separated labels none of which is empty or starts with '-'"
        )
    return f"{value!r} does not match the pattern of {kind or 'this field'}"


def _names(tags: dict[Any, Any]) -> str:
    return ", ".join(f'"{t}"' for t in tags)


def _describe(value: Any) -> str:
    """A JSON-flavoured, short description of a value for a reason text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"string {msgspec.json.encode(shown).decode()}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__  # pragma: no cover - JSON has no other values
