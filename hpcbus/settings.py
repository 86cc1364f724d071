"""Settings every bus-connected subcommand shares. Precedence: flag > environment > TOML file > default.

Names follow the `nats` CLI (`--server` and `-s` are accepted for `--nats`), so admins reuse what they know.
The machinery that turns settings structs into flags, checks and samples is `hpcbus.options`.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from typing import Annotated, Literal, TypeVar

import msgspec

from hpcbus.options import Section, SettingsError, add_section_arguments, load_table, read_section
from hpcbus.schemas.hostnames import HostnameForm, host_name

__all__ = [
    "BUS",
    "CCBACKEND",
    "STREAM",
    "STREAM_METAVARS",
    "BusSettings",
    "CcBackendSettings",
    "HostnameSettings",
    "PublisherSettings",
    "SettingsError",
    "add_bus_arguments",
    "add_stream_arguments",
    "bus_settings",
    "cc_backend_settings",
    "load_table",
    "nats_connect_options",
    "section_settings",
    "stream_overrides",
]

T = TypeVar("T", bound=msgspec.Struct)


class BusSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the NATS bus is and who we are on it."""

    nats: list[str] = msgspec.field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    """NATS servers; a list, or one comma-separated string."""
    creds: str = ""
    """NATS credentials file (JWT and seed, decentralised auth with `nsc`)."""
    nkey: str = ""
    """NATS nkey seed file (`hpcbus deploy nats-auth` writes one per identity)."""
    inbox_prefix: str = "_INBOX"
    """Start of this client's reply subjects. With `hpcbus deploy nats-auth` each identity has its own
    (`_INBOX.<identity>`) and may subscribe to it alone, so no one reads another's replies."""
    user: str = ""
    """NATS user name."""
    password: str = ""
    """NATS password."""
    tlscert: str = ""
    """TLS client certificate."""
    tlskey: str = ""
    """TLS client key."""
    tlsca: str = ""
    """TLS CA to verify the server (with it, `nats://` URLs are reached over TLS)."""
    cluster: str = ""
    """Cluster name, the first part of every subject; may contain dots. Required. Consumers take several,
    comma-separated."""
    subject_prefix: str = ""
    """Put the subject tree under this prefix: `cc` gives ClusterCockpit's tree of today
    (`cc.<cluster>.metrics`), "" the original specification's (`<cluster>.metrics`). Part of the subjects
    only: tags, Sonar's `meta.cluster` and stream names keep the plain cluster name. Producers, consumers,
    `hpcbus pub` and `deadletter` of one bus must agree on it."""
    stream_replicas: Annotated[int, msgspec.Meta(ge=0, le=5)] = 0
    """Replicas of every stream this command creates (telemetry and dead letter). 0 = auto: 1 on a single
    nats-server (it refuses more), 3 on a cluster (fewer only when the cluster advertises fewer servers), so
    no stream of a cluster hangs on one server. An existing stream is never changed: a difference is a
    WARNING naming the stream, the setting and both values."""
    stream_storage: Literal["file", "memory"] = "file"
    """Where a created stream keeps its messages: `file` survives a restart of its servers, `memory` does
    not (on a cluster, the replicas on the other servers still hold it)."""
    stream_placement_tags: list[str] = msgspec.field(default_factory=list)
    """Server tags (nats-server `server_tags`) a created stream must be placed on, e.g. `ssd`; [] = any
    servers."""
    stream_discard: Literal["old", "new"] = "old"
    """What a created telemetry or ingest stream does when full. `old`: it drops its oldest messages, read
    or not (a worker that finds it lost unread ones says how many, also those gone before its durable was
    created: docs/scaling.md). `new`: nothing is dropped before every durable has it: a message is kept
    until each durable reading its subject has acknowledged it (JetStream `interest` retention, so a
    healthy site frees what its workers took and is never refused), and a full stream refuses new messages
    (producers keep their backlogs, the gateway answers 503). With `new`, nothing is kept while the stream
    has no durable at all, so until a worker has started the producers hold their data, the gateway
    answers 503 and `hpcbus pub` refuses; a subject no durable reads is not kept."""
    expected_nodes: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Compute nodes that publish on this cluster (0 = not said). A command that creates the telemetry or
    ingest stream with room for less than one hour of them (4.5 kB/s per node at a 30 s interval,
    docs/scaling.md) logs a WARNING naming the stream, its size and the size an hour needs."""


BUS = Section(
    "bus",
    BusSettings,
    env={
        "nats": "NATS_URL",
        "creds": "NATS_CREDS",
        "nkey": "NATS_NKEY",
        "inbox_prefix": "NATS_INBOX_PREFIX",
        "user": "NATS_USER",
        "password": "NATS_PASSWORD",
        "tlscert": "NATS_CERT",
        "tlskey": "NATS_KEY",
        "tlsca": "NATS_CA",
        "cluster": "HPCBUS_CLUSTER",
        "subject_prefix": "HPCBUS_SUBJECT_PREFIX",
        "stream_replicas": "HPCBUS_STREAM_REPLICAS",
        "stream_storage": "HPCBUS_STREAM_STORAGE",
        "stream_placement_tags": "HPCBUS_STREAM_PLACEMENT_TAGS",
        "stream_discard": "HPCBUS_STREAM_DISCARD",
        "expected_nodes": "HPCBUS_EXPECTED_NODES",
    },
    flags={
        "nats": ("--nats", "--server", "-s"),
        "tlscert": ("--tlscert", "--tls-cert"),
        "tlskey": ("--tlskey", "--tls-key"),
        "tlsca": ("--tlsca", "--tls-ca"),
    },
    metavars={
        "nats": "URL",
        "creds": "FILE",
        "nkey": "FILE",
        "inbox_prefix": "SUBJECT",
        "user": "NAME",
        "password": "SECRET",
        "tlscert": "FILE",
        "tlskey": "FILE",
        "tlsca": "FILE",
        "cluster": "NAME",
        "subject_prefix": "PREFIX",
        "stream_placement_tags": "TAG,TAG",
        "expected_nodes": "N",
    },
    files=("creds", "nkey", "tlscert", "tlskey", "tlsca"),
)

STREAM_KEYS = (
    "stream_replicas",
    "stream_storage",
    "stream_placement_tags",
    "stream_discard",
    "expected_nodes",
)
"""`[bus]` keys of the streams a command creates when they are missing."""

BUS_CLIENT = Section(
    BUS.table,
    BUS.struct,
    env=BUS.env,
    flags={**BUS.flags, **{key: () for key in STREAM_KEYS}},
    metavars=BUS.metavars,
    notes={key: "Not used by this command (it creates no stream)." for key in STREAM_KEYS},
    files=BUS.files,
)
"""`[bus]` for a command that creates no stream (`tail`, `status`, `pub`, `deadletter`, `deploy nats-auth`):
the same keys, file and variables, without flags for the stream keys, which would mean nothing there."""


class HostnameSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """How nodes are named on the bus, one setting for every part that names them (`schemas.hostnames`): the
    settings of `produce node`, `consume sonar`, `produce slurm` and `produce ocs` extend this struct, so all
    read the same keys."""

    hostname_form: HostnameForm = "as-is"
    """How a node's name is written: `as-is`, `short` (up to the first dot: Sonar 0.19's default,
    `hostname-only`) or `domain` (the short name plus `.<hostname_domain>`). A site running Sonar and
    hpcbus node agents sets the same form on both and on its Slurm/OCS producers, so one node has one name
    (for the node agent: the kernel's host name; an explicit `hostname` is used as it is)."""
    hostname_domain: str = ""
    """The domain of the `domain` form (`fox.example.org`); required by it."""

    def __post_init__(self) -> None:
        if self.hostname_form == "domain" and not self.hostname_domain.strip("."):
            raise ValueError('hostname_form = "domain" needs hostname_domain (e.g. "fox.example.org")')
        self.hostname_domain = self.hostname_domain.strip(".")

    def host_name(self, name: str) -> str:
        """`name` in this form."""
        return host_name(name, self.hostname_form, self.hostname_domain)


class CcBackendSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """cc-backend (1.5) reads job events and node states from two subjects of its own configuration
    (`api-subjects`), outside the hpcbus tree and the telemetry stream, with core NATS."""

    cc_job_subject: str = ""
    """Also publish every start_job/stop_job line to this subject, cc-backend's
    `api-subjects.subject-job-event` (e.g. `cc.job.event`), one line per message, timestamp in
    nanoseconds (as cc-backend reads it). "" = off."""
    cc_node_state_subject: str = ""
    """Also publish the node states (`nodestate` event) to this subject, cc-backend's
    `api-subjects.subject-node-state` (e.g. `cc.node.state`), timestamp in nanoseconds. "" = off."""


CCBACKEND = Section(
    "ccbackend",
    CcBackendSettings,
    env={"cc_job_subject": "HPCBUS_CC_JOB_SUBJECT", "cc_node_state_subject": "HPCBUS_CC_NODE_STATE_SUBJECT"},
    metavars={"cc_job_subject": "SUBJECT", "cc_node_state_subject": "SUBJECT"},
)
"""`[ccbackend]`, read by the producers that emit cc-backend events (`produce slurm`, `produce ocs`)."""


def cc_backend_settings(
    args: argparse.Namespace,
    section: Section[CcBackendSettings] = CCBACKEND,
    environ: Mapping[str, str] | None = None,
) -> CcBackendSettings:
    """The cc-backend subjects, each checked as a concrete subject (`SettingsError`, exit 2)."""
    from hpcbus.schemas.subjects import SubjectError, check_subject

    settings = read_section(args, section, environ)
    for name in ("cc_job_subject", "cc_node_state_subject"):
        value = getattr(settings, name)
        if value:
            try:
                check_subject(value, f"--{name.replace('_', '-')}")
            except SubjectError as exc:
                raise SettingsError(str(exc)) from None
    return settings


class PublisherSettings(HostnameSettings, forbid_unknown_fields=True, kw_only=True):
    """What every command that publishes about nodes and creates the cluster's stream when it is missing
    shares: how nodes are named (`HostnameSettings`) and the stream's limits. The settings of `produce node`
    (`[node_agent]`), `produce slurm` and `produce ocs` extend it, so each key is declared once and means
    the same everywhere; the flags-only `STREAM` section (gateway, simulate, consumers) reads its two
    limits. (One struct, not two: a msgspec struct extends one base with fields.)"""

    stream_max_age: Annotated[float, msgspec.Meta(ge=0.0)] = 0.0
    """Seconds the telemetry stream keeps messages when this command creates it (0: hpcbus' default, 7
    days)."""
    stream_max_bytes: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Bytes the telemetry stream keeps when this command creates it (0: hpcbus' default, 1 GiB)."""


STREAM_METAVARS = {"stream_max_age": "S", "stream_max_bytes": "BYTES"}
"""The metavars of the stream limits, wherever a section shows them."""

STREAM = Section(
    None,
    PublisherSettings,
    title="stream (when this command creates it; $HPCBUS_STREAM_MAX_AGE, $HPCBUS_STREAM_MAX_BYTES without a flag)",
    flags={"hostname_form": (), "hostname_domain": ()},
    metavars=STREAM_METAVARS,
)
"""Flags only, the stream limits alone (the node names are not this section's): the workers
(`hpcbus.sinks.worker_clusters`), the gateway and `simulate` read it with `read_section(args, STREAM)` and
hand it to `stream_overrides`, which takes the environment for a limit not given."""


def add_config_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """`--config FILE`: every command that reads tables takes it (`hpcbus.cli` adds it, once)."""
    parser.add_argument("--config", metavar="FILE", help="TOML file; its tables hold the keys of the flags")


def add_bus_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_argument(add_section_arguments(parser, BUS))


def add_connect_timeout(parser: argparse.ArgumentParser) -> None:
    """`--connect-timeout S` of a one-shot command (`pub`, `deadletter`): how long it tries each NATS server
    before it gives up with exit 1 (`hpcbus.connection.connect_once`), never waiting for ever as a service does."""
    parser.add_argument(
        "--connect-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="seconds to wait for each NATS server before giving up (default 5)",
    )


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """The JetStream stream's limits, for commands that create it when it is missing."""
    add_section_arguments(parser, STREAM)


def bus_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> BusSettings:
    """`[bus]`; a reply prefix that is not a subject is a `SettingsError` here, not a client error later."""
    from hpcbus.schemas.subjects import SubjectError, check_subject

    settings = read_section(args, BUS, environ)
    try:
        check_subject(settings.inbox_prefix, "--inbox-prefix")
    except SubjectError as exc:
        raise SettingsError(str(exc)) from None
    return settings


def nats_connect_options(s: BusSettings) -> dict[str, object]:
    """Keyword arguments for `nats.connect` that follow from the settings (TLS, auth)."""
    opts: dict[str, object] = {"servers": s.nats}
    if s.creds:
        opts["user_credentials"] = s.creds
    if s.nkey:
        opts["nkeys_seed"] = s.nkey
    if s.inbox_prefix != "_INBOX":
        opts["inbox_prefix"] = s.inbox_prefix
    if s.user:
        opts["user"] = s.user
        opts["password"] = s.password
    if s.tlscert or s.tlsca:
        import ssl

        ctx = ssl.create_default_context(cafile=s.tlsca or None)
        if s.tlscert:
            ctx.load_cert_chain(s.tlscert, s.tlskey or None)
        opts["tls"] = ctx
    return opts


def section_settings(
    args: argparse.Namespace,
    section: str,
    struct: type[T],
    *,
    flags: Iterable[str] | None = None,
    environ_vars: Mapping[str, str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> T:
    """A command's own settings from `[section]`, `environ_vars` (field -> variable) and the flags named like
    the fields (or only those in `flags`); see `hpcbus.options.read_section`."""
    only = None if flags is None else set(flags)
    spec = Section(
        section,
        struct,
        env=environ_vars or {},
        flags={} if only is None else {f: () for f in struct.__struct_fields__ if f not in only},
    )
    return read_section(args, spec, environ)


STREAM_ENV = {"max_age": "HPCBUS_STREAM_MAX_AGE", "max_bytes": "HPCBUS_STREAM_MAX_BYTES"}
"""The stream limits from the environment where no flag gave them (None): how a unit, whose command line is
fixed, sizes the streams its worker creates (`/etc/hpcbus/hpcbus.env`, docs/deploy.md)."""


def stream_overrides(
    max_age: float | None, max_bytes: int | None, environ: Mapping[str, str] | None = None
) -> dict[str, object]:
    """`telemetry_stream` keyword arguments for the limits a user set (0 or None: the default); a limit
    left None (no flag) is taken from `$HPCBUS_STREAM_MAX_AGE` / `$HPCBUS_STREAM_MAX_BYTES` when set."""
    env = os.environ if environ is None else environ

    def from_env(name: str, kind: type[float] | type[int]) -> float | int | None:
        text = env.get(STREAM_ENV[name], "")
        if not text:
            return None
        try:
            value = kind(text)
        except ValueError:
            value = -1
        if value < 0:
            raise SettingsError(f"${STREAM_ENV[name]}: {text!r} is not a {kind.__name__} >= 0")
        return value

    # 0 is "not set" as much as None: a typed section (`read_section(args, STREAM)`) reads a flag not given as
    # its default 0, and the environment must still count then
    max_age = max_age if max_age else from_env("max_age", float)
    max_bytes = max_bytes if max_bytes else int(from_env("max_bytes", int) or 0)
    overrides: dict[str, object] = {}
    if max_age:
        overrides["max_age"] = max_age
    if max_bytes:
        overrides["max_bytes"] = max_bytes
    return overrides


def clusters(bus: BusSettings, *, several: bool = False) -> list[str]:
    """The cluster names of `--cluster`, each checked as the first part of a subject; `several`: a
    comma-separated list (a worker may serve several clusters), else exactly one. `SettingsError` (exit 2)
    when it is missing or not a valid subject prefix."""
    from hpcbus.schemas.subjects import SubjectError, check_prefix, metrics

    try:
        check_prefix(bus.subject_prefix)
    except SubjectError as exc:
        raise SettingsError(f"--subject-prefix: {exc}") from None

    names = [c.strip() for c in bus.cluster.split(",") if c.strip()] if several else [bus.cluster.strip()]
    if not any(names):
        raise SettingsError("--cluster (HPCBUS_CLUSTER) is required: it is the first part of every subject")
    if not several and "," in names[0]:
        raise SettingsError(f"--cluster {names[0]!r}: this command serves one cluster")
    for name in names:
        try:
            metrics(name)
        except SubjectError as exc:
            raise SettingsError(f"--cluster: {exc}") from None
    return names


def check_sonar_names(names: Iterable[str], hostnames: HostnameSettings | None = None) -> None:
    """`SettingsError` (exit 2) when a Sonar envelope made with these settings could never be valid: a cluster
    name that is no Sonar 0.19 `Clustername` (the bus takes `_`, Sonar does not), or a `hostname_domain` that
    makes every node's name (`<short>.<domain>`) no Sonar `Hostname`. Said at start: otherwise every envelope
    of every interval fails validation and is dead-lettered."""
    import re

    from hpcbus.schemas.names import sonar_host_problem
    from hpcbus.schemas.sonar.types import CLUSTERNAME_PATTERN

    for cluster in names:
        if not re.fullmatch(CLUSTERNAME_PATTERN, cluster):
            raise SettingsError(
                f"--cluster {cluster!r}: a Sonar envelope's cluster is a Clustername, a host-name-like name "
                "(letters, digits, hyphens, dots; no label starting with a hyphen)"
            )
    if hostnames is not None and hostnames.hostname_form == "domain":
        problem = sonar_host_problem(hostnames.host_name("n"))  # the shortest name: if it fails, all do
        if problem is not None:
            raise SettingsError(
                f"--hostname-domain {hostnames.hostname_domain!r}: no node's name would be a Sonar Hostname "
                f"({problem})"
            )
