"""The spec's named scalar types (`Uint`, `NonemptyString`, `Timestamp`, `Hostname`, `Clustername`, ...) and their patterns.

One module for them because every struct module annotates its fields with these, and `schemas.sonar.rules`,
the node and OCS producers and the tests reuse the patterns: a value's rule is written once, here.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from hpcbus.schemas.names import CLUSTER_MAX, HOST_MAX, SONAR_HOST_PATTERN, SONAR_LABEL

# --- Patterns ---------------------------------------------------------------------------------------------
# Written for both Python's `re` (what msgspec runs) and ECMA-262 (what JSON Schema validators run):
# `[0-9]` rather than `\d` (Python's `\d` also matches e.g. Arabic-Indic digits), and `(?!\n)$` at the end
# because Python's `$` also matches before a final newline ("host\n" must not pass).

_END = r"(?!\n)$"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
# 29 February only in leap years: divisible by 4 but not by 100, or divisible by 400.
_LEAP_DAY = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29"
_DATE = rf"(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
_OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"

TIMESTAMP_PATTERN = rf"^{_DATE}T{_TIME}{_OFFSET}{_END}"
"""RFC 3339 `yyyy-mm-ddThh:mm:ss+hh:mm` or `...Z`, no fractional seconds, a date that exists.

The whole check is in the pattern (days per month, leap years included), so one regex call settles it.
Leap seconds (`:60`) are refused: Sonar never writes them and Python's datetime cannot hold them.
"""
OPTIONAL_TIMESTAMP_PATTERN = rf"^(?:{_DATE}T{_TIME}{_OFFSET})?{_END}"

_LABEL = SONAR_LABEL
HOSTNAME_PATTERN = SONAR_HOST_PATTERN
"""RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, each 1-63 characters. The
rule is `hpcbus.schemas.names`' (`sonar_host_problem` says why a name breaks it), written once there."""

_CLUSTER_LABEL = r"[A-Za-z0-9][A-Za-z0-9-]*"
CLUSTERNAME_PATTERN = rf"^{_CLUSTER_LABEL}(?:\.{_CLUSTER_LABEL})*{_END}"
"""Sonar 0.19's `Clustername` (util/formats/newfmt/types.go: "a string with the same restrictions on character
set as Hostname. Typically the cluster name is an FQDN (a Hostname ending in a TLD), but it need not be"):
non-empty, of letters, digits, `-` and `.` only, and no host name's structure asked for: no 63-character
label limit, a label may end with `-`. What the bus needs of any cluster name (`schemas.names.cluster_problem`:
a cluster is a run of NATS subject tokens and a directory name) holds on top: no empty label (no `..`, no
leading or trailing dot), no label starting with `-`, at most `CLUSTER_MAX` characters. So a Clustername that
passes is a cluster name every part of the bus takes; `_` (which the bus allows) is not in Sonar's set."""

UINT64_MAX_ACCEPTED = 2**63 - 1
"""Largest uint64 value accepted; see the module docstring for why it is int64's maximum."""

# --- The spec's named types -------------------------------------------------------------------------------
# `extra={"kind": ...}` names the spec type so `schemas.sonar.diagnose` can explain a violation in the spec's
# words instead of quoting a regex.

Uint = Annotated[
    int, msgspec.Meta(ge=0, le=UINT64_MAX_ACCEPTED, description="uint64", extra={"kind": "uint64"})
]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1, description="int64", extra={"kind": "int64"})]
NonzeroUint = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=UINT64_MAX_ACCEPTED,
        description="NonzeroUint: uint64 value where zero is an error, not simply absence of data",
        extra={"kind": "NonzeroUint"},
    ),
]
ExtendedUint = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        le=UINT64_MAX_ACCEPTED,
        description="ExtendedUint: 0 for unset, 1 for infinite, v+2 for every other value v",
        extra={"kind": "ExtendedUint"},
    ),
]
NonemptyString = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        description="NonemptyString: string value where an empty value is an error",
        extra={"kind": "NonemptyString"},
    ),
]
# Timestamps: msgspec checks only the length (free, in C); the pattern is checked by `schemas.sonar.validate`
# with a per-envelope cache, because a jobs envelope repeats the same few times hundreds of times and a regex
# call per string from inside msgspec more than doubled its decoding time. The JSON Schema still carries it.
Timestamp = Annotated[
    str,
    msgspec.Meta(
        min_length=20,
        max_length=25,
        description="Timestamp: RFC 3339 yyyy-mm-ddThh:mm:ss+hh:mm ('Z' for +00:00), no sub-second precision",
        extra_json_schema={"pattern": TIMESTAMP_PATTERN},
        extra={"kind": "Timestamp"},
    ),
]
OptionalTimestamp = Annotated[
    str,
    msgspec.Meta(
        max_length=25,
        description="OptionalTimestamp: a Timestamp, or the empty string for missing data",
        extra_json_schema={"pattern": OPTIONAL_TIMESTAMP_PATTERN},
        extra={"kind": "OptionalTimestamp"},
    ),
]
Hostname = Annotated[
    str,
    msgspec.Meta(
        max_length=HOST_MAX,
        pattern=HOSTNAME_PATTERN,
        description="Hostname: dotted host name or prefix of same (letters, digits, inner hyphens)",
        extra={"kind": "Hostname"},
    ),
]
Clustername = Annotated[
    str,
    msgspec.Meta(
        max_length=CLUSTER_MAX,
        pattern=CLUSTERNAME_PATTERN,
        description="Clustername: the cluster's name, typically an FQDN but need not be (letters, digits, '-', '.')",
        extra={"kind": "Clustername"},
    ),
]
NodeRange = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        description="NodeRange: compact host list such as c[1-3,5]-[2-4].fox (Slurm hostlist syntax)",
        extra={"kind": "NodeRange"},
    ),
]
"""Only non-emptiness is a type constraint; the syntax is checked with `schemas.noderange.expand`."""
