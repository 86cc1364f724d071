"""The base all Sonar structs share, and the objects every envelope kind uses (meta, KVPair, errors).

The base carries the configuration the package docstring explains (`omit_defaults`, `forbid_unknown_fields`,
`kw_only`, `gc=False`), so each struct module only declares fields.
"""

from __future__ import annotations

import msgspec

from hpcbus.schemas.sonar.types.scalars import Clustername, Hostname, NonemptyString, OptionalTimestamp, Uint


class SonarStruct(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """Shared configuration (inherited by every Sonar struct; `kw_only` must be repeated per class)."""


class KVPair(SonarStruct, kw_only=True):
    """Carrier of arbitrary attribute data."""

    key: NonemptyString
    """A unique key within the array for the attribute."""
    value: str = ""
    """Some attribute value."""


class Metadata(SonarStruct, kw_only=True):
    """Information about the data producer and the data format (the spec's MetadataObject)."""

    producer: NonemptyString = ""
    """The name of the component that generated the data (eg "sonar", "slurm-monitor")."""
    version: NonemptyString = ""
    """The semver of the producer."""
    format: Uint = 0
    """The data format version. The spec describes version 0; other values are accepted and kept (the corpus
    has a made-up 37 that Sonar's own reader accepts), since a version only flags changed semantics."""
    attrs: list[KVPair] = []
    """Generator-dependent attribute values."""
    token: str = ""
    """EXPERIMENTAL: an API token for the cluster named in the data (never filled in by Sonar)."""


class Error(SonarStruct, kw_only=True):
    """A continuable or non-continuable error (the spec's ErrorObject); every field is optional (Sonar's own
    fixture `sonar__newfmt_sysinfo.json` record 3 sends an error with its `detail` alone)."""

    time: OptionalTimestamp = ""
    """Time when the error was generated."""
    detail: NonemptyString = ""
    """A sensible English-language error message describing the error."""
    cluster: Clustername = ""
    """Canonical cluster name for node generating the error."""
    node: Hostname = ""
    """Name of node generating the error."""
