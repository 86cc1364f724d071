"""The NATS subject tree. ClusterCockpit's: `<cluster>.metrics`, `.events.<class>`, `.log.<component>`,
`.control.get|put`; hpcbus adds `<cluster>.sonar.<sample|sysinfo|job|cluster>` for Sonar envelopes.

Real cluster names contain dots (`fox.educloud.no`), so subjects are read from the right: the category is
the last token (`metrics`) or the second-to-last (`events`, `log`, `control`, `sonar`).

Every subject hpcbus publishes or subscribes is built here, wildcards and the dead-letter subjects
(`<cluster>.deadletter.<category>`, hpcbus' own) included, so the tree is written down once.

The subject prefix (`--subject-prefix`, `[bus] subject_prefix`): ClusterCockpit as deployed today puts its
tree under `cc.` (`cc.<cluster>.metrics`), the original specification has none. The prefix belongs to the
tree, not to the cluster: every builder takes it as `prefix=` and puts it in front, `parse(subject, prefix)`
takes it off again, so `cc.fox.educloud.no.metrics` with prefix `cc` is cluster `fox.educloud.no`. Tags
(`cluster=`), Sonar's `meta.cluster` and the stream names stay the cluster's own. A prefix may be dotted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import msgspec

CATEGORIES_WITH_DETAIL = frozenset({"events", "log", "control", "sonar"})
SONAR_KINDS = frozenset({"sample", "sysinfo", "job", "cluster"})
CONTROL_METHODS = frozenset({"get", "put"})
DEADLETTER: Final = "deadletter"

# A token may not be empty nor hold NATS wildcards or white space.
_TOKEN = re.compile(r"^[^.\s*>]+$")


class Subject(msgspec.Struct, frozen=True):
    cluster: str
    category: str
    """`metrics`, `telemetry`, `events`, `log`, `control` or `sonar`."""
    detail: str = ""
    """Event class, log component, control method or Sonar envelope kind; "" for metrics."""
    prefix: str = ""
    """The subject prefix the tree sits under ("" = none, `cc` = ClusterCockpit's tree of today)."""

    def __str__(self) -> str:
        head = f"{self.prefix}.{self.cluster}" if self.prefix else self.cluster
        return f"{head}.{self.category}" + (f".{self.detail}" if self.detail else "")


class SubjectError(ValueError):
    pass


def _cluster(cluster: str) -> str:
    if not cluster or not all(_TOKEN.match(t) for t in cluster.split(".")):
        raise SubjectError(
            f"cluster name {cluster!r} is not a valid subject prefix (dotted, no spaces or wildcards)"
        )
    return cluster


def check_prefix(prefix: str) -> str:
    """`prefix` when it can stand in front of the tree ("" or dotted tokens), else `SubjectError`."""
    if prefix and not all(_TOKEN.match(t) for t in prefix.split(".")):
        raise SubjectError(
            f'subject prefix {prefix!r} is not valid (dotted tokens, no spaces or wildcards; "" for none)'
        )
    return prefix


def check_subject(subject: str, what: str = "subject") -> str:
    """A concrete subject to publish to (cc-backend's `cc.job.event`): dotted tokens, no wildcards."""
    if not subject or not all(_TOKEN.match(t) for t in subject.split(".")):
        raise SubjectError(
            f"{what} {subject!r} is not a valid subject (dotted tokens, no spaces or wildcards)"
        )
    return subject


def _root(cluster: str, prefix: str) -> str:
    """`<prefix>.<cluster>`, or the cluster alone without a prefix: where a cluster's tree starts."""
    _cluster(cluster)
    return f"{check_prefix(prefix)}.{cluster}" if prefix else cluster


def _token(what: str, value: str) -> str:
    if not _TOKEN.match(value):
        raise SubjectError(f"{what} {value!r} is not a valid subject token")
    return value


def metrics(cluster: str, *, prefix: str = "") -> str:
    return f"{_root(cluster, prefix)}.metrics"


def events(cluster: str, cls: str, *, prefix: str = "") -> str:
    return f"{_root(cluster, prefix)}.events.{_token('event class', cls)}"


JOBSUMMARY: Final = "jobsummary"


def jobsummary(cluster: str, *, prefix: str = "") -> str:
    """`<cluster>.events.jobsummary`: one summary per finished job (`hpcbus consume jobs`, docs/jobs.md)."""
    return events(cluster, JOBSUMMARY, prefix=prefix)


def log(cluster: str, component: str, *, prefix: str = "") -> str:
    return f"{_root(cluster, prefix)}.log.{_token('log component', component)}"


def control(cluster: str, method: str, *, prefix: str = "") -> str:
    method = method.lower()
    if method not in CONTROL_METHODS:
        raise SubjectError(f"control method {method!r} must be get or put")
    return f"{_root(cluster, prefix)}.control.{method}"


def sonar(cluster: str, kind: str, *, prefix: str = "") -> str:
    if kind == "jobs":
        kind = "job"  # real Sonar's topic name; the spec text says jobs
    if kind not in SONAR_KINDS:
        raise SubjectError(f"sonar kind {kind!r} must be one of {', '.join(sorted(SONAR_KINDS))}")
    return f"{_root(cluster, prefix)}.sonar.{kind}"


TELEMETRY: Final = "telemetry"
"""The workers' and the gateway's own `hpcbus_*` counters: a subject of their own, so that a broker can let
them publish their counters without letting them publish measurements on `<cluster>.metrics` (docs/security.md),
and so that ClusterCockpit's subscribers of `<cluster>.metrics` see only node metrics."""


def telemetry(cluster: str, *, prefix: str = "") -> str:
    """`<cluster>.telemetry`: `hpcbus_*` metric lines of hpcbus' own processes (the node producer's travel in
    its sample on `<cluster>.metrics`)."""
    return f"{_root(cluster, prefix)}.{TELEMETRY}"


def wildcard(cluster: str, category: str, *, prefix: str = "") -> str:
    """Subscription for a whole category of one cluster: `fox.metrics`, `fox.events.>`, ..."""
    if category == "metrics":
        return metrics(cluster, prefix=prefix)
    if category == TELEMETRY:
        return telemetry(cluster, prefix=prefix)
    if category not in CATEGORIES_WITH_DETAIL:
        raise SubjectError(f"unknown category {category!r}")
    return f"{_root(cluster, prefix)}.{category}.>"


def wildcards(cluster: str, *categories: str, prefix: str = "") -> list[str]:
    """The subscriptions for several categories: `wildcards("fox", "metrics", "events")` ->
    `["fox.metrics", "fox.events.>"]` (the InfluxDB writer reads metrics, events and log; the Sonar
    translator metrics and events one way, sonar the other)."""
    return [wildcard(cluster, category, prefix=prefix) for category in categories]


STORED: Final = ("metrics", TELEMETRY, "events", "log", "sonar")
"""The categories JetStream keeps (the telemetry stream); control is request/reply and never stored."""


def stored(cluster: str, *, prefix: str = "") -> list[str]:
    """The telemetry stream's subjects: `fox.metrics`, `fox.telemetry`, `fox.events.>`, `fox.log.>`,
    `fox.sonar.>`."""
    return wildcards(cluster, *STORED, prefix=prefix)


def deadletter(cluster: str, category: str, *, prefix: str = "") -> str:
    """Where a worker puts a message it rejected: `<cluster>.deadletter.<category of its subject>`
    (`unknown` when the subject was not ours). hpcbus' own, outside the telemetry stream (`stored`)."""
    return f"{_root(cluster, prefix)}.{DEADLETTER}.{_token('dead-letter category', category)}"


def deadletter_wildcard(cluster: str, *, prefix: str = "") -> str:
    """The dead-letter stream's subjects: `<cluster>.deadletter.>`."""
    return f"{_root(cluster, prefix)}.{DEADLETTER}.>"


def parse(subject: str, prefix: str = "") -> Subject:
    """Split a concrete subject into cluster, category and detail, or raise SubjectError saying why.
    With a `prefix` the subject must start with it, and the cluster is what follows it."""
    if prefix:
        check_prefix(prefix)
        if not subject.startswith(prefix + "."):
            raise SubjectError(f"{subject}: not under the subject prefix {prefix!r}")
        rest = subject[len(prefix) + 1 :]
    else:
        rest = subject
    tokens = rest.split(".")
    if len(tokens) >= 2 and tokens[-1] in ("metrics", TELEMETRY):
        return Subject(_cluster(".".join(tokens[:-1])), tokens[-1], prefix=prefix)
    if len(tokens) >= 3 and tokens[-2] in CATEGORIES_WITH_DETAIL:
        category, detail = tokens[-2], tokens[-1]
        _token(category, detail)
        if category == "control" and detail not in CONTROL_METHODS:
            raise SubjectError(f"{subject}: control subjects end in .get or .put")
        if category == "sonar" and detail not in SONAR_KINDS:
            raise SubjectError(f"{subject}: sonar subjects end in .sample, .sysinfo, .job or .cluster")
        return Subject(_cluster(".".join(tokens[:-2])), category, detail, prefix)
    head = f"{prefix}.<cluster>" if prefix else "<cluster>"
    raise SubjectError(
        f"{subject}: not a hpcbus subject ({head}.metrics, .telemetry, .events.<class>, .log.<component>, "
        ".control.get|put, .sonar.<kind>)"
    )


# --- per-node ingest subjects (forgery protection) -----------------------------------------------------------
#
# A compute node's credentials allow publishing on `<root>.ingest.<host>.>` only (`hpcbus deploy nats-auth`),
# so the broker itself says which node sent a message. `hpcbus consume ingest` checks that every line (or
# Sonar envelope) in it names that node and forwards it to the subject it stands for:
# `fox.ingest.n001.metrics` -> `fox.metrics`, `fox.ingest.n001.events.nodejob` -> `fox.events.nodejob`.

INGEST: Final = "ingest"
INGEST_CATEGORIES: Final = ("metrics", "events", "log", "sonar")
"""What a node may send through ingest (control is request/reply, answered directly)."""


def ingest(cluster: str, host: str, subject: str, *, prefix: str = "") -> str:
    """The ingest subject a node publishes `subject` (one of its cluster's) on: `fox.metrics` from n001 ->
    `fox.ingest.n001.metrics`. The host is one token (a short host name, no dots)."""
    target = parse(subject, prefix)
    if target.cluster != cluster or target.category not in INGEST_CATEGORIES:
        raise SubjectError(f"{subject}: not a subject of cluster {cluster!r} a node sends through ingest")
    tail = target.category + (f".{target.detail}" if target.detail else "")
    return f"{ingest_node_wildcard(cluster, host, prefix=prefix)[:-1]}{tail}"


def ingest_node_wildcard(cluster: str, host: str, *, prefix: str = "") -> str:
    """Everything one node may publish: `<root>.ingest.<host>.>` (its permission and nothing else)."""
    return f"{_root(cluster, prefix)}.{INGEST}.{_token('host name', host)}.>"


def ingest_node_allowed(
    cluster: str, host: str, *, events: Iterable[str], sonar_kinds: Iterable[str], prefix: str = ""
) -> list[str]:
    """The ingest subjects one node may publish on, as the broker's allow-list: `metrics`, the event classes
    `events` and Sonar kinds `sonar_kinds` it may send (`schemas.trust` lists them), and `log.>`."""
    base = ingest_node_wildcard(cluster, host, prefix=prefix)[:-1]
    return [
        f"{base}metrics",
        *(f"{base}events.{_token('event class', cls)}" for cls in sorted(events)),
        f"{base}log.>",
        *(f"{base}sonar.{_token('Sonar kind', kind)}" for kind in sorted(sonar_kinds)),
    ]


def ingest_wildcard(cluster: str, *, prefix: str = "") -> str:
    """The ingest stream's subjects: `<root>.ingest.>`."""
    return f"{_root(cluster, prefix)}.{INGEST}.>"


class IngestSubject(msgspec.Struct, frozen=True):
    host: str
    """The node the broker let publish this (the token after `ingest`)."""
    target: Subject
    """The subject the message stands for (`fox.metrics`)."""


def parse_ingest(subject: str, prefix: str = "") -> IngestSubject:
    """`fox.ingest.n001.events.nodejob` -> host `n001`, target `fox.events.nodejob`; `SubjectError` saying
    why for anything else. Read from the right, like `parse`: cluster names may contain dots."""
    tokens = subject.split(".")
    width = 1 if tokens[-1:] == ["metrics"] else 2
    if len(tokens) >= width + 3 and tokens[-width - 2] == INGEST:
        host = tokens[-width - 1]
        target = parse(".".join(tokens[: -width - 2] + tokens[-width:]), prefix)
        if target.category in INGEST_CATEGORIES and _TOKEN.match(host):
            return IngestSubject(host, target)
    raise SubjectError(
        f"{subject}: not an ingest subject (<cluster>.ingest.<host>.metrics, .events.<class>, .log.<component>, "
        ".sonar.<kind>)"
    )
