"""Each validation rule of `schemas.sonar`, with the exact field path it reports; framing; the API."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcbus.schemas import noderange
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar import (
    PartlyInvalid,
    decode_envelope,
    encode_envelope,
    iter_envelopes,
    iter_envelopes_from_lines,
    kind_of,
    rules,
    validate_envelope,
)
from hpcbus.schemas.sonar.diagnose import MAX_PROBLEMS, diagnose
from hpcbus.schemas.sonar.types import (
    AnyEnvelope,
    ClusterEnvelope,
    ErrorsEnvelope,
    JobsData,
    JobsEnvelope,
    Metadata,
    SampleAttributes,
    SampleData,
    SampleEnvelope,
    SampleSystem,
    SysinfoEnvelope,
)
from hpcbus.schemas.sonar.validate import _build, _check, problem_from_msgspec
from tests.corpus import CORPUS

META = {"producer": "sonar", "version": "0.19.0"}
TIME = "2025-03-01T00:00:01+01:00"


def sample() -> dict[str, Any]:
    return {
        "meta": dict(META),
        "data": {
            "type": "sample",
            "attributes": {
                "time": TIME,
                "cluster": "fox.educloud.no",
                "node": "c1-10.fox",
                "system": {"boot": "2026-01-14T11:39:00+00:00", "cpus": [1, 2], "used_memory": 5},
                "jobs": [
                    {
                        "job": 7,
                        "user": "alice",
                        "processes": [{"pid": 1, "cmd": "a"}, {"pid": 2, "cmd": "b"}],
                    },
                    {"job": 8, "user": "bob", "epoch": 3, "processes": [{"pid": 3, "cmd": "c"}]},
                ],
            },
        },
    }


def sysinfo() -> dict[str, Any]:
    attrs = {
        "time": TIME,
        "cluster": "fox.educloud.no",
        "node": "c1-6.fox",
        "os_name": "Linux",
        "os_release": "5.14",
        "architecture": "x86_64",
        "sockets": 2,
        "cores_per_socket": 64,
        "threads_per_core": 2,
        "memory": 527433728,
    }
    return {"meta": dict(META), "data": {"type": "sysinfo", "attributes": attrs}}


def jobs() -> dict[str, Any]:
    job = {"job_id": 1, "job_state": "PENDING", "submit_time": TIME}
    attrs = {"time": TIME, "cluster": "fox.educloud.no", "slurm_jobs": [job, dict(job, job_id=2)]}
    return {"meta": dict(META), "data": {"type": "job", "attributes": attrs}}


def cluster() -> dict[str, Any]:
    attrs = {
        "time": TIME,
        "cluster": "fox.educloud.no",
        "slurm": True,
        "partitions": [{"name": "normal", "nodes": ["c1-[5-28]", "bigmem-1"]}],
        "nodes": [{"names": ["gpu-[1-2,4]"], "states": ["MIXED", "DRAIN"]}],
    }
    return {"meta": dict(META), "data": {"type": "cluster", "attributes": attrs}}


def errors_only() -> dict[str, Any]:
    error = {"time": TIME, "detail": "No can do", "cluster": "fox.educloud.no", "node": "c1-26.fox"}
    return {"meta": dict(META), "errors": [error]}


def problems(doc: Any, expect: str | None = None) -> list[tuple[str, str]]:
    """(path, reason) of every problem; fails if the envelope is accepted."""
    raw = doc if isinstance(doc, str | bytes) else json.dumps(doc)
    with pytest.raises(InvalidInput) as info:
        decode_envelope(raw, expect)
    return [(p.path, p.reason) for p in info.value.problems]


def only(doc: Any, expect: str | None = None) -> tuple[str, str]:
    found = problems(doc, expect)
    assert len(found) == 1, found
    return found[0]


def put(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of `doc` with the value at a dotted path (`a.b[2].c`) set; `...` deletes it."""
    doc = copy.deepcopy(doc)
    keys: list[str | int] = []
    for part in path.split("."):
        name, *indexes = part.split("[")
        keys.append(name)
        keys += [int(i.rstrip("]")) for i in indexes]
    node: Any = doc
    for key in keys[:-1]:
        node = node[key]
    if value is ...:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return doc


# --- the good ones ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "cls"),
    [
        (sample(), SampleEnvelope),
        (sysinfo(), SysinfoEnvelope),
        (jobs(), JobsEnvelope),
        (cluster(), ClusterEnvelope),
        (errors_only(), ErrorsEnvelope),
    ],
)
def test_valid_envelopes_decode_to_their_class_and_round_trip(doc: dict[str, Any], cls: type) -> None:
    env = decode_envelope(json.dumps(doc))
    assert type(env) is cls
    assert json.loads(encode_envelope(env)) == doc
    assert decode_envelope(json.dumps(doc).encode()) == env


# --- NonemptyString, NonzeroUint, required fields --------------------------------------------------------


