"""OCS / Grid Engine accounting records -> Sonar `SlurmJob` records and cc-backend job events. Pure: no I/O.

Grid Engine has no Sonar producer, so its jobs reach Sonar consumers (and cc-backend) in Sonar's Slurm shape:
the same field names, Slurm's state words, sacct's units. Each job (array task) becomes one `SlurmJob` in a
jobs envelope on `<cluster>.events.slurm` (docs/mapping.md section 6) and, once it has ended, a cc-backend
`stop_job` on `<cluster>.events.job`.

| SlurmJob field               | from the accounting record                | note                                        |
|------------------------------|-------------------------------------------|---------------------------------------------|
| `job_id`                     | `job_number`                              | also for array tasks (see below)            |
| `array_job_id`               | `job_number` for an array task            | Grid Engine tasks share the job number      |
| `array_task_id`              | `task_number` for an array task (> 0)     | `array_task`: see "Array tasks" below       |
| `job_step`                   | "" (always)                               | PE tasks are merged into their job          |
| `job_name`                   | `job_name`                                |                                             |
| `job_state`                  | `schemas.ocs.job_state(record)`           | RUNNING while only PE-task or intermediate  |
|                              |                                           | records of the job have been seen           |
| `user_name`                  | `owner`                                   |                                             |
| `account`                    | `account` (`qsub -A`, default `sge`)      | `project` has no SlurmJob field             |
| `partition`                  | `qname` (cluster queue)                   |                                             |
| `reservation`                | `arid` as text when non-zero              | advance reservation id                      |
| `nodes`                      | `hosts` compressed to node ranges         | `schemas.noderange.compress`; names it      |
|                              |                                           | cannot compress are listed one by one; each |
|                              |                                           | host in the site's `hostname_form` first    |
| `submit_time`                | `submission_time`, RFC 3339 UTC           | else start, else end, else the poll time    |
| `start_time`                 | `start_time` (omitted when 0)             |                                             |
| `end_time`                   | `end_time` once the job has ended         |                                             |
| `time_limit`                 | `h_rt`/`s_rt` in `category`, seconds + 2  | real Sonar's ExtendedUint seconds; 0 = none |
| `exit_code`                  | `exit_status` once ended                  | 128 + n for signal n, as Grid Engine writes |
| `requested_cpus`             | `slots`                                   |                                             |
| `allocated_resources`        | `cpu=<slots>,node=<hosts>`                | sacct AllocTRES syntax                      |
| `sacct.ElapsedRaw`           | `ru_wallclock` (s, rounded)               | end - start for a merged job                |
| `sacct.UserCPU`/`SystemCPU`  | `ru_utime` / `ru_stime` (s, rounded)      | summed over PE tasks                        |
| `sacct.AveCPU`               | `cpu` (s, rounded)                        | the job's total: Grid Engine has no         |
|                              |                                           | per-task average; equal for serial jobs     |
| `sacct.MaxRSS`               | `maxrss` bytes -> KiB (rounded up);       | max over PE tasks                           |
|                              | `ru_maxrss` (KiB) when `maxrss` is absent |                                             |
| `sacct.MaxVMSize`            | `maxvmem` bytes -> KiB (rounded up)       | max over PE tasks                           |
| `sacct.ReqCPUS`              | `slots`                                   |                                             |
| `sacct.AllocTRES`            | as `allocated_resources`                  |                                             |
| not mapped                   | `priority` (a nice value, may be < 0),    | no Slurm counterpart                        |
|                              | group, department, project, mem, io, iow  |                                             |

cc-backend `stop_job` (`schemas.ccbackend.StopJob`): `jobId` = job_number, `cluster`, `startTime` =
start_time, `stopTime` = max(start_time, end_time), `jobState` = the state above in lower case. Sent once per
job, when its final record arrives; not sent for a job that never started (cc-backend never heard of it)
nor for REQUEUED (failed 24/25: the job runs again). By default (`start_jobs=True`) a `start_job` goes right
before it, in the same message: the accounting file only has finished jobs, and cc-backend only stops jobs it
saw start (`finding job failed: sql: no rows in result set` otherwise), so for a ClusterCockpit site this
producer is the authority for Grid Engine jobs. cc-backend handles the lines of a message in order, so the
start is stored before the stop is looked up. The job appears in cc-backend only once it has ended (as a
finished job): the accounting file has nothing earlier. Fields: user, project = account, partition = qname,
resources/numNodes from the hosts (hostnames only: accounting names no CPUs or cards), numHwthreads = slots,
walltime = h_rt, arrayJobId, submitTime, metaData.jobName. `start_jobs=False` only where something else
announces these jobs to cc-backend with the same start time.

Both events carry `cluster=<cluster>,origin=sonar`: they are derived from the jobs envelope published
beside them, and `origin=sonar` is the tag the bus -> Sonar direction (`JobsAssembler`) skips for exactly
that reason, so a job is not assembled twice.

**Array tasks.** Grid Engine array tasks share one job number; Slurm gives each task its own job id. The
job number is kept as `job_id` (inventing ids would break joins with `qacct`), so consumers must key array
tasks by (`job_id`, `array_task_id`). Early OCS 9.0 releases wrote `task_number` 1 for jobs that are not
arrays (the corpus record of `qsub -b y echo` has it; current OCS and every colon-format writer put 0), so a
JSONL record with task 1 whose `submit_cmd_line` is known and has no `-t` option is taken as not an array
(`array_task`). The cost: task 1 of an array submitted with `#$ -t` inside the script loses its array fields
(it stays unique, as (`job_id`, 0)).

**PE tasks and updates** (`updates.JobMerger`). A tightly integrated parallel job without `accounting_summary`
writes one line per PE task and one for the master task, usually the tasks first and often in different
polls. Records are merged by `schemas.ocs.merge_job` within a poll *and* with the parts of the same job
seen in earlier polls (kept for jobs that may still get records: PE jobs, jobs not ended, requeued jobs;
bounded, least recently updated dropped first). So each poll that touches a job emits the job's
*cumulative* record: consumers that let a later record override an earlier one field by field end up with
the whole job. Until the master's final record arrives the job is RUNNING without `end_time`. Intermediate
records (exit_status -1, written as 4294967295, while the job runs) count as not ended. After a restart the
earlier parts are no longer known: a job whose records straddle the restart is emitted merged from the parts
read since (the accounting file itself still has every line).
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Iterable
from typing import Final, NamedTuple

import msgspec

from hpcbus.schemas.ccbackend import (
    Resource,
    StartJob,
    StopJob,
    cc_job_state,
    job_event_heads,
    job_event_line,
)
from hpcbus.schemas.ccbackend import job_event_text as _event_text
from hpcbus.schemas.hostnames import HostnameForm, host_names
from hpcbus.schemas.lineprotocol import FormatError, Line
from hpcbus.schemas.lineprotocol.format import tag_set
from hpcbus.schemas.native import extension
from hpcbus.schemas.noderange import compress
from hpcbus.schemas.ocs import AccountingRecord, job_state, requested_runtime
from hpcbus.schemas.ocs.updates import JobUpdate
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.values import TERMINAL_STATES
from hpcbus.schemas.sonar.types import (
    JobsAttributes,
    JobsData,
    JobsEnvelope,
    KVPair,
    Metadata,
    SacctData,
    SlurmJob,
)
from hpcbus.schemas.translate import jobs_to_lines
from hpcbus.schemas.translate.common import PRODUCER, VERSION
from hpcbus.schemas.translate.events import placed, sonar_event_parts

__all__ = [
    "ORIGIN",
    "MappedJobs",
    "array_task",
    "envelope_lines",
    "envelope_text",
    "escape_field_pure",
    "event_time",
    "job_event_lines",
    "job_event_text",
    "job_events",
    "jobs_envelope",
    "map_job_pure",
    "map_jobs",
    "map_jobs_pure",
    "problem_line",
    "slurm_job",
    "stop_job",
]

ORIGIN: Final = "sonar"
"""`origin` tag of the derived cc-backend events (see the module docstring)."""
SOURCE_ATTR: Final = KVPair(key="translated-from", value="ocs-accounting")
"""`meta.attrs` entry telling Sonar consumers the envelope was built from Grid Engine accounting."""
_read = extension("hpcbus.schemas.ocs._read")
"""The compiled mapping (`_read.c`), None on the pure path (no compiler at install, or `HPCBUS_PURE=1`)."""
_UINT_MAX: Final = 2**63 - 1
_LAST_TIMESTAMP: Final = 253402300799  # 9999-12-31T23:59:59Z: RFC 3339 has four year digits


# --- Sonar ------------------------------------------------------------------------------------------------


def timestamp(seconds: int) -> str:
    """Sonar's timestamp form in UTC (`+00:00`; Sonar never writes `Z`): what `time.strftime` writes for
    `%Y-%m-%dT%H:%M:%S+00:00`, its date part computed once per day (`_date`) and the clock from tables
    (a third of strftime's time: a job has three timestamps)."""
    if not 0 <= seconds <= _LAST_TIMESTAMP:
        raise ValueError(f"time {seconds} is outside what an RFC 3339 timestamp can express")
    days, rest = divmod(seconds, 86_400)
    minutes, secs = divmod(rest, 60)
    return _date(days) + _HOUR_MINUTE[minutes] + _SECOND[secs]


@functools.lru_cache(maxsize=1024)
def _date(days: int) -> str:
    return time.strftime("%Y-%m-%dT", time.gmtime(days * 86_400))


_HOUR_MINUTE: Final = tuple(f"{h:02d}:{m:02d}:" for h in range(24) for m in range(60))
_SECOND: Final = tuple(f"{s:02d}+00:00" for s in range(60))


def _seconds(value: float) -> int:
    """Whole seconds, rounded to the nearest (what sacct-derived Sonar fields hold)."""
    if value > 0:  # not NaN
        # compared as floats first: an infinite sum of merged usage is capped too (int() of it would raise)
        return int(value + 0.5) if value < _UINT_MAX else _UINT_MAX
    return 0


def _kib(size_bytes: int | float) -> int:
    """Bytes -> KiB rounded up (Sonar's rule for sacct sizes)."""
    if size_bytes > 0:
        kib = -(-int(size_bytes) // 1024)
        return kib if kib < _UINT_MAX else _UINT_MAX
    return 0


def array_task(record: AccountingRecord) -> int:
    """The array task index of `record`, 0 when it is not an array task (see "Array tasks" above)."""
    task = record.task_number
    if task <= 0:
        return 0
    cmd = record.submit_cmd_line
    if task == 1 and record.source_format == "jsonl" and cmd and "-t" not in cmd.split():
        return 0
    return task


_PLAIN_HOST: Final = re.compile(r"[A-Za-z0-9._-]+")


def _nodes(hosts: tuple[str, ...]) -> list[str]:
    """Node ranges of `hosts`; one plain name is its own range (the common case, and compress's slow path)."""
    if len(hosts) == 1 and _PLAIN_HOST.fullmatch(hosts[0]):
        return [hosts[0]]
    return list(_compressed(hosts))  # a copy: the cached list must not be shared


@functools.lru_cache(maxsize=1024)
def _compressed(hosts: tuple[str, ...]) -> list[str]:
    if not hosts:
        return []
    try:
        return compress(hosts)
    except ValueError:
        return sorted(set(hosts))


_NO_SACCT: Final = SacctData()
"""sacct values of a record without any: left out of the SlurmJob."""
_runtime: Final = functools.lru_cache(maxsize=1024)(requested_runtime)
"""`requested_runtime` by category: a cluster has few distinct categories, and the regex is the cost."""


def job_hosts(r: AccountingRecord, form: HostnameForm = "as-is", domain: str = "") -> tuple[str, ...]:
    """The hosts a job ran on (`hosts`, else the master's `hostname`), each in the site's host-name form
    (`schemas.hostnames`, docs/mapping.md section 3), so the record, cc-backend's `resources` and the node
    agents' metrics name a node alike."""
    return host_names(r.hosts or ((r.hostname,) if r.hostname else ()), form, domain)


def slurm_job(update: JobUpdate, *, now: int, form: HostnameForm = "as-is", domain: str = "") -> SlurmJob:
    """The Sonar record of a job (table in the module docstring), its hosts in `form` (`job_hosts`). Raises
    `ValueError` for a time that no timestamp can hold (a corrupt record)."""
    r = update.record
    ended = update.ended
    hosts = job_hosts(r, form, domain)
    slots = max(0, r.slots)
    tres = f"cpu={slots},node={len(hosts)}" if slots and hosts else ""
    limit = _runtime(r.category)
    task = array_task(r)
    sacct = SacctData(
        elapsed_raw=_seconds(r.ru_wallclock),
        user_cpu=_seconds(r.ru_utime),
        system_cpu=_seconds(r.ru_stime),
        ave_cpu=_seconds(r.cpu),
        max_rss=_kib(r.maxrss) if r.maxrss is not None else max(0, r.ru_maxrss),
        max_vm_size=_kib(r.maxvmem),
        req_cpus=slots,
        alloc_tres=tres,
    )
    return SlurmJob(
        job_id=r.job_number,
        job_name=r.job_name,
        job_state=job_state(r) if ended else "RUNNING",
        array_job_id=r.job_number if task else 0,
        array_task_id=task,
        user_name=r.owner,
        account=r.account,
        submit_time=timestamp(r.submission_time or r.start_time or r.end_time or now),
        time_limit=limit + 2 if limit is not None else 0,
        partition=r.qname,
        reservation=str(r.arid) if r.arid else "",
        nodes=_nodes(hosts),
        allocated_resources=tres,
        requested_cpus=slots,
        start_time=timestamp(r.start_time) if r.start_time else "",
        end_time=timestamp(r.end_time) if ended and r.end_time else "",
        exit_code=r.exit_status if ended and 0 < r.exit_status < 2**32 - 1 else 0,
        sacct=sacct if sacct != _NO_SACCT else None,
    )


def jobs_envelope(jobs: list[SlurmJob], cluster: str, now: int) -> JobsEnvelope:
    """A Sonar jobs envelope (`data.type` "job", as real Sonar writes it) made by hpcbus."""
    meta = Metadata(producer=PRODUCER, version=VERSION, attrs=[SOURCE_ATTR])
    attributes = JobsAttributes(time=timestamp(now), cluster=cluster, slurm_jobs=jobs)
    return JobsEnvelope(meta=meta, data=JobsData(attributes=attributes))


def envelope_lines(envelope: JobsEnvelope, cluster: str) -> list[Line]:
    """`slurm,cluster=..,function=sonar event="<envelope>"` (in parts when large), by the translator's rule."""
    return jobs_to_lines(envelope, cluster=cluster, cc_events=False)


def envelope_text(envelope: JobsEnvelope, cluster: str, *, pure: bool = False) -> bytes:
    """The line protocol of `envelope_lines(envelope, cluster)`, each line ending in a newline: byte for byte
    what `format_line` writes for them (then encoded), without a `Line` or a `str` of the envelope's JSON.

    Why: the envelope is most of what the OCS producer publishes (about 500 bytes a job); its JSON is escaped
    as a string field straight from the encoder's bytes (compiled where the extension is built, `_read.c`'s
    `escape_field`; `pure`: by `escape_field_pure`, its reference), not decoded, escaped by four `str.replace`
    passes, formatted, joined and encoded again."""
    assert envelope.data is not None  # `jobs_envelope` makes one with data
    a = envelope.data.attributes
    tags, ts = placed(a.time, a.cluster, cluster, 0)
    escape = _read.escape_field if _read is not None and not pure else escape_field_pure
    end = f'" {ts}\n'.encode()
    out: list[bytes] = []
    for part_tags, payload in sonar_event_parts(envelope, tags):
        out += (f'slurm{tag_set(part_tags)} event="'.encode(), escape(payload), end)
    return b"".join(out)


def escape_field_pure(payload: bytes) -> bytes:
    """UTF-8 `payload` escaped as line protocol writes a string field's value (`format.py`'s `_string_field`,
    without the quotes): backslash and double quote with a backslash, CR and LF as `\\r`, `\\n`. Every byte
    it changes is ASCII, which no byte of a multi-byte UTF-8 character is, so this equals escaping the text."""
    payload = payload.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    if b"\r" in payload or b"\n" in payload:
        payload = payload.replace(b"\r", b"\\r").replace(b"\n", b"\\n")
    return payload


# --- cc-backend -------------------------------------------------------------------------------------------


def stop_job(update: JobUpdate, cluster: str) -> StopJob | None:
    """cc-backend's stop_job for an ended job, or None (not ended, never started, or requeued)."""
    r = update.record
    if not update.ended or r.start_time <= 0:
        return None
    state = job_state(r)
    if state not in TERMINAL_STATES:  # REQUEUED: not the end of the job
        return None
    return StopJob(
        job_id=r.job_number,
        cluster=cluster,
        start_time=r.start_time,
        stop_time=max(r.start_time, r.end_time),
        job_state=cc_job_state(state),
    )


def _start_job(r: AccountingRecord, cluster: str, form: HostnameForm, domain: str) -> StartJob | None:
    """cc-backend's start_job for the record of a job that has a stop_job (sent just before it), or None
    when cc-backend would refuse it (no user, no host)."""
    hosts = job_hosts(r, form, domain)
    if not r.owner or not hosts:
        return None
    limit = _runtime(r.category)
    return StartJob(
        job_id=r.job_number,
        cluster=cluster,
        user=r.owner,
        resources=[Resource(hostname=h) for h in hosts],
        num_nodes=len(hosts),
        start_time=r.start_time,
        partition=r.qname,
        project=r.account,
        num_hwthreads=max(0, r.slots),
        walltime=limit or 0,
        array_job_id=r.job_number if array_task(r) else 0,
        submit_time=r.submission_time,
        meta_data={"jobName": r.job_name} if r.job_name else {},
    )


def job_events(
    update: JobUpdate,
    cluster: str,
    *,
    start_jobs: bool = True,
    form: HostnameForm = "as-is",
    domain: str = "",
) -> list[StartJob | StopJob]:
    """The stop_job (and the start_job before it, its `resources` in `form`) when the job's final record is
    new, in sending order."""
    if not update.final_now:
        return []
    stop = stop_job(update, cluster)
    if stop is None:
        return []
    start = _start_job(update.record, cluster, form, domain) if start_jobs else None
    return [stop] if start is None else [start, stop]


def event_time(payload: StartJob | StopJob) -> int:
    """The time of a job event's line: the job's start for a start_job, its stop for a stop_job."""
    return payload.start_time if isinstance(payload, StartJob) else payload.stop_time


def job_event_text(payloads: Iterable[StartJob | StopJob], cluster: str) -> str:
    """The line protocol text of the events' `job_event_line`s (at `event_time`, tagged as `job_event_lines`
    tags them), each line ending in a newline: `schemas.ccbackend.job_event_text`, byte for byte what
    `format_line` writes for them, without a `Line` per event."""
    payloads = list(payloads)
    return _event_text(payloads, map(event_time, payloads), cluster=cluster, origin=ORIGIN)


def job_event_lines(payloads: Iterable[StartJob | StopJob], cluster: str) -> list[Line]:
    """The `job,function=start_job|stop_job` lines of the events (`job_events`), at `event_time`: what
    `job_event_text` writes, as `Line`s (the general way, which the benchmark's reference path takes)."""
    return [job_event_line(p, event_time(p), cluster=cluster, origin=ORIGIN) for p in payloads]


# --- problems ---------------------------------------------------------------------------------------------


def problem_line(problem: Problem, *, cluster: str, hostname: str, now: int) -> Line:
    """A CC log line (`hpcbus,...,loglevel=error log="PATH:LINE: ..."`) for `<cluster>.log.hpcbus`."""
    tags = {
        "cluster": cluster,
        "hostname": hostname,
        "type": "node",
        "type-id": "0",
        "loglevel": "error" if problem.severity == "error" else "warn",
        "source": "ocs",
    }
    return Line("hpcbus", tags, {"log": str(problem)}, now)


# --- a chunk's updates, mapped at once ------------------------------------------------------------------------


class MappedJobs(NamedTuple):
    """What a chunk's job updates become (`map_jobs`)."""

    jobs: list[SlurmJob]
    """The Sonar record of each update that has one, in order."""
    event_text: str
    """The line protocol text of their cc-backend events (`job_event_text`), in order."""
    events: int
    """How many event lines that text holds."""
    failures: list[tuple[int, ValueError]]
    """(index in the updates, why) of each update `slurm_job` refused (a time no timestamp can hold)."""


def map_job_pure(
    update: JobUpdate, cluster: str, *, now: int, start_jobs: bool, form: HostnameForm, domain: str
) -> tuple[SlurmJob, str, int]:
    """One update's Sonar record, its event text and how many events that is (`slurm_job`, `job_events`,
    `job_event_text`); raises `ValueError` as `slurm_job` does."""
    job = slurm_job(update, now=now, form=form, domain=domain)
    events = job_events(update, cluster, start_jobs=start_jobs, form=form, domain=domain)
    return job, job_event_text(events, cluster), len(events)


def map_jobs_pure(
    updates: list[JobUpdate],
    cluster: str,
    *,
    now: int,
    start_jobs: bool = True,
    form: HostnameForm = "as-is",
    domain: str = "",
) -> MappedJobs:
    """`map_job_pure` of each update, collected: the reference of the compiled `map_jobs`."""
    jobs: list[SlurmJob] = []
    texts: list[str] = []
    count = 0
    failures: list[tuple[int, ValueError]] = []
    for i, update in enumerate(updates):
        try:
            job, text, n = map_job_pure(
                update, cluster, now=now, start_jobs=start_jobs, form=form, domain=domain
            )
        except ValueError as exc:
            failures.append((i, exc))
            continue
        jobs.append(job)
        texts.append(text)
        count += n
    return MappedJobs(jobs, "".join(texts), count, failures)


_HELPERS: Final = (
    SlurmJob,
    SacctData,
    _runtime,
    job_state,
    _nodes,
    array_task,
    cc_job_state,
    TERMINAL_STATES,
    msgspec.structs.astuple,
)
"""What the compiled mapping leaves to Python, in the order `_read.c` takes them (its `H_*`; `map_jobs` adds the
last, the hosts helper)."""


@functools.lru_cache(maxsize=64)
def _event_heads(cluster: str) -> tuple[str, str] | None:
    """The start of a start_job and of a stop_job line, as `ccbackend.job_event_text` writes them; None when
    the cluster cannot be a tag (the pure path names that)."""
    try:
        return job_event_heads(cluster=cluster, origin=ORIGIN)
    except FormatError:
        return None


def map_jobs(
    updates: list[JobUpdate],
    cluster: str,
    *,
    now: int,
    start_jobs: bool = True,
    form: HostnameForm = "as-is",
    domain: str = "",
) -> MappedJobs:
    """The Sonar records and cc-backend event lines of a chunk's job updates: `map_jobs_pure`, compiled where
    the extension is built. The C code maps each usual update itself
    (plain ASCII names, numbers of the usual types) and hands each other one to `map_job_pure`: the same
    output either way (tests/test_compiled_ocs.py)."""
    if _read is None or (heads := _event_heads(cluster)) is None:
        return map_jobs_pure(updates, cluster, now=now, start_jobs=start_jobs, form=form, domain=domain)
    pure = functools.partial(
        map_job_pure, cluster=cluster, now=now, start_jobs=start_jobs, form=form, domain=domain
    )
    # the hosts of a job in another form than as-is are named by `job_hosts` (the C code has the as-is rule)
    hosts = None if form == "as-is" else functools.partial(job_hosts, form=form, domain=domain)
    return MappedJobs(*_read.map_jobs((*_HELPERS, hosts), pure, updates, cluster, heads, now, start_jobs))
