"""One line of text per message for `hpcbus tail`: line protocol filtered by host, measurement or job and
shown as it is (one line) or summarised (many), Sonar envelopes summarised, anything else shown escaped.
Pure: bytes in, text out."""

from __future__ import annotations

import time

import msgspec

from hpcbus.schemas.lineprotocol import Line, format_line, parse_payload

MAX_TEXT = 400
MAX_NAMES = 5


class Filters(msgspec.Struct, kw_only=True, frozen=True):
    hosts: frozenset[str] = frozenset()
    measurements: frozenset[str] = frozenset()
    jobs: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return bool(self.hosts or self.measurements or self.jobs)


JOB_TAGS = ("job", "jobid", "jobId", "job_id")


def line_matches(line: Line, f: Filters) -> bool:
    if f.hosts and line.tags.get("hostname", line.tags.get("host", "")) not in f.hosts:
        return False
    if f.measurements and line.measurement not in f.measurements:
        return False
    if f.jobs:
        tagged = {line.tags[t] for t in JOB_TAGS if t in line.tags}
        event = line.fields.get("event")
        compact = event.replace(" ", "") if isinstance(event, str) else ""  # once a line, not once a job
        return any(job_matches(line, job, tagged, compact) for job in f.jobs)
    return True


def job_matches(line: Line, job: str, tagged: set[str], compact: str) -> bool:
    """Is `line` about `job`: a job id, or `<job>@<epoch>`, the key `hpcbus report` and the summaries use for
    a process-group job (its `job` and `epoch` tags, or `"jobId"` and `"epoch"` in its event's JSON,
    `compact`: without white space)."""
    number, _, epoch = job.partition("@")
    if number in tagged:
        return not epoch or line.tags.get("epoch") == epoch
    return f'"jobId":{number}' in compact and (not epoch or f'"epoch":{epoch}' in compact)


def names(values: list[str]) -> str:
    uniq = list(dict.fromkeys(values))
    more = f" (+{len(uniq) - MAX_NAMES})" if len(uniq) > MAX_NAMES else ""
    return ",".join(uniq[:MAX_NAMES]) + more


def cut(text: str, limit: int = MAX_TEXT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def sonar_summary(doc: dict[str, object], f: Filters) -> str | None:
    """`sonar sample node=c1-10 time=... jobs=4 processes=31 gpus=4`; None when the filters rule it out."""
    data = doc.get("data")
    if not isinstance(data, dict):
        errors = doc.get("errors")
        if isinstance(errors, list):
            return f"sonar errors: {len(errors)}: " + cut(
                "; ".join(str(e.get("detail", e)) if isinstance(e, dict) else str(e) for e in errors), 200
            )
        return None
    kind = str(data.get("type", "?"))
    attrs = data.get("attributes")
    attrs = attrs if isinstance(attrs, dict) else {}
    node = str(attrs.get("node", ""))
    if f.hosts and node not in f.hosts:
        return None
    parts = [f"sonar {kind}"]
    if node:
        parts.append(f"node={node}")
    if attrs.get("time"):
        parts.append(f"time={attrs['time']}")
    jobs = attrs.get("jobs") if isinstance(attrs.get("jobs"), list) else attrs.get("slurm_jobs")
    if isinstance(jobs, list):
        ids = {str(j.get("job", j.get("job_id", ""))) for j in jobs if isinstance(j, dict)}
        ids |= {f"{j.get('job')}@{j['epoch']}" for j in jobs if isinstance(j, dict) and j.get("epoch")}
        if f.jobs and not ids & f.jobs:
            return None
        parts.append(f"jobs={len(jobs)}")
        procs = sum(len(j.get("processes") or []) for j in jobs if isinstance(j, dict))
        if procs:
            parts.append(f"processes={procs}")
    elif f.jobs:
        return None
    system = attrs.get("system")
    gpus = system.get("gpus") if isinstance(system, dict) else attrs.get("cards")
    if isinstance(gpus, list):
        parts.append(f"gpus={len(gpus)}")
    if isinstance(attrs.get("nodes"), list):
        parts.append(f"nodes={len(attrs['nodes'])}")
    return " ".join(parts)


def skeleton_summary(line: Line) -> str | None:
    """A sample's skeleton event (kilobytes of JSON) as `sample skeleton of <host>: 388 lines, sonar ...`."""
    event = line.fields.get("event")
    if line.tags.get("function") != "skeleton" or not isinstance(event, str):
        return None
    try:
        doc = msgspec.json.decode(event)
    except msgspec.DecodeError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("skeleton"), dict):
        return None
    inner = sonar_summary(doc["skeleton"], Filters()) or "?"
    return f"{line.measurement} skeleton of {line.tags.get('hostname', '?')}: {doc.get('lines', '?')} lines, {inner}"


def describe(subject: str, payload: bytes, f: Filters, *, all_lines: bool = False) -> list[str]:
    """What `tail` prints for one message: [] when the filters rule it out. One entry per message, or one
    per matching line with `all_lines`."""
    head = payload.lstrip()[:1]
    if head in (b"{", b"["):
        try:
            doc = msgspec.json.decode(payload)
        except msgspec.DecodeError:
            doc = None
        if isinstance(doc, dict) and ("meta" in doc or "data" in doc):
            summary = sonar_summary(doc, f)
            return [f"{subject}: {summary}"] if summary else []
        if f:
            return []
        return [f"{subject}: {cut(payload.decode(errors='replace'))}"]
    parsed = parse_payload(payload, now=int(time.time()))
    if not parsed.lines:
        if f:
            return []
        text = payload.decode(errors="replace").replace("\n", "\\n")
        return [f"{subject}: {cut(text)}"]
    lines = [line for line in parsed.lines if line_matches(line, f)]
    if not lines:
        return []
    if all_lines:
        return [f"{subject}: {format_line(line)}" for line in lines]
    if len(lines) == 1:
        skeleton = skeleton_summary(lines[0])
        return [f"{subject}: {skeleton or cut(format_line(lines[0]), 2000)}"]
    hosts = [line.tags.get("hostname", line.tags.get("host", "")) for line in lines]
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(max(line.time for line in lines)))
    return [
        f"{subject}: {len(lines)} lines, host {names([h for h in hosts if h]) or '-'}, time {when}, "
        f"measurements {names([line.measurement for line in lines])}"
    ]