@pytest.mark.parametrize(
    ("doc", "path", "required"),
    [
        # Issue 10: required only where the spec says so in words (job_state, a partition's unique name).
        (sample(), "meta.producer", False),
        (sample(), "meta.version", False),
        (sample(), "data.attributes.jobs[1].user", False),
        (sysinfo(), "data.attributes.os_name", False),
        (jobs(), "data.attributes.slurm_jobs[1].job_state", True),
        (cluster(), "data.attributes.partitions[0].name", True),
        (errors_only(), "errors[0].detail", False),
    ],
)
def test_nonempty_string(doc: dict[str, Any], path: str, required: bool) -> None:
    assert only(put(doc, path, "")) == (path, "must not be empty (NonemptyString)")
    if required:
        assert only(put(doc, path, ...)) == (path, "missing required field")
    else:  # absent is accepted and stays absent; only a present empty string is refused
        env = decode_envelope(json.dumps(put(doc, path, ...)))
        assert json.loads(encode_envelope(env)) == put(doc, path, ...)


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (sysinfo(), "data.attributes.sockets"),
        (sysinfo(), "data.attributes.cores_per_socket"),
        (sysinfo(), "data.attributes.threads_per_core"),
        (sysinfo(), "data.attributes.memory"),
        (jobs(), "data.attributes.slurm_jobs[1].job_id"),
    ],
)
def test_nonzero_uint(doc: dict[str, Any], path: str) -> None:
    path_, reason = only(put(doc, path, 0))
    assert path_ == path and reason.startswith("must not be 0 (NonzeroUint")
    assert only(put(doc, path, -4)) == (path, "expected NonzeroUint >= 1, got -4")
    assert only(put(doc, path, "4")) == (path, 'expected an unsigned integer, got string "4"')


def test_optional_nonzero_uint_may_be_omitted_but_not_zero() -> None:
    """array_job_id / het_job_id: "if not zero"; omitted means "not an array job", an explicit 0 is wrong."""
    decode_envelope(json.dumps(put(jobs(), "data.attributes.slurm_jobs[0].array_job_id", 5)))
    path = "data.attributes.slurm_jobs[0].het_job_id"
    assert only(put(jobs(), path, 0))[0] == path


# --- uint64 / int64 / float / bool ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("data.attributes.jobs[1].processes[0].pid", -1, "expected uint64 >= 0, got -1"),
        ("data.attributes.jobs[1].processes[0].pid", "x", 'expected an unsigned integer, got string "x"'),
        ("data.attributes.jobs[1].processes[0].pid", 1.5, "expected an unsigned integer, got number 1.5"),
        ("data.attributes.jobs[1].processes[0].pid", True, "expected an unsigned integer, got true"),
        ("data.attributes.jobs[1].processes[0].pid", None, "expected an unsigned integer, got null"),
        (
            "data.attributes.system.cpus[1]",
            2**63,
            f"{2**63} is larger than {2**63 - 1}, the largest uint64 accepted",
        ),
        ("data.attributes.jobs[0].processes[1].cpu_avg", "1.0", 'expected a number, got string "1.0"'),
        ("data.attributes.jobs[0].processes[1].in_container", 1, "expected true or false, got number 1"),
        ("data.attributes.jobs[0].processes", {}, "expected an array, got an object"),
        ("data.attributes.system", [], "expected an object, got an array"),
    ],
)
def test_type_errors_name_the_exact_path(path: str, value: Any, reason: str) -> None:
    assert only(put(sample(), path, value)) == (path, reason)


def test_signed_and_float_fields_accept_what_sonar_sends() -> None:
    doc = put(sample(), "data.attributes.system.gpus", [{"uuid": "GPU-1", "temperature": -12}])
    doc = put(doc, "data.attributes.jobs[0].processes[0].cpu_util", 100)  # an integer for a float
    env = decode_envelope(json.dumps(doc))
    assert isinstance(env, SampleEnvelope) and env.data is not None
    assert env.data.attributes.system.gpus[0].temperature == -12
    assert env.data.attributes.jobs[0].processes[0].cpu_util == 100.0
    assert json.loads(encode_envelope(env)) == doc  # 100.0 == 100: the number is kept


@pytest.mark.parametrize("value", [0, 1, 2, 7 + 2, 2**63 - 1])
def test_extended_uint_is_a_plain_uint(value: int) -> None:
    """0 unset, 1 infinite, v+2 for v: every uint is a valid ExtendedUint; decoding keeps the raw value."""
    env = decode_envelope(json.dumps(put(jobs(), "data.attributes.slurm_jobs[0].time_limit", value)))
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert env.data.attributes.slurm_jobs[0].time_limit == value


# --- unknown and missing fields ---------------------------------------------------------------------------


def test_unknown_fields_are_rejected_by_path() -> None:
    doc = put(sample(), "data.attributes.jobs[1].processes[0].cpu_percent", 3.0)
    doc = put(doc, "meta.host", "x")
    assert problems(doc) == [
        ("meta.host", "unknown field (not part of this object in the Sonar format)"),
        (
            "data.attributes.jobs[1].processes[0].cpu_percent",
            "unknown field (not part of this object in the Sonar format)",
        ),
    ]


def test_meta_and_system_may_be_absent() -> None:
    """Issue 10: formerly "missing required field"; the spec's default is the empty object, which is what
    an absent object decodes to (and is written back as: msgspec omits no struct-valued default)."""
    for path in ("meta", "data.attributes.system"):
        doc = put(sample(), path, ...)
        env = decode_envelope(json.dumps(doc))
        assert validate_envelope(env) == []
        assert json.loads(encode_envelope(env)) == put(sample(), path, {})


# --- Timestamp / OptionalTimestamp ------------------------------------------------------------------------

