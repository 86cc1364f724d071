"""cc-backend's job events: the `start_job` / `stop_job` payloads and the line that carries them.

cc-backend learns about jobs only from `job,function=start_job|stop_job event="<JSON>" <ts>` lines on
`<cluster>.events.job`. Every hpcbus producer (node, Slurm, OCS) and the Sonar -> line protocol translator
builds them here, with `job_event_line`, so a job looks the same to cc-backend whoever announced it.

cc-backend (internal/api/nats.go) decodes the JSON payloads with `DisallowUnknownFields`, so a single
misspelt or extra key makes it drop the event with only a log line. The structs below therefore mirror its
Go types field for field (cc-lib `schema.Job` for start_job, `StopJobAPIRequest` for stop_job), forbid
unknown fields when decoding (the tests decode cc-backend's own example payloads with them), and use
cc-backend's defaults as theirs so `omit_defaults` never changes what cc-backend ends up with.

What cc-backend then checks (importer.SanityChecks), and the builders must guarantee: the user is not empty,
`resources` is not empty and has exactly `numNodes` entries, `numNodes` >= 1, `jobState` is one of its
states; for stop_job, `stopTime` >= `startTime`. The cluster must exist in cc-backend's configuration,
which only the caller can know.

Reading is lenient where cc-backend is strict (`read_start_job`, `read_stop_job`): hpcbus reads events from
any producer, so unknown keys are dropped and only `jobId` is required.

Job states are Slurm's words everywhere on the bus (Sonar's `job_state`, the OCS mapping); `cc_job_state`
turns one into cc-backend's lower-case state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal, get_args

import msgspec

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.lineprotocol.format import tag_set
from hpcbus.schemas.names import (
    JOB_NAME_MAX,
    TAG_VALUE_MAX,
    cluster_problem,
    host_problem,
    safe_text,
    text_problem,
)

__all__ = [
    "CC_JOB_STATES",
    "CcJobState",
    "Resource",
    "Shared",
    "StartJob",
    "StopJob",
    "Tag",
    "cc_job_state",
    "job_event_heads",
    "job_event_line",
    "job_event_text",
    "read_start_job",
    "read_stop_job",
    "start_job_names",
    "start_job_names_of",
]

CcJobState = Literal[
    "boot_fail",
    "cancelled",
    "completed",
    "deadline",
    "failed",
    "node_fail",
    "out_of_memory",
    "pending",
    "preempted",
    "running",
    "suspended",
    "timeout",
]
"""cc-lib `schema.JobState`: the values `JobState.Valid()` accepts."""

CC_JOB_STATES: Final[frozenset[str]] = frozenset(get_args(CcJobState))

Shared = Literal["none", "single_user", "multi_user"]
"""cc-lib `Job.Shared`: how the job's nodes are shared."""

_SLURM_TO_CC: Final[dict[str, CcJobState]] = {
    "BOOT_FAIL": "boot_fail",
    "CANCELLED": "cancelled",
    "COMPLETED": "completed",
    "DEADLINE": "deadline",
    "FAILED": "failed",
    "NODE_FAIL": "node_fail",
    "OUT_OF_MEMORY": "out_of_memory",
    "PENDING": "pending",
    "PREEMPTED": "preempted",
    "RUNNING": "running",
    "SUSPENDED": "suspended",
    "TIMEOUT": "timeout",
    "REVOKED": "cancelled",  # a federation sibling removed because another cluster runs the job
}


def cc_job_state(slurm_state: str) -> CcJobState:
    """The cc-backend state for a Slurm state word (`OUT_OF_MEMORY` -> `out_of_memory`).

    `CANCELLED by <uid>` must be split first (`schemas.slurm.values.parse_state`). States with no cc-backend
    counterpart (REQUEUED, RESIZING, ...) raise `ValueError`: they are not an end of the job, and guessing
    one would close a job cc-backend should keep open. A job has ended (a stop_job is due) exactly when its
    Slurm state is in `schemas.slurm.values.TERMINAL_STATES`.
    """
    try:
        return _SLURM_TO_CC[slurm_state]
    except KeyError:
        raise ValueError(f"Slurm state {slurm_state!r} has no cc-backend job state") from None


