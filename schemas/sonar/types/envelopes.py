"""The envelopes: the tagged `data` union of the four kinds, and the envelope structs around it.

Kept apart from the attribute structs because this is the one place where the kinds meet: `DATA_TYPES`, the
`data`/`errors` pair and `AnyEnvelope`, which `schemas.sonar.validate` decodes into.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec

from hpcbus.schemas.sonar.types.cluster import ClusterAttributes
from hpcbus.schemas.sonar.types.common import Error, Metadata, SonarStruct
from hpcbus.schemas.sonar.types.jobs import JobsAttributes
from hpcbus.schemas.sonar.types.sample import SampleAttributes
from hpcbus.schemas.sonar.types.sysinfo import SysinfoAttributes

# --- Data (the tagged part) -------------------------------------------------------------------------------
# `data.type` is a msgspec tag: it picks the struct while decoding and is written back on encoding, so it is
# never stored twice. The `type` property exposes it as the spec names it.


class SampleData(SonarStruct, tag_field="type", tag="sample", kw_only=True):
    """Sample data, for successful sample probes."""

    attributes: SampleAttributes = msgspec.field(default_factory=SampleAttributes)
    """The sample data themselves."""

    @property
    def type(self) -> str:
        """The `data.type` tag, always "sample"."""
        return "sample"


class SysinfoData(SonarStruct, tag_field="type", tag="sysinfo", kw_only=True):
    """Node data, for successful sysinfo probes."""

    attributes: SysinfoAttributes = msgspec.field(default_factory=SysinfoAttributes)
    """The node data themselves."""

    @property
    def type(self) -> str:
        """The `data.type` tag, always "sysinfo"."""
        return "sysinfo"


class JobsData(SonarStruct, tag_field="type", tag="job", kw_only=True):
    """Jobs data, tagged "job" as real Sonar sends it (and as Sonar's own Go decoder expects)."""

    attributes: JobsAttributes = msgspec.field(default_factory=JobsAttributes)
    """The jobs data themselves."""

    TAG: ClassVar[str] = "job"

    @property
    def type(self) -> str:
        """The `data.type` tag as received: "job" here, "jobs" for `SpecJobsData`."""
        return self.TAG


class SpecJobsData(JobsData, tag="jobs", kw_only=True):
    """Jobs data tagged "jobs", as the spec text says (and Sonar's synthetic fixture uses).

    A subclass rather than a flag, so that decoding remembers which spelling arrived and re-encoding writes
    the same one back, while `isinstance(data, JobsData)` holds for both.
    """

    TAG: ClassVar[str] = "jobs"


class ClusterData(SonarStruct, tag_field="type", tag="cluster", kw_only=True):
    """Cluster data, for successful cluster probes."""

    attributes: ClusterAttributes = msgspec.field(default_factory=ClusterAttributes)
    """The cluster data themselves."""

    @property
    def type(self) -> str:
        """The `data.type` tag, always "cluster"."""
        return "cluster"


DATA_TYPES: dict[str, type[SonarStruct]] = {
    "sample": SampleData,
    "sysinfo": SysinfoData,
    "job": JobsData,
    "jobs": SpecJobsData,
    "cluster": ClusterData,
}
"""Every accepted `data.type` value and the struct it selects."""

# --- Envelopes --------------------------------------------------------------------------------------------
# `data` and `errors` are exclusive (the spec's only union). Both are optional here and the rule is checked
# by `schemas.sonar.validate`, because msgspec cannot express "exactly one of two keys"; the JSON Schema
# files add it as a `oneOf`.


class SampleEnvelope(SonarStruct, kw_only=True):
    """A node's sample: sent from each node at each sampling interval."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: SampleData | None = None
    """Sample data, for successful probes."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class SysinfoEnvelope(SonarStruct, kw_only=True):
    """A node's hardware configuration ("nodeinfo"), sent every 24 h and at boot."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: SysinfoData | None = None
    """Node data, for successful probes."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class JobsEnvelope(SonarStruct, kw_only=True):
    """Job records from a cluster's job manager, sent from one master node."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: JobsData | SpecJobsData | None = None
    """Jobs data, for successful probes ("type" is "job" or "jobs")."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class ClusterEnvelope(SonarStruct, kw_only=True):
    """Partitions and node states of a cluster, sent from one master node."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: ClusterData | None = None
    """Cluster data, for successful probes."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class ErrorsEnvelope(SonarStruct, kw_only=True):
    """An errors-only envelope whose kind (sample, sysinfo, job, cluster) was not known from context.

    Such an envelope is `{"meta": ..., "errors": [...]}` whatever probe failed: the four envelope types have
    the same keys, and an error object carries only time, detail, cluster and node. So its kind can only come
    from where it was found (Kafka topic, NATS subject, file name): pass `expect=` to the decoder to get the
    proper envelope type; without it, this is what you get.
    """

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    errors: list[Error] = []
    """Error information."""


class AnyEnvelope(SonarStruct, kw_only=True):
    """What `schemas.sonar.validate` decodes into: one struct for all kinds, so that a single msgspec pass
    both dispatches on `data.type` and checks the types. It is then rewrapped, without copying, in the kind's
    own envelope class. Use `decode_envelope` rather than decoding into this directly: it adds the rules
    msgspec cannot check."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    data: SampleData | SysinfoData | JobsData | SpecJobsData | ClusterData | None = None
    errors: list[Error] = []