GOOD_TIMES = [
    "2025-03-01T00:00:01+01:00",
    "2026-01-14T11:39:00Z",
    "2026-01-14T11:39:00+00:00",
    "2025-12-31T23:59:59-09:30",
    "2024-02-29T12:00:00+01:00",  # leap year
    "2000-02-29T12:00:00+01:00",  # divisible by 400
    "2025-04-30T00:00:00Z",
]
BAD_TIMES = [
    "2025-02-29T12:00:00+01:00",  # not a leap year
    "1900-02-29T12:00:00+01:00",  # divisible by 100, not by 400
    "2025-04-31T00:00:00Z",
    "2025-13-01T00:00:00Z",
    "2025-00-10T00:00:00Z",
    "2025-01-00T00:00:00Z",
    "2025-01-01T24:00:00Z",
    "2025-01-01T23:60:00Z",
    "2025-01-01T23:59:60Z",  # leap seconds are refused
    "2025-01-01T00:00:00.5Z",  # no sub-seconds
    "2025-01-01T00:00:00.000+01:00",
    "2025-01-01 00:00:00Z",
    "2025-01-01T00:00:00",  # no offset
    "2025-01-01T00:00:00+0100",
    "2025-01-01T00:00:00+24:00",
    "2025-01-01t00:00:00z",
    "2025-01-01T00:00:00Z\n",
    "٢٠٢٥-01-01T00:00:00Z",  # Arabic-Indic digits are digits to Python's \d, not to RFC 3339
    "1740000000",
]


@pytest.mark.parametrize("value", GOOD_TIMES)
def test_good_timestamps(value: str) -> None:
    decode_envelope(json.dumps(put(sample(), "data.attributes.time", value)))


@pytest.mark.parametrize("value", BAD_TIMES)
def test_bad_timestamps(value: str) -> None:
    path, reason = only(put(sample(), "data.attributes.time", value))
    assert path == "data.attributes.time"
    assert reason.startswith(f"not a valid Timestamp: {value!r}")


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (sample(), "data.attributes.time"),
    ],
)
def test_timestamp_may_be_absent_but_not_empty(doc: dict[str, Any], path: str) -> None:
    assert only(put(doc, path, "")) == (path, "must not be empty (Timestamp)")
    assert validate_envelope(decode_envelope(json.dumps(put(doc, path, ...)))) == []  # issue 10
    assert only(put(doc, path, "2025-02-30T00:00:00Z"))[0] == path


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (jobs(), "data.attributes.slurm_jobs[1].start_time"),
        (jobs(), "data.attributes.slurm_jobs[1].end_time"),
        (sample(), "data.attributes.system.boot"),
    ],
)
def test_optional_timestamp(doc: dict[str, Any], path: str) -> None:
    decode_envelope(json.dumps(put(doc, path, "")))
    decode_envelope(json.dumps(put(doc, path, "2024-02-29T00:00:00Z")))
    found = only(put(doc, path, "2025-02-29T00:00:00Z"))
    assert found[0] == path and found[1].endswith(" or empty")


def test_submit_time_may_be_absent_but_not_empty_or_malformed() -> None:
    """Issue 10: the spec requires only job_id, job_step, job_name and job_state in every record."""
    path = "data.attributes.slurm_jobs[1].submit_time"
    doc = put(jobs(), path, ...)
    env = decode_envelope(json.dumps(doc))
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert env.data.attributes.slurm_jobs[1].submit_time == ""
    assert json.loads(encode_envelope(env)) == doc  # absent comes back absent
    assert only(put(jobs(), path, "")) == (path, "must not be empty (Timestamp)")
    assert only(put(jobs(), path, "2025-02-30T00:00:00Z"))[0] == path


def test_slurm_job_requires_only_job_id_and_job_state() -> None:
    """job_step and job_name default to "" (their absence, as real Sonar omits them); the rest is optional."""
    doc = put(jobs(), "data.attributes.slurm_jobs", [{"job_id": 5, "job_state": "RUNNING"}])
    assert validate_envelope(decode_envelope(json.dumps(doc))) == []
    assert only(put(doc, "data.attributes.slurm_jobs[0].job_id", ...)) == (
        "data.attributes.slurm_jobs[0].job_id",
        "missing required field",
    )
    assert only(put(doc, "data.attributes.slurm_jobs[0].job_state", ...)) == (
        "data.attributes.slurm_jobs[0].job_state",
        "missing required field",
    )


def test_software_version_may_be_absent() -> None:
    """SysinfoSoftwareVersion: only `key` ("a unique identifier") is required; a present version is non-empty."""
    path = "data.attributes.software"
    decode_envelope(json.dumps(put(sysinfo(), path, [{"key": "cuda"}])))
    assert only(put(sysinfo(), path, [{"key": "cuda", "version": ""}])) == (
        f"{path}[0].version",
        "must not be empty (NonemptyString)",
    )
    assert only(put(sysinfo(), path, [{"version": "12"}])) == (f"{path}[0].key", "missing required field")


def test_a_bad_time_repeated_in_a_jobs_envelope_is_reported_for_every_record() -> None:
    """The fast path caches *valid* strings only, so every bad occurrence keeps its own problem."""
    doc = put(jobs(), "data.attributes.slurm_jobs[0].submit_time", "2025-02-30T00:00:00Z")
    doc = put(doc, "data.attributes.slurm_jobs[1].submit_time", "2025-02-30T00:00:00Z")
    assert [p for p, _ in problems(doc)] == [
        "data.attributes.slurm_jobs[0].submit_time",
        "data.attributes.slurm_jobs[1].submit_time",
    ]


def test_recoverable_error_time_inside_a_sample_is_checked() -> None:
    error = {"time": "yesterday", "detail": "gpu gone", "cluster": "fox", "node": "c1"}
    path, reason = only(put(sample(), "data.attributes.errors", [error]))
    assert path == "data.attributes.errors[0].time" and reason.startswith("not a valid Timestamp")