class Tag(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """cc-lib `schema.Tag`: attached to the job when cc-backend creates it."""

    type: str
    name: str
    scope: str = ""
    id: int = 0


class Resource(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """cc-lib `schema.Resource`: one node of the job."""

    hostname: str
    hwthreads: list[int] = []
    """OS processor ids the job may use on this node."""
    accelerators: list[str] = []
    """Accelerator ids; they must equal the collector's `type-id` for the card (e.g. `00000000:49:00.0`)."""
    configuration: str = ""


class StartJob(
    msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True, gc=False
):
    """The start_job payload (cc-lib `schema.Job`, the fields a job start can carry).

    Defaults are cc-backend's own (`shared` "none", `monitoringStatus` 1, `jobState` forced to running),
    so leaving a field at its default and omitting it from the JSON mean the same to cc-backend.
    `exclusive` is not a field: current cc-lib replaced it by `shared`, and sending it would make
    cc-backend reject the whole event as an unknown field.
    """

    job_id: int
    cluster: str
    user: str
    resources: list[Resource]
    num_nodes: int
    start_time: int
    """Epoch seconds."""
    sub_cluster: str = ""
    """Left empty, cc-backend assigns it from its cluster configuration."""
    partition: str = ""
    project: str = ""
    shared: Shared = "none"
    job_state: CcJobState = "running"
    num_hwthreads: int = 0
    num_acc: int = 0
    smt: int = 0
    walltime: int = 0
    """Requested wall time in seconds."""
    requested_memory: int = 0
    """MB (the Slurm builder puts sacct's ReqMem here: since Slurm 21.08 the job's total request)."""
    array_job_id: int = 0
    submit_time: int = 0
    """Epoch seconds."""
    monitoring_status: int = 1
    meta_data: dict[str, str] = {}
    """`jobName`, `slurmInfo`, `jobScript`."""
    tags: list[Tag] = []
    duration: int = 0
    energy: float = 0.0


class StopJob(msgspec.Struct, rename="camel", forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """The stop_job payload (cc-backend `StopJobAPIRequest`); (jobId, cluster, startTime) find the job."""

    job_id: int
    stop_time: int
    """Epoch seconds, >= startTime."""
    cluster: str = ""
    start_time: int = 0
    job_state: CcJobState | Literal[""] = ""
    """Empty means `completed` to cc-backend."""


_ENCODER: Final = msgspec.json.Encoder()


def job_event_line(payload: StartJob | StopJob, time: int, **tags: str) -> Line:
    """`job,<tags>,function=start_job|stop_job event="<JSON>" <time>` (the function follows the payload's
    type). cc-backend ignores the line's own timestamp; producers put the job's start or stop time there so
    the same event sent again is byte-identical and JetStream's duplicate window drops it."""
    function = "start_job" if isinstance(payload, StartJob) else "stop_job"
    return Line("job", {**tags, "function": function}, {"event": _ENCODER.encode(payload).decode()}, time)


def job_event_heads(**tags: str) -> tuple[str, str]:
    """The start of a start_job and of a stop_job line with `tags`, up to the opening quote of the event's
    JSON (`tag_set`: `format_line`'s own tag text); FormatError when a tag cannot be written."""
    return (
        f'job{tag_set({**tags, "function": "start_job"})} event="',
        f'job{tag_set({**tags, "function": "stop_job"})} event="',
    )


def job_event_text(payloads: Iterable[StartJob | StopJob], times: Iterable[int], **tags: str) -> str:
    """The events' lines, each ending in a newline: byte for byte `format_line(job_event_line(p, t, **tags))`
    for each payload `p` and its time `t` (parallel iterables), written faster.

    Why: building and formatting a `Line` per event was about a quarter of the OCS ingest. Here the tag text
    is made once per function by `tag_set` (`format_line`'s own), and the JSON of all events is escaped in
    one pass: msgspec writes no raw newline or carriage return in JSON (it escapes them), so of what line
    protocol escapes in a string field only `\\` and `"` can occur, and a newline can join the JSON texts and
    split them again."""
    payloads = list(payloads)
    if not payloads:
        return ""
    start_head, stop_head = job_event_heads(**tags)
    encode = _ENCODER.encode
    joined = b"\n".join([encode(p) for p in payloads]).decode()
    escaped = joined.replace("\\", "\\\\").replace('"', '\\"').split("\n")
    return "".join(
        [
            f'{start_head if isinstance(p, StartJob) else stop_head}{text}" {time}\n'
            for p, text, time in zip(payloads, escaped, times, strict=True)
        ]
    )


# --- reading ------------------------------------------------------------------------------------------------

_START_KEYS: Final = frozenset(f.encode_name for f in msgspec.structs.fields(StartJob))
_STOP_KEYS: Final = frozenset(f.encode_name for f in msgspec.structs.fields(StopJob))
_START_UNSET: Final[dict[str, Any]] = {
    "cluster": "",
    "user": "",
    "resources": [],
    "numNodes": 0,
    "startTime": 0,
}
_STOP_UNSET: Final[dict[str, Any]] = {"stopTime": 0}


def _known(payload: str | bytes, keys: frozenset[str], unset: dict[str, Any]) -> dict[str, Any]:
    raw = msgspec.json.decode(payload)
    if not isinstance(raw, dict):
        raise msgspec.ValidationError(f"Expected `object`, got `{type(raw).__name__}`")
    return {**unset, **{k: v for k, v in raw.items() if k in keys}}


def read_start_job(payload: str | bytes) -> StartJob:
    """A start_job payload from any producer: unknown keys dropped, every field but `jobId` optional (the
    required ones read as empty / 0). Raises `msgspec.DecodeError` / `ValidationError`, also for a name
    that `schemas.names` refuses (`start_job_names`): cc-backend keys its metric queries on these names.
    `metaData.jobName` is the user's free text, never a key: it is made safe (`safe_text`), not refused."""
    start = msgspec.convert(_known(payload, _START_KEYS, _START_UNSET), StartJob)
    name = start.meta_data.get("jobName", "")
    if name:
        start.meta_data["jobName"] = safe_text(name, JOB_NAME_MAX)
    unsafe = start_job_names(start)
    if unsafe is not None:
        raise msgspec.ValidationError(f"{unsafe[1]} - at `$.{unsafe[0]}`")
    return start


def start_job_names_of(payload: str | bytes) -> tuple[str, str] | None:
    """`start_job_names` of a start_job payload; None also when it cannot be read at all (that is
    `read_start_job`'s error to report, and cc-backend's to refuse)."""
    try:
        start = msgspec.convert(_known(payload, _START_KEYS, _START_UNSET), StartJob)
    except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
        return None
    return start_job_names(start)


def start_job_names(start: StartJob) -> tuple[str, str] | None:
    """`(path, reason)` of the first name of a start_job that `schemas.names` refuses: the cluster (when
    given), each `resources[].hostname` and the user; None when all are safe. `metaData.jobName` is not one
    of them: `read_start_job` makes it safe, so a start_job is never refused for its name."""
    if start.cluster:
        reason = cluster_problem(start.cluster)
        if reason is not None:
            return "cluster", reason
    for i, resource in enumerate(start.resources):
        reason = host_problem(resource.hostname)
        if reason is not None:
            return f"resources[{i}].hostname", reason
    reason = text_problem(start.user, "user", TAG_VALUE_MAX)
    if reason is not None:
        return "user", reason
    return None


def read_stop_job(payload: str | bytes) -> StopJob:
    """A stop_job payload from any producer, as `read_start_job` reads a start_job (`stopTime` may be absent)."""
    return msgspec.convert(_known(payload, _STOP_KEYS, _STOP_UNSET), StopJob)
