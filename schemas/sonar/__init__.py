"""Sonar JSON envelopes (NordicHPC/sonar's "new format"): msgspec structs, strict validation, JSON Schema.

`types` holds the structs (the spec's types plus the fields real Sonar adds), `validate` the public API
(`decode_envelope`, `encode_envelope`, `iter_envelopes`, ...), `jsonschema` the generator of
`schemas/json/*.schema.json`. `rules`, `diagnose` and `framing` are the pieces `validate` is built from.
"""

from hpcbus.schemas.sonar.validate import (
    KINDS,
    Envelope,
    PartlyInvalid,
    decode_envelope,
    encode_envelope,
    iter_envelopes,
    iter_envelopes_from_lines,
    kind_of,
    validate_envelope,
)

__all__ = [
    "KINDS",
    "Envelope",
    "PartlyInvalid",
    "decode_envelope",
    "encode_envelope",
    "iter_envelopes",
    "iter_envelopes_from_lines",
    "kind_of",
    "validate_envelope",
]