# --- Hostname ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["c1-6.fox", "fox.educloud.no", "bling", "n1", "ML6.hpc.uio.no", "a" * 63])
def test_good_hostnames(value: str) -> None:
    decode_envelope(json.dumps(put(sample(), "data.attributes.node", value)))


@pytest.mark.parametrize(
    "value", ["a_b", "-x", "x-", "a..b", "fox.", ".fox", "a b", "a" * 64, "c1\n", "c[1-2]", "ñode"]
)
def test_bad_hostnames(value: str) -> None:
    path, reason = only(put(sample(), "data.attributes.node", value))
    assert path == "data.attributes.node"
    assert reason.startswith(f"not a valid Hostname: {value!r}")


def test_hostname_empty_and_too_long() -> None:
    assert only(put(errors_only(), "errors[0].node", "")) == (
        "errors[0].node",
        "must not be empty (Hostname)",
    )
    long_name = ".".join(["a" * 63] * 4)
    assert only(put(sysinfo(), "data.attributes.node", long_name)) == (
        "data.attributes.node",
        "longer than 253 characters (Hostname)",
    )


# --- Clustername (Sonar 0.19: util/formats/newfmt/types.go, doc/NEW-FORMAT.md) ------------------------------
# "The cluster name is a string with the same restrictions on character set as Hostname. Typically the cluster
# name is an FQDN (a Hostname ending in a TLD), but it need not be." Every `cluster` field is one: the
# attributes of each kind, an envelope's errors and a sample's recoverable errors.

CLUSTER_FIELDS = [
    (sample, "data.attributes.cluster"),
    (sysinfo, "data.attributes.cluster"),
    (jobs, "data.attributes.cluster"),
    (cluster, "data.attributes.cluster"),
    (errors_only, "errors[0].cluster"),
]


def _sample_with_error() -> dict[str, Any]:
    error = {"time": TIME, "detail": "gpu gone", "cluster": "fox.educloud.no", "node": "c1-10.fox"}
    return put(sample(), "data.attributes.errors", [error])


CLUSTER_FIELDS.append((_sample_with_error, "data.attributes.errors[0].cluster"))


@pytest.mark.parametrize(("doc", "path"), CLUSTER_FIELDS)
@pytest.mark.parametrize(
    "value",
    [
        "fox.educloud.no",
        "xyzzy.no",  # Sonar's own tests (util/formats/newfmt_test.go)
        "saga",  # need not be an FQDN
        "ML6.hpc.uio.no",
        "hpc-",  # Sonar's character set, not a host name's shape (a label ending in '-')
        "the-norwegian-research-infrastructure-services-national-hpc-cluster.sigma2.no",  # a label over 63
    ],
)
def test_good_clusternames(doc: Any, path: str, value: str) -> None:
    env = decode_envelope(json.dumps(put(doc(), path, value)))
    assert json.loads(encode_envelope(env)) == put(doc(), path, value)


@pytest.mark.parametrize(("doc", "path"), CLUSTER_FIELDS)
@pytest.mark.parametrize(
    "value",
    [
        "fox_1",  # '_': not in Sonar's character set (the bus would take it)
        "fox educloud",
        "fox/no",
        "fóx.no",
        "c[1-2]",
        "fox\n",
        "a..b",  # the bus' rules on top: a cluster is a run of subject tokens and a directory name
        ".fox",
        "fox.",
        "-fox",
    ],
)
def test_bad_clusternames(doc: Any, path: str, value: str) -> None:
    found_path, reason = only(put(doc(), path, value))
    assert found_path == path
    assert reason.startswith(f"not a valid Clustername: {value!r}")


@pytest.mark.parametrize(("doc", "path"), CLUSTER_FIELDS)
def test_clustername_empty_and_too_long(doc: Any, path: str) -> None:
    assert only(put(doc(), path, "")) == (path, "must not be empty (Clustername)")
    long_name = ".".join(["a" * 63] * 4)
    assert only(put(doc(), path, long_name)) == (path, "longer than 253 characters (Clustername)")


# --- NodeRange and ClusterNodes.names ---------------------------------------------------------------------


def test_node_range_syntax_is_checked_with_the_path() -> None:
    doc = put(cluster(), "data.attributes.partitions[0].nodes[1]", "c[3-1]")
    doc = put(doc, "data.attributes.nodes[0].names[0]", "n[1-3,2]")
    found = problems(doc)
    assert [p for p, _ in found] == [
        "data.attributes.partitions[0].nodes[1]",
        "data.attributes.nodes[0].names[0]",
    ]
    assert "first number greater than its second" in found[0][1]
    assert "repeated" in found[1][1]


def test_node_range_empty_and_names_empty() -> None:
    path = "data.attributes.partitions[0].nodes[0]"
    assert only(put(cluster(), path, "")) == (path, "must not be empty (NodeRange)")
    path = "data.attributes.nodes[0].names"
    assert only(put(cluster(), path, [])) == (path, "must not be empty")
    assert only(put(cluster(), path, ...)) == (path, "missing required field")


def test_slurm_job_nodes_are_plain_strings() -> None:
    """SlurmJob.nodes is []string in the spec, and Sonar v0.14 sends "None assigned" for pending jobs."""
    decode_envelope(json.dumps(put(jobs(), "data.attributes.slurm_jobs[0].nodes", ["None assigned"])))


