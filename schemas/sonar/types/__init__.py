"""Sonar's JSON envelopes as `msgspec.Struct`s: the spec's types plus every field real Sonar emits.

Why structs with constraints rather than dicts plus checks: msgspec checks types, unknown keys, missing keys,
bounds, string lengths and regex patterns in C while it decodes, so most of the spec's rules cost
nothing extra on the hot path (`schemas.sonar.validate` adds the few rules a type cannot express). The same
annotations generate the JSON Schema files (`schemas.sonar.jsonschema`), so the wire contract is written once.

Import from `schemas.sonar.types`; the modules behind it split the structs by job: `scalars` (the spec's named
types and their patterns), `common` (the shared base, `Metadata`, `KVPair`, `Error`), `sample`, `sysinfo`,
`jobs` and `cluster` (each kind's attributes), and `envelopes` (the tagged `data` union and the envelopes).

Conventions, all from the spec ("in a serialization format that allows fields to be omitted, all fields
except union fields will have default values, which are zero, empty string, false ... or the empty array"):

* Every struct has `omit_defaults=True` (Sonar omits zero values rather than sending them, so re-encoding
  gives Sonar's own shape), `forbid_unknown_fields=True` (a misspelt key such as `os` for `os_name` is an
  error, not silently dropped data) and `kw_only=True` (fields keep the spec's order on the wire).
* A field is required (has no default) only where the spec says so in words: SlurmJob's "job_id, job_step,
  job_name, and job_state must be transmitted in every record", ClusterNodes' "the array of names may not be
  empty", the `data`/`errors` union and the `data.type` tag. A type such as `NonemptyString`, `NonzeroUint`,
  `Timestamp` or `Hostname` ("zero is an error, not simply absence of data") constrains a value that is
  *present*; it does not make the field mandatory. An optional field defaults to the zero value, so an absent
  field stays absent on output (`omit_defaults`) and nothing is invented, while a present empty string or 0
  is still refused. Also required, by the spec's words on uniqueness: `KVPair.key` ("a unique key within the
  array"), `SysinfoSoftwareVersion.key` ("a unique identifier"), `ClusterPartition.name` ("a Partition has a
  unique name").
* Nothing else is required (issue 10 decided it): not the attributes' `time`, `cluster` and `node`, not
  `SampleAttributes.system`, `SampleJob.user`, the GPU `uuid`s, the envelope's `meta` with its
  `producer`/`version`, `Error.detail`, nor the sysinfo OS names and hardware counts. A struct-valued field
  (`meta`, `data.attributes`, `system`) defaults to the empty object (`default_factory`); msgspec's
  `omit_defaults` omits only scalar and empty-collection defaults, so an absent object is written back as `{}`,
  which the spec defines as the same value. What hpcbus cannot *translate* without such a field (a sample
  without `node` has no `hostname` for its metric lines) is the translator's business
  (`schemas.translate.envelope_to_lines`): it never invents the value, and validation does not refuse it.
* Most checks happen inside msgspec's decoder; the exceptions are named where they are made (Timestamp's
  pattern, NodeRange syntax) and done by `schemas.sonar.validate`.
* `uint64` fields are `int` with `ge=0` and `le=2**63-1`. msgspec can only bound-check within int64, and
  InfluxDB stores integers as int64 too, so a value above 2^63-1 could not travel further anyway; no real
  Sonar value comes near it. `ExtendedUint` is a plain uint on the wire (0 unset, 1 infinite, v+2 for v).
* Real Sonar (v0.14-v0.19) emits more than the spec text describes; those fields are here, marked
  "(not in the spec text)" with the Sonar version that introduced them where known.

`gc=False`: these structs never form reference cycles, and keeping thousands of decoded processes out of the
garbage collector's tracking makes decoding measurably faster.
"""

from hpcbus.schemas.sonar.types.cluster import ClusterAttributes, ClusterNodes, ClusterPartition
from hpcbus.schemas.sonar.types.common import Error, KVPair, Metadata
from hpcbus.schemas.sonar.types.envelopes import (
    DATA_TYPES,
    AnyEnvelope,
    ClusterData,
    ClusterEnvelope,
    ErrorsEnvelope,
    JobsData,
    JobsEnvelope,
    SampleData,
    SampleEnvelope,
    SpecJobsData,
    SysinfoData,
    SysinfoEnvelope,
)
from hpcbus.schemas.sonar.types.jobs import JobsAttributes, SacctData, SlurmJob
from hpcbus.schemas.sonar.types.sample import (
    SampleAttributes,
    SampleDisk,
    SampleGpu,
    SampleJob,
    SampleProcess,
    SampleProcessGpu,
    SampleSystem,
)
from hpcbus.schemas.sonar.types.scalars import (
    CLUSTERNAME_PATTERN,
    HOSTNAME_PATTERN,
    OPTIONAL_TIMESTAMP_PATTERN,
    TIMESTAMP_PATTERN,
    UINT64_MAX_ACCEPTED,
    Clustername,
    ExtendedUint,
    Hostname,
    Int64,
    NodeRange,
    NonemptyString,
    NonzeroUint,
    OptionalTimestamp,
    Timestamp,
    Uint,
)
from hpcbus.schemas.sonar.types.sysinfo import SysinfoAttributes, SysinfoGpuCard, SysinfoSoftwareVersion

__all__ = [
    "CLUSTERNAME_PATTERN",
    "DATA_TYPES",
    "HOSTNAME_PATTERN",
    "OPTIONAL_TIMESTAMP_PATTERN",
    "TIMESTAMP_PATTERN",
    "UINT64_MAX_ACCEPTED",
    "AnyEnvelope",
    "ClusterAttributes",
    "ClusterData",
    "ClusterEnvelope",
    "ClusterNodes",
    "ClusterPartition",
    "Clustername",
    "Error",
    "ErrorsEnvelope",
    "ExtendedUint",
    "Hostname",
    "Int64",
    "JobsAttributes",
    "JobsData",
    "JobsEnvelope",
    "KVPair",
    "Metadata",
    "NodeRange",
    "NonemptyString",
    "NonzeroUint",
    "OptionalTimestamp",
    "SacctData",
    "SampleAttributes",
    "SampleData",
    "SampleDisk",
    "SampleEnvelope",
    "SampleGpu",
    "SampleJob",
    "SampleProcess",
    "SampleProcessGpu",
    "SampleSystem",
    "SlurmJob",
    "SpecJobsData",
    "SysinfoAttributes",
    "SysinfoData",
    "SysinfoEnvelope",
    "SysinfoGpuCard",
    "SysinfoSoftwareVersion",
    "Timestamp",
    "Uint",
]
