"""JSON Schema texts for the four Sonar envelopes, generated from the structs (`make schemas` writes them).

Why generate rather than write them: the structs in `schemas.sonar.types` are what hpcbus enforces, so a
hand-written schema would drift the day a field is added. The files under `schemas/json/` are committed
so that non-Python users (a Go or Rust producer's CI, a JSON Schema validator in front of a REST endpoint)
can check data without hpcbus; `tests/test_sonar_jsonschema.py` fails when they no longer match the structs.

What the generator adds to `msgspec.json.schema`:

* each field's description, taken from the attribute docstring under it in `schemas.sonar.types`
  (msgspec only knows class docstrings and `Meta.description`), followed by its spec type's description;
* the rules the decoder checks outside the types, where JSON Schema can say them: `data` XOR `errors`
  (`oneOf`), and a sample job with job 0 must have a non-zero epoch. NodeRange
  syntax cannot be expressed; its description says so.

This module only builds the texts (`files`); `hpcbus.commands.dev.schemas` writes them to `schemas/json/`
(`make schemas`) or, with `--check`, names the stale ones.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import re
from typing import Any

import msgspec

from hpcbus.schemas.sonar import types

ENVELOPES: dict[str, type[msgspec.Struct]] = {
    "sample": types.SampleEnvelope,
    "sysinfo": types.SysinfoEnvelope,
    "job": types.JobsEnvelope,
    "cluster": types.ClusterEnvelope,
}
"""File stem (the envelope kind, as Sonar's Kafka topics name it) -> envelope struct."""

_DRAFT = "https://json-schema.org/draft/2020-12/schema"

# Exactly one of a non-null `data` and a non-empty `errors` (an empty `errors` counts as absent, as the
# decoder counts it, because Sonar omits empty arrays and other producers may not).
_DATA_XOR_ERRORS = {
    "oneOf": [
        {"required": ["data"], "properties": {"data": {"type": "object"}}},
        {"required": ["errors"], "properties": {"errors": {"minItems": 1}}},
    ]
}


def _absent_or_zero(name: str) -> dict[str, Any]:
    return {"anyOf": [{"not": {"required": [name]}}, {"properties": {name: {"const": 0}}}]}


_JOB_NEEDS_EPOCH = {"not": {"allOf": [_absent_or_zero("job"), _absent_or_zero("epoch")]}}


def field_docs() -> dict[str, dict[str, str]]:
    """Struct name -> wire field name -> the docstring written under the field in `schemas.sonar.types`.

    Read from each exported struct's own source: the structs live in several modules of that package.
    """
    docs: dict[str, dict[str, str]] = {}
    for name in types.__all__:
        cls = getattr(types, name)
        if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
            continue
        node = ast.parse(inspect.getsource(cls)).body[0]
        if not isinstance(node, ast.ClassDef):
            continue
        wire = {f.name: f.encode_name for f in msgspec.structs.fields(cls)}
        for stmt, after in itertools.pairwise(node.body):
            if (
                isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.target.id in wire
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                text = " ".join(after.value.value.split())
                docs.setdefault(node.name, {})[wire[stmt.target.id]] = text
    return docs


def build(kind: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one envelope kind."""
    envelope = ENVELOPES[kind]
    schema = msgspec.json.schema(envelope)
    defs: dict[str, Any] = schema["$defs"]
    for struct_name, docs in field_docs().items():
        props = defs.get(struct_name, {}).get("properties", {})
        for name, doc in docs.items():
            prop = props.get(name)
            if prop is None:
                continue
            typedoc = prop.get("description")
            prop["description"] = f"{doc} [{typedoc}]" if typedoc else doc
    for struct in defs.values():
        if "description" in struct:
            # a class docstring as `inspect.cleandoc` reads it: msgspec 0.22 kept the indentation of its
            # later lines and 0.23 removes it, and the files must not depend on which one made them
            struct["description"] = inspect.cleandoc(struct["description"])
        for prop in struct.get("properties", {}).values():
            _drop_invalid_default(prop)
    defs[envelope.__name__].update(_DATA_XOR_ERRORS)
    if "SampleJob" in defs:
        defs["SampleJob"].update(_JOB_NEEDS_EPOCH)
    return {
        "$schema": _DRAFT,
        "title": f"Sonar {kind} envelope",
        "description": (
            f"A Sonar JSON '{kind}' envelope as hpcbus accepts it (generated from schemas/sonar/types.py by "
            "`make schemas`; do not edit). NodeRange syntax is checked by hpcbus but not by this schema."
        ),
        **schema,
    }


def _drop_invalid_default(prop: dict[str, Any]) -> None:
    """An optional field of a type whose zero value is an error (`submit_time: Timestamp = ""`) is *absent*
    when omitted, not zero: msgspec writes its Python default as the JSON `default`, which the field's own
    constraints refuse, so a reader could take "" or 0 for an accepted value. Such a default is left out."""
    if "default" not in prop:
        return
    value = prop["default"]
    if isinstance(value, str):
        invalid = len(value) < prop.get("minLength", 0) or not re.search(prop.get("pattern", ""), value)
    else:
        invalid = (
            isinstance(value, int) and not isinstance(value, bool) and value < prop.get("minimum", value)
        )
    if invalid:
        del prop["default"]


def render(schema: dict[str, Any]) -> str:
    """The file text: stable key order (the structs' field order), two-space indent, final newline."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def files() -> dict[str, str]:
    """Every schema file's name (`<kind>.schema.json`, as shipped in `schemas/json/`) and its text."""
    return {f"{kind}.schema.json": render(build(kind)) for kind in ENVELOPES}