# --- envelope-level rules ---------------------------------------------------------------------------------


def test_data_and_errors_are_exclusive() -> None:
    both = put(sample(), "errors", errors_only()["errors"])
    assert only(both) == ("errors", "`data` and `errors` are exclusive: an envelope carries one or the other")
    neither = put(sample(), "data", ...)
    assert only(neither) == ("", "envelope has neither `data` nor `errors` (exactly one is required)")
    assert only(put(neither, "errors", []))[0] == ""
    assert only(put(neither, "data", None))[0] == ""
    decode_envelope(json.dumps(put(sample(), "errors", [])))  # an empty list counts as absent


def test_other_format_versions_are_kept() -> None:
    """Sonar's own reader accepts any `meta.format` (its fixture carries 37); the value is kept."""
    env = decode_envelope(json.dumps(put(sample(), "meta.format", 37)))
    assert env.meta.format == 37
    assert b'"format":37' in encode_envelope(env)


def test_sysinfo_without_architecture_and_bare_errors_are_accepted() -> None:
    """Sonar 0.13 sent no `architecture`; Sonar's fixture has an error object with only `detail`."""
    doc = sysinfo()
    del doc["data"]["attributes"]["architecture"]
    assert decode_envelope(json.dumps(doc)).data.attributes.architecture == ""
    env = decode_envelope(
        json.dumps({"meta": {"producer": "sonar", "version": "0.13.0"}, "errors": [{"detail": "x"}]})
    )
    assert env.errors[0].time == ""
    path, reason = only(put(sysinfo(), "data.attributes.architecture", ""))
    assert path == "data.attributes.architecture" and "empty" in reason


def test_job_zero_needs_an_epoch() -> None:
    path = "data.attributes.jobs[0].job"
    assert only(put(sample(), path, 0)) == (
        path,
        "job 0 with epoch 0: a Slurm job (epoch 0) must have a non-zero job ID",
    )
    decode_envelope(json.dumps(put(put(sample(), path, 0), "data.attributes.jobs[0].epoch", 9)))


def test_data_type_dispatch() -> None:
    assert only(put(sample(), "data.type", "samples")) == (
        "data.type",
        'unknown data type string "samples": expected one of "sample", "sysinfo", "job", "jobs", "cluster"',
    )
    assert only(put(sample(), "data.type", ...))[0] == "data.type"
    assert only(put(sample(), "data", [])) == ("data", "expected an object or null, got an array")


def test_all_problems_are_collected() -> None:
    """A type error does not hide the other problems, semantic ones included."""
    doc = put(sample(), "data.attributes.jobs[1].processes[0].pid", "x")
    doc = put(doc, "data.attributes.jobs[0].job", 0)
    doc = put(doc, "data.attributes.time", "2025-02-30T00:00:00Z")
    doc = put(doc, "errors", errors_only()["errors"])
    assert [p for p, _ in problems(doc)] == [
        "data.attributes.time",
        "data.attributes.jobs[0].job",
        "data.attributes.jobs[1].processes[0].pid",
        "errors",
    ]


def test_problems_are_capped() -> None:
    doc = put(sample(), "data.attributes.jobs[0].processes", [{"pid": -1}] * (MAX_PROBLEMS + 20))
    found = problems(doc)
    assert len(found) == MAX_PROBLEMS + 1
    assert found[-1] == ("", "... and 20 more problems")


def test_not_an_envelope() -> None:
    for doc in ([1, 2], "text", 3, None, {"version": "0.13.100", "hostname": "x"}):
        path, reason = only(json.dumps(doc))
        assert path == "" and reason.startswith("not a Sonar JSON envelope")


def test_syntax_and_encoding_errors() -> None:
    path, reason = only('{"meta":{"producer":"sonar",}')
    assert path == "" and reason.startswith("invalid JSON: ")
    raw = json.dumps(sample()).encode().replace(b"alice", b"al\xffce")
    assert only(raw)[1].startswith("not valid UTF-8")


def test_problem_kind_names_the_envelope() -> None:
    def kinds(doc: Any, expect: str | None = None) -> set[str]:
        with pytest.raises(InvalidInput) as info:
            decode_envelope(doc if isinstance(doc, str) else json.dumps(doc), expect)
        return {p.kind for p in info.value.problems}

    assert kinds(put(sample(), "meta.producer", "")) == {"sonar sample"}
    assert kinds(put(jobs(), "data.type", "jobs") | {"errors": errors_only()["errors"]}) == {"sonar job"}
    assert kinds(put(sysinfo(), "data.attributes.sockets", "2")) == {"sonar sysinfo"}
    assert kinds("{") == {"sonar envelope"}
    assert kinds("{", expect="cluster") == {"sonar cluster"}
    error = put(errors_only(), "errors[0].time", "yesterday")
    assert kinds(error) == {"sonar envelope"}
    assert kinds(error, expect="sample") == {"sonar sample"}


def test_problems_print_in_the_shared_form() -> None:
    with pytest.raises(InvalidInput) as info:
        decode_envelope(json.dumps(put(sample(), "data.attributes.jobs[1].processes[0].pid", -1)))
    problem = info.value.problems[0].located("fox.sonar.sample")
    assert str(problem) == (
        "fox.sonar.sample: sonar sample: data.attributes.jobs[1].processes[0].pid: expected uint64 >= 0, got -1"
    )


# --- expect, kinds, data.type spellings -------------------------------------------------------------------


