"""Large Sonar envelopes built from the corpus' shapes (real Sonar records, repeated with ids of their own), for
the tests of envelopes larger than one NATS message."""

from __future__ import annotations

import msgspec

from hpcbus.schemas.sonar import decode_envelope, encode_envelope
from hpcbus.schemas.sonar.types import (
    ClusterEnvelope,
    ClusterNodes,
    ClusterPartition,
    JobsEnvelope,
    SampleEnvelope,
)
from tests.corpus import CORPUS

SONAR = CORPUS / "sonar"


def big_jobs(size: int, cluster: str = "") -> JobsEnvelope:
    """The corpus jobs envelope (`sonar__fox_jobs_v0.18.1_trimmed.json`, 18 records of 6 jobs) with its records
    repeated until its JSON is at least `size` bytes; copy k of a record has job id + k x 10,000,000, so
    every record is distinct. `cluster` replaces the envelope's own."""
    env = decode_envelope((SONAR / "sonar__fox_jobs_v0.18.1_trimmed.json").read_bytes(), expect="job")
    assert isinstance(env, JobsEnvelope) and env.data is not None
    a = env.data.attributes
    per_copy = len(encode_envelope(env)) - 200
    copies = size // per_copy + 1
    records = [
        msgspec.structs.replace(r, job_id=r.job_id + k * 10_000_000)
        for k in range(copies)
        for r in a.slurm_jobs
    ]
    attrs = msgspec.structs.replace(a, slurm_jobs=records, cluster=cluster or a.cluster)
    return msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))


def big_cluster(groups: int, cluster: str = "") -> ClusterEnvelope:
    """The corpus cluster envelope (`jobanalyzer__cluster1_cluster_v0.14.jsonl`) with `groups` node groups of
    its shape (rack `r<i>`: 64 nodes, states from the corpus) and one partition per 16 racks."""
    line = (SONAR / "jobanalyzer__cluster1_cluster_v0.14.jsonl").read_bytes().splitlines()[0]
    env = decode_envelope(line, expect="cluster")
    assert isinstance(env, ClusterEnvelope) and env.data is not None
    a = env.data.attributes
    states = [g.states for g in a.nodes]
    nodes = [
        ClusterNodes(names=[f"r{i}-c[1-60]", f"r{i}-gpu-[1-4]"], states=states[i % len(states)])
        for i in range(groups)
    ]
    partitions = [
        *a.partitions,
        *(
            ClusterPartition(name=f"rack{i}", nodes=[f"r{j}-c[1-60]" for j in range(i, min(i + 16, groups))])
            for i in range(0, groups, 16)
        ),
    ]
    attrs = msgspec.structs.replace(a, nodes=nodes, partitions=partitions, cluster=cluster or a.cluster)
    return msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))


def big_sample(size: int, cluster: str = "") -> SampleEnvelope:
    """The corpus sample (`jobanalyzer__cluster1_sample_v0.19.jsonl`) with its jobs repeated (job ids of their
    own) until its JSON is at least `size` bytes: one reading of one node, larger than a message."""
    env = decode_envelope((SONAR / "jobanalyzer__cluster1_sample_v0.19.jsonl").read_bytes(), expect="sample")
    assert isinstance(env, SampleEnvelope) and env.data is not None
    a = env.data.attributes
    copies = size // len(msgspec.json.encode(a.jobs)) + 1
    jobs = [msgspec.structs.replace(j, job=j.job + k * 10_000_000) for k in range(copies) for j in a.jobs]
    attrs = msgspec.structs.replace(a, jobs=jobs, cluster=cluster or a.cluster)
    return msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))
