"""Settings keys that several commands share, each declared once: its type, bounds, default and the text that
becomes its help, its comment in the sample configs and its row in the READMEs.

A msgspec struct extends one base with fields (two bases with fields are a layout conflict), so a key that
unrelated structs need (the gateway's, the InfluxDB writer's and the Sonar worker's `max_future`) cannot
come from a common base. Each struct names it with the alias here and its default, with no docstring of its
own: `hpcbus.options.field_docs` takes the text from the alias' description. `tests/test_settings_declared_
once.py` fails on a key two structs declare any other way (with other bounds, another default or words of
their own), except the homonyms it lists (`interval`, `timeout`, ...: the same word for different things).
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from hpcbus.schemas.jobsummary import DEFAULT_THRESHOLDS

MaxFuture = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        description="Seconds a timestamp may be ahead of this process's clock. A line later than that, or "
        "before 2000-01-01 (read by magnitude as s/ms/us/ns), is refused with its line number, and so is a "
        "Sonar envelope dated outside that window (a job record alone, when only its times are): never "
        "stored in the wrong year.",
    ),
]
MAX_FUTURE: Final = 86_400

StatsSeconds = Annotated[
    float,
    msgspec.Meta(
        gt=0.0,
        description="Interval of the one-line summary in the log and, for the workers and the gateway, of the "
        "self-telemetry (`hpcbus_*` counter lines on `<cluster>.telemetry`, what `hpcbus status` reads).",
    ),
]
STATS_SECONDS: Final = 60.0

LeaseTtl = Annotated[
    int,
    msgspec.Meta(
        ge=3,
        le=300,
        description='Seconds the role\'s lease lives without a renewal (`state = "jetstream"`): a dead '
        "holder's standby takes over after about this long. Renewed every fifth of it; a holder whose renewals "
        "fail for two thirds of it stops acting, before its lease can have expired.",
    ),
]
LEASE_TTL: Final = 15

STATE_MOVED: Final = "the state file's path is `state_file` since the release of the active/standby pairs"
"""What `produce slurm` and `produce ocs` add when `state` names a file, as it did before (`Section.hints`)."""

PublishTimeout = Annotated[
    float,
    msgspec.Meta(
        gt=0.0,
        description="Seconds to wait for JetStream's acknowledgement of a publish before it counts as failed "
        "(retried; a gateway request is answered 503 and the client retries): what was stored meanwhile is "
        "dropped as a duplicate by its `Nats-Msg-Id`.",
    ),
]
PUBLISH_TIMEOUT: Final = 5.0

Align = Annotated[
    bool,
    msgspec.Meta(
        description="Take samples at wall-clock multiples of `interval` (:00, :30, ...), so all nodes sample "
        "together and a sample's time says which interval it belongs to; false: every `interval` from the start."
    ),
]
ALIGN: Final = True

IdleGpu = Annotated[
    float,
    msgspec.Meta(
        ge=0.0,
        le=100.0,
        description="Flag `idle_gpu` when a card of the job was used less than this, percent (mean over the job; "
        "`report` applies it to jobs without a summary).",
    ),
]
MemOverrequested = Annotated[
    float,
    msgspec.Meta(
        ge=0.0,
        le=100.0,
        description="Flag `mem_overrequested` when the memory peak is below this share of the request, percent "
        "(`report` applies it to jobs without a summary).",
    ),
]
CpuUnderused = Annotated[
    float,
    msgspec.Meta(
        ge=0.0,
        le=100.0,
        description="Flag `cpu_underused` when CPU efficiency is below this, percent (`report` applies it to "
        "jobs without a summary).",
    ),
]
IDLE_GPU: Final = DEFAULT_THRESHOLDS.idle_gpu
MEM_OVERREQUESTED: Final = DEFAULT_THRESHOLDS.mem_overrequested
CPU_UNDERUSED: Final = DEFAULT_THRESHOLDS.cpu_underused

SHARED: Final[dict[str, tuple[object, object]]] = {
    "max_future": (MaxFuture, MAX_FUTURE),
    "stats_seconds": (StatsSeconds, STATS_SECONDS),
    "lease_ttl": (LeaseTtl, LEASE_TTL),
    "publish_timeout": (PublishTimeout, PUBLISH_TIMEOUT),
    "align": (Align, ALIGN),
    "idle_gpu": (IdleGpu, IDLE_GPU),
    "mem_overrequested": (MemOverrequested, MEM_OVERREQUESTED),
    "cpu_underused": (CpuUnderused, CPU_UNDERUSED),
}
"""key -> (its one declaration, its default): what `tests/test_settings_declared_once.py` holds every struct
that has the key to."""