def test_expect() -> None:
    assert isinstance(decode_envelope(json.dumps(errors_only()), "sysinfo"), SysinfoEnvelope)
    assert isinstance(decode_envelope(json.dumps(errors_only()), "jobs"), JobsEnvelope)
    assert only(sample(), expect="cluster") == (
        "data.type",
        "expected a `cluster` envelope, got data of type `sample`",
    )
    bad = put(sample(), "meta.producer", 3)
    assert problems(bad, expect="cluster")[0] == (
        "data.type",
        "expected a `cluster` envelope, got data of type `sample`",
    )
    with pytest.raises(ValueError, match="unknown Sonar envelope kind"):
        decode_envelope(json.dumps(sample()), "samples")


def test_kind_of() -> None:
    assert [
        kind_of(decode_envelope(json.dumps(d()))) for d in (sample, sysinfo, jobs, cluster, errors_only)
    ] == [
        "sample",
        "sysinfo",
        "job",
        "cluster",
        "",
    ]


@pytest.mark.parametrize("spelling", ["job", "jobs"])
def test_both_jobs_spellings_round_trip(spelling: str) -> None:
    doc = put(jobs(), "data.type", spelling)
    env = decode_envelope(json.dumps(doc))
    assert isinstance(env, JobsEnvelope) and isinstance(env.data, JobsData)
    assert env.data.type == spelling
    assert json.loads(encode_envelope(env)) == doc


# --- validate_envelope (envelopes built in Python) ------------------------------------------------------


def test_validate_envelope_applies_the_decoder_rules_to_built_envelopes() -> None:
    attrs = SampleAttributes(time="now", cluster="fox", node="c1", system=SampleSystem())
    env = SampleEnvelope(meta=Metadata(producer="hpcbus", version="0.1"), data=SampleData(attributes=attrs))
    found = validate_envelope(env)
    assert [(p.path, p.kind) for p in found] == [("data.attributes.time", "sonar sample")]
    good = msgspec.structs.replace(env, data=SampleData(attributes=msgspec.structs.replace(attrs, time=TIME)))
    assert validate_envelope(good) == []
    assert validate_envelope(ErrorsEnvelope(meta=env.meta)) == [
        Problem("envelope has neither `data` nor `errors` (exactly one is required)", kind="sonar envelope")
    ]


# --- msgspec messages -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (
            "Expected `int`, got `str` - at `$.data.attributes.jobs[3].processes[0].pid`",
            ("data.attributes.jobs[3].processes[0].pid", "Expected `int`, got `str`"),
        ),
        ("Object missing required field `meta`", ("meta", "missing required field")),
        ("Object missing required field `type` - at `$.data`", ("data.type", "missing required field")),
        (
            "Object contains unknown field `os` - at `$.data.attributes`",
            ("data.attributes.os", "unknown field"),
        ),
        ("Invalid value 'jobx' - at `$.data.type`", ("data.type", "Invalid value 'jobx'")),
        ("Input data was truncated", ("", "Input data was truncated")),
    ],
)
def test_problem_from_msgspec(message: str, expected: tuple[str, str]) -> None:
    assert problem_from_msgspec(message) == expected


# --- the two checkers agree -------------------------------------------------------------------------------

CORPUS_DOCS = [
    json.loads(line)
    for name in ("jobanalyzer__n1_sample_gpu_v0.14.jsonl", "jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl")
    for line in (CORPUS / "sonar" / name).read_text(encoding="utf-8").splitlines()
] + [sysinfo(), cluster(), errors_only()]

JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["", "2025-02-29T00:00:00Z", TIME, "c[2-1]", "gpu-[1-3]", "sample", "jobs", "x y"]),
    st.just([]),
    st.just({}),
)


def leaf_paths(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaf_paths(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaf_paths(item, (*path, i))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fast_path_and_diagnosis_agree(data: st.DataObject) -> None:
    """Mutate a real envelope at random; the typed decoder and the diagnosing walker must agree on whether
    the types are right, on msgspec's first problem, and (when the types are right) on every rule."""
    doc = copy.deepcopy(data.draw(st.sampled_from(CORPUS_DOCS)))
    for _ in range(data.draw(st.integers(1, 3))):
        paths = list(leaf_paths(doc))[1:]
        if not paths:
            break
        path = data.draw(st.sampled_from(paths))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[data.draw(st.sampled_from(["extra", "type", "time", "pid", "errors"]))] = data.draw(
                JSON_VALUES
            )
        else:
            parent[path[-1]] = data.draw(JSON_VALUES)
    raw = json.dumps(doc)
    diagnosed = set(diagnose(doc))
    try:
        env = msgspec.json.decode(raw, type=AnyEnvelope)
    except msgspec.ValidationError as exc:
        assert diagnosed, raw
        if len(diagnosed) == 1 and next(iter(diagnosed))[1].startswith("not a Sonar JSON envelope"):
            return  # no envelope key left: one problem for the whole object instead of msgspec's first
        first_path = problem_from_msgspec(str(exc))[0]
        assert first_path in {p for p, _ in diagnosed}, (str(exc), diagnosed)
        return
    kind = kind_of(_build(env, None)) or None
    refused: dict[int, list[tuple[str, str]]] = {}  # records refused alone: diagnose lists them as problems
    found = set(_check(env, kind, None, refused)) | {p for record in refused.values() for p in record}
    if doc == {}:  # issue 10: `meta` is optional, so `{}` decodes; both call it rejected, in their own words
        assert found == {rules.exclusive(False, False)}
        assert len(diagnosed) == 1 and next(iter(diagnosed))[1].startswith("not a Sonar JSON envelope")
        return
    assert found == diagnosed, raw


# --- framing: iter_envelopes / iter_envelopes_from_lines ------------------------------------------------


def compact(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"))


def summary(text: str, **kw: Any) -> list[tuple[int, str]]:
    """(start line, class name or the first problem's "line: path: reason")."""
    out = []
    for line, result in iter_envelopes(text, **kw):
        if isinstance(result, InvalidInput):
            p = result.problems[0]
            out.append((line, f"{p.line}: {p.path}: {p.reason}"))
        else:
            out.append((line, type(result).__name__))
    return out


def test_jsonl_with_a_truncated_line_resynchronises() -> None:
    good = compact(sample())
    text = "\n".join([good, good[:50], good, "", compact(cluster())]) + "\n"
    assert summary(text) == [
        (1, "SampleEnvelope"),
        (2, "2: : unterminated JSON object: a new envelope starts at line 3"),
        (3, "SampleEnvelope"),
        (5, "ClusterEnvelope"),
    ]


def test_jsonl_with_a_broken_line_in_the_middle() -> None:
    good = compact(sample())
    text = "\n".join([good, good.replace('"cpus":', '"cpus"'), good])
    result = summary(text)
    assert [r[0] for r in result] == [1, 2, 3]
    assert result[1][1].startswith("2: : invalid JSON: ")
    assert result[0][1] == result[2][1] == "SampleEnvelope"


def test_pretty_printed_back_to_back_with_braces_in_strings() -> None:
    tricky = put(sample(), "data.attributes.jobs[0].processes[0].cmd", 'a{"b"}\\}{')
    tricky = put(tricky, "meta.producer", "so{nar")
    text = (
        json.dumps(tricky, indent=2)
        + "\n"
        + json.dumps(jobs(), indent=4)
        + "\n\n"
        + json.dumps(cluster(), indent=1)
    )
    lines = text.split("\n")
    starts = [i + 1 for i, line in enumerate(lines) if line == "{"]
    assert summary(text) == list(
        zip(starts, ["SampleEnvelope", "JobsEnvelope", "ClusterEnvelope"], strict=True)
    )
    env = next(iter_envelopes(text))[1]
    assert isinstance(env, SampleEnvelope) and env.data is not None
    assert env.data.attributes.jobs[0].processes[0].cmd == 'a{"b"}\\}{'


def test_syntax_error_in_pretty_printed_envelope_names_its_line() -> None:
    first = json.dumps(sample(), indent=2).replace('"cpus": [', '"cpus": [,')
    text = first + "\n" + json.dumps(sysinfo(), indent=2)
    bad_line = next(i for i, line in enumerate(text.split("\n"), 1) if line.endswith('"cpus": [,'))
    (line1, r1), (line2, r2) = iter_envelopes(text)
    assert line1 == 1 and isinstance(r1, InvalidInput) and r1.problems[0].line == bad_line
    assert isinstance(r2, SysinfoEnvelope) and line2 == len(first.split("\n")) + 1


def test_envelopes_on_one_line_and_junk_between() -> None:
    text = (
        compact(sample())
        + compact(jobs())
        + "\n"
        + "v=0.13,host=x\nnot json\n"
        + compact(cluster())
        + " trailing"
    )
    assert summary(text) == [
        (1, "SampleEnvelope"),
        (1, "JobsEnvelope"),
        (2, "2: : not a Sonar JSON envelope: lines 2-3 do not start with `{`"),
        (4, "ClusterEnvelope"),
        (4, "4: : not a Sonar JSON envelope: line 4 does not start with `{`"),
    ]


def test_crlf_and_leading_whitespace() -> None:
    text = compact(sample()) + "\r\n   " + compact(sysinfo()) + "\r\n"
    assert summary(text) == [(1, "SampleEnvelope"), (2, "SysinfoEnvelope")]


def test_unterminated_at_end_of_input_and_unterminated_string() -> None:
    text = json.dumps(sample(), indent=2)
    assert summary(text[:-2]) == [(1, "1: : unterminated JSON object: the input ends inside it")]
    broken = '{"meta": {"producer": "son\n  }\n}\n' + compact(jobs())
    assert summary(broken) == [
        (1, "1: : unterminated JSON object: a new envelope starts at line 4"),
        (4, "JobsEnvelope"),
    ]


def test_iter_expect_is_passed_on() -> None:
    text = compact(errors_only()) + "\n" + compact(sample())
    assert summary(text, expect="sample") == [(1, "SampleEnvelope"), (1 + 1, "SampleEnvelope")]
    assert summary(text, expect="job")[1] == (
        2,
        "2: data.type: expected a `job` envelope, got data of type `sample`",
    )


def test_streaming_reader_yields_before_reading_everything() -> None:
    """Constant memory: each JSONL envelope comes out as soon as its line is read."""
    good = compact(sample())
    consumed = []

    def lines() -> Iterator[str]:
        for i in range(1, 1_000_000):
            consumed.append(i)
            yield good + "\n"

    stream = iter_envelopes_from_lines(lines())
    for n in range(1, 4):
        line, env = next(stream)
        assert line == n and isinstance(env, SampleEnvelope)
    assert len(consumed) == 3


def test_streaming_pretty_printed_input_buffers_one_envelope() -> None:
    text = json.dumps(sample(), indent=2) + "\n" + json.dumps(jobs(), indent=2) + "\n"
    consumed = []

    def lines() -> Iterator[str]:
        for i, line in enumerate(text.splitlines(keepends=True), 1):
            consumed.append(i)
            yield line

    stream = iter_envelopes_from_lines(lines())
    line, env = next(stream)
    assert line == 1 and isinstance(env, SampleEnvelope)
    assert len(consumed) == len(json.dumps(sample(), indent=2).split("\n"))


@settings(max_examples=500, deadline=None)
@given(
    st.one_of(
        st.text(alphabet="ab1-0[],.9_ ", max_size=16),
        st.from_regex(
            r"[a-c0-9-]{1,3}\[[0-9]{1,2}(-[0-9]{1,2})?(,[0-9]{1,2}(-[0-9]{1,2})?){0,3}\][a-c.]{0,2}",
            fullmatch=True,
        ),
    )
)
def test_node_range_shortcut_never_accepts_what_noderange_rejects(text: str) -> None:
    """`rules._plainly_valid` is a fast path only: whatever it accepts, `schemas.noderange` accepts too."""
    if rules._plainly_valid(text):
        assert noderange.is_valid(text), text
        assert noderange.expand(text)
    assert (rules.node_range(text) is None) == noderange.is_valid(text)


def test_json_nested_past_the_decoders_limit_is_invalid_input_not_a_crash() -> None:
    """msgspec raises RecursionError (not DecodeError) for very deep JSON: a hostile message on
    `<cluster>.sonar.sample` must be a Problem the worker dead-letters, never an exception that stops it."""
    from hpcbus.schemas.problems import InvalidInput
    from hpcbus.schemas.sonar import decode_envelope

    deep = '{"meta": {"producer": "sonar", "version": "1"}, "data": ' + "[" * 10_000 + "]" * 10_000 + "}"
    with pytest.raises(InvalidInput) as exc:
        decode_envelope(deep, "sample")
    assert "nested too deeply" in str(exc.value)


# --- the time window (issue 29 item 9) -------------------------------------------------------------------

LATEST = 1_800_000_000
"""A reader's now + max_future (2027-01-15T08:00:00Z): later than every time of the documents above."""


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        (sample(), "data.attributes.time"),
        (sample(), "data.attributes.system.boot"),
        (sysinfo(), "data.attributes.time"),
        (cluster(), "data.attributes.time"),
        (jobs(), "data.attributes.time"),
    ],
)
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0001-01-01T00:00:00+02:00", "is before 2000-01-01"),
        ("1999-12-31T23:59:59Z", "is before 2000-01-01"),
        ("9999-12-31T23:59:59Z", "s later than now + max_future (2027-01-15T08:00:00Z)"),
    ],
)
def test_envelope_times_outside_the_window_are_refused(
    doc: dict[str, Any], path: str, value: str, why: str
) -> None:
    """Sonar envelopes dated year 0001 or 9999 were accepted: with the reader's clock (`latest`), a time outside
    [2000-01-01, now + max_future] refuses the envelope with the field's path, as line protocol's window does."""
    raw = json.dumps(put(doc, path, value))
    with pytest.raises(InvalidInput) as caught:
        decode_envelope(raw, latest=LATEST)
    [problem] = caught.value.problems
    assert problem.path == path and problem.reason.startswith(f"{value!r} is "), problem
    assert problem.reason.endswith(why), problem
    decode_envelope(raw)  # without a clock (an envelope of any age, built in Python): no window, as for LP
    decode_envelope(json.dumps(put(doc, path, "2000-01-01T00:00:00Z")), latest=LATEST)  # the edges are in
    decode_envelope(json.dumps(put(doc, path, "2027-01-15T09:00:00+01:00")), latest=LATEST)


def test_error_times_outside_the_window_are_refused() -> None:
    doc = errors_only()
    doc["errors"][0]["time"] = "9999-01-01T00:00:00Z"
    with pytest.raises(InvalidInput) as caught:
        decode_envelope(json.dumps(doc), expect="sample", latest=LATEST)
    assert [p.path for p in caught.value.problems] == ["errors[0].time"]


def test_a_job_record_dated_outside_the_window_is_refused_alone() -> None:
    """A record is one of many users' jobs: its times outside the window refuse it alone (the others are
    kept, as beside a bad host list), and the envelope's own time still refuses the whole envelope."""
    doc = put(jobs(), "data.attributes.slurm_jobs[1].start_time", "0001-01-01T00:00:00Z")
    with pytest.raises(PartlyInvalid) as caught:
        decode_envelope(json.dumps(doc), latest=LATEST)
    assert [p.path for p in caught.value.problems] == ["data.attributes.slurm_jobs[1].start_time"]
    assert "before 2000-01-01; this record is refused, the others are kept" in caught.value.problems[0].reason
    kept = caught.value.envelope.data.attributes.slurm_jobs  # type: ignore[union-attr]
    assert [job.job_id for job in kept] == [1]


def test_iterated_envelopes_keep_the_window() -> None:
    good, bad = sample(), put(sample(), "data.attributes.time", "9999-12-31T23:59:59Z")
    text = "\n".join(json.dumps(d) for d in (good, bad, good))
    found = list(iter_envelopes(text, latest=LATEST))
    assert [type(item).__name__ for _, item in found] == ["SampleEnvelope", "InvalidInput", "SampleEnvelope"]
    lines = [json.dumps(bad)]
    [(_, item)] = list(iter_envelopes_from_lines(lines, latest=LATEST))
    assert isinstance(item, InvalidInput) and item.problems[0].path == "data.attributes.time"
