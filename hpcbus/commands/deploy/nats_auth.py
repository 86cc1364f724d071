"""`hpcbus deploy nats-auth`: the nats-server authorization for one cluster, one identity per role.

Secrets are NATS nkeys: nats-server verifies a signature of a fresh nonce against the public key in its
configuration, so the server files hold no secret (they can sit in configuration management and on three
servers), each host holds only its own seed, nothing secret crosses the wire, and nats-py (`nkeys_seed`,
with the `nkeys` package) and the `nats` CLI (`--nkey`) read the seed file as written here. Passwords would
sit in the server config (or bcrypted, but then in a second file per host anyway); JWT accounts (`--creds`)
need an operator, `nsc` and a resolver, which a site may still choose: hpcbus reads creds files too.

Written to `--out DIR`:

- `auth.conf`: the `authorization { users: [...] }` block, `include`d by every server's config
  (deploy/nats/nats-server.conf); public keys and permissions only;
- `<identity>.nk`: the seed (mode 0600), copied to the one host that runs the identity;
- `<identity>.env`: `NATS_NKEY`, `NATS_INBOX_PREFIX` (and `HPCBUS_NODE_INGEST=1` for a node), for the
  systemd units' `EnvironmentFile`.

Seeds that exist are kept (adding nodes does not change the others; `--rotate` makes new ones); an
identity no longer asked for loses its access with the next `auth.conf` (its files are left for you to
remove). Permissions, least privilege (`docs/security.md` has the threat model):

| identity | publishes | subscribes |
| --- | --- | --- |
| `node-<host>` | `<c>.ingest.<host>.` + what a node may send (`schemas.trust`: `metrics`, `events.nodejob|sample|sysinfo|errors`, `log.>`, `sonar.sample|sysinfo`); replies to control requests | `<c>.control.get|put` |
| `master` | `<c>.metrics`, `.telemetry` (its own counters), `.events.>` (job events) except `jobsummary`, `.log.>`, `.sonar.job|cluster`, the cc-backend subjects; the leases `slurm` and `ocs` and their state in the roles bucket (the producers' pairs) | — |
| `gateway` | `<c>.metrics`, `.telemetry`, `.events.>` except `job` and `jobsummary`, `.log.>`, `.sonar.>` (a master credential posts job and cluster records) | — |
| `worker-influx` | `<c>.log.hpcbus`, `.telemetry` (its own counters), the dead letter | its durables on the telemetry stream (one per InfluxDB copy, docs/scaling.md) |
| `worker-sonar` | `<c>.sonar.>`, `.metrics`, `.telemetry`, `.events.>` except `job` and `jobsummary`, `.log.>`, the dead letter | its durables |
| `worker-jobs` | `<c>.events.jobsummary` (the only identity that may: `consume influx` writes each summary's `job_summary` point), `.log.hpcbus`, `.telemetry`, the dead letter; its lease `jobs` and state in the roles bucket (an active/standby pair) | its durable |
| `worker-ingest` | `<c>.metrics`, `.telemetry`, `.events.>` except `job` and `jobsummary`, `.log.>`, `.sonar.sample|sysinfo`, the dead letter | its durable on the ingest stream |
| `reader` | nothing | `<c>.metrics`, `.telemetry`, `.events.>`, `.log.>`, `.sonar.>`, the cc-backend subjects |
| `monitor` | no data subject: the JetStream info APIs, reads without acks (`hpcbus status`, `hpcbus tail`) and the leases (who holds each role) | the whole tree but the dead letter, the cc-backend subjects |
| `inject` | the whole tree but the dead letter (tests, `nats pub`) | its replies |
| `admin` | everything (`nats stream edit`, `hpcbus deadletter`) | everything |

Every identity subscribes to its own inbox (`_INBOX.<identity>.>`) for replies; JetStream API subjects are
granted per stream: producers may only read their stream's info, workers create and update their streams
and bind, pull and ack on them; every identity that publishes through JetStream may list which stream
captures a subject (`$JS.API.STREAM.NAMES`: how a publish nobody answered tells a leader election from a
missing stream); no one but `admin` may delete anything.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Literal

import msgspec

from hpcbus.options import Section, add_section_arguments, read_section
from hpcbus.settings import BUS_CLIENT, CCBACKEND, bus_settings, cc_backend_settings
from hpcbus.settings import clusters as cluster_names

HELP = "write nats-server authorization for a cluster: one identity per role"

log = logging.getLogger("hpcbus.nats_auth")

WorkerKind = Literal["influx", "sonar", "jobs", "ingest"]


class NatsAuthSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What `hpcbus deploy nats-auth` writes."""

    out: str = "nats-auth"
    """Directory for auth.conf, the seeds and the environment files (created; seeds kept across runs)."""
    nodes: list[str] = msgspec.field(default_factory=list)
    """Compute nodes, host lists allowed (`n[001-128],gpu[1-4]`): one identity each."""
    workers: list[WorkerKind] = msgspec.field(default_factory=lambda: ["influx", "sonar", "jobs", "ingest"])
    """Worker kinds to make an identity for."""
    seed_dir: str = "/etc/hpcbus/nats"
    """Where the seeds will be on the hosts: the path the environment files name."""
    rotate: bool = False
    """Make new seeds also for identities that have one (everyone must get the new files)."""


AUTH = Section(
    None,
    NatsAuthSettings,
    title="nats-auth",
    metavars={"out": "DIR", "nodes": "HOSTLIST", "workers": "KIND,KIND", "seed_dir": "DIR"},
)
SECTIONS = (BUS_CLIENT, CCBACKEND)
"""The config file's tables it reads (`AUTH` is flags only, read in `run`)."""
USES_BUS = True


class Permissions(msgspec.Struct, omit_defaults=True):
    """One user's `permissions` map in nats-server's configuration."""

    publish: dict[str, list[str]] = msgspec.field(default_factory=dict)
    subscribe: dict[str, list[str]] = msgspec.field(default_factory=dict)
    allow_responses: bool = False


class Identity(msgspec.Struct):
    name: str
    role: str
    permissions: Permissions
    env: dict[str, str] = msgspec.field(default_factory=dict)


def identities(
    cluster: str,
    *,
    prefix: str = "",
    nodes: list[str],
    workers: list[str],
    cc_subjects: list[str],
) -> list[Identity]:
    """Every identity of a cluster with its allow/deny lists (pure: no keys, no files)."""
    from hpcbus.schemas import subjects
    from hpcbus.schemas.trust import NODE_EVENTS, NODE_SONAR_KINDS
    from hpcbus.streams import (
        deadletter_stream,
        discards_bucket,
        ingest_stream,
        roles_bucket,
        telemetry_stream,
    )

    root = subjects.metrics(cluster, prefix=prefix).removesuffix(".metrics")
    telemetry = telemetry_stream(cluster, prefix=prefix).name
    dlq = deadletter_stream(cluster, prefix=prefix).name
    ingest = ingest_stream(cluster, prefix=prefix).name
    metrics = subjects.metrics(cluster, prefix=prefix)
    events = subjects.wildcard(cluster, "events", prefix=prefix)
    logs = subjects.wildcard(cluster, "log", prefix=prefix)
    own_log = subjects.log(cluster, "hpcbus", prefix=prefix)
    counters = subjects.telemetry(cluster, prefix=prefix)  # hpcbus' own `hpcbus_*` lines, never measurements
    sonar = subjects.wildcard(cluster, "sonar", prefix=prefix)
    job_events = subjects.events(cluster, "job", prefix=prefix)
    # the jobs worker's summaries: `consume influx` writes a `job_summary` point of each (docs/scaling.md,
    # "Two InfluxDBs"), so no other identity that may publish events may publish one
    summaries = subjects.jobsummary(cluster, prefix=prefix)
    deadletter = subjects.deadletter_wildcard(cluster, prefix=prefix)
    node_sonar = [subjects.sonar(cluster, k, prefix=prefix) for k in ("sample", "sysinfo")]
    master_sonar = [subjects.sonar(cluster, k, prefix=prefix) for k in ("job", "cluster")]

    # Which stream captures a subject (a list of names, read-only): asked when a JetStream publish finds no
    # responder, to tell a stream whose leader is being elected (retried) from none at all (dead-lettered;
    # hpcbus.bus.js_publish). Every identity that publishes through JetStream may ask it.
    names = "$JS.API.STREAM.NAMES"

    def info(*streams: str) -> list[str]:
        return [names, *(f"$JS.API.STREAM.INFO.{s}" for s in streams)]

    def manage(*streams: str) -> list[str]:
        return [names, *(f"$JS.API.STREAM.{op}.{s}" for s in streams for op in ("INFO", "CREATE", "UPDATE"))]

    def consume(stream: str) -> list[str]:
        return [
            f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.INFO.{stream}.>",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
            f"$JS.ACK.{stream}.>",
            *ledger(stream),
        ]

    def ledger(stream: str) -> list[str]:
        """The key-value bucket where the workers of a durable record the discards they reported
        (hpcbus.discards): created by the first worker, read and updated with compare-and-set."""
        kv = f"KV_{discards_bucket(stream)}"
        return [
            *manage(kv),
            f"$JS.API.STREAM.MSG.GET.{kv}",
            f"$JS.API.DIRECT.GET.{kv}.>",
            f"$KV.{discards_bucket(stream)}.>",
        ]

    roles = roles_bucket(cluster)

    def pair(role: str) -> list[str]:
        """What one side of an active/standby pair needs (hpcbus.lease): the cluster's roles bucket (created
        by the first of the pair, made to allow atomic batches), its lease key, its standby key and its state
        keys (written with compare-and-set, the lease's fence, in atomic batches), direct gets of them, and an ordered consumer of its state keys to load them at a
        takeover (created on the stream, flow control answered)."""
        kv = f"KV_{roles}"
        return [
            *manage(kv),
            f"$JS.API.DIRECT.GET.{kv}.$KV.{roles}.lease.{role}",
            f"$JS.API.DIRECT.GET.{kv}.$KV.{roles}.state.{role}.>",
            f"$JS.API.CONSUMER.CREATE.{kv}",
            f"$JS.API.CONSUMER.CREATE.{kv}.>",
            f"$JS.API.CONSUMER.INFO.{kv}.>",
            f"$JS.FC.{kv}.>",
            f"$KV.{roles}.lease.{role}",
            f"$KV.{roles}.standby.{role}",
            f"$KV.{roles}.state.{role}.>",
        ]

    def make(
        name: str,
        role: str,
        publish: list[str],
        *,
        deny: list[str] | None = None,
        subscribe: list[str] | None = None,
        responses: bool = False,
        env: dict[str, str] | None = None,
    ) -> Identity:
        inbox = f"_INBOX.{name}"
        publish = list(dict.fromkeys(publish))
        pub = {"allow": publish} if publish else {"deny": [">"]}
        if deny:
            pub["deny"] = deny
        perms = Permissions(
            publish=pub,
            subscribe={"allow": [*(subscribe or []), f"{inbox}.>"]},
            allow_responses=responses,
        )
        return Identity(name, role, perms, {"NATS_INBOX_PREFIX": inbox, **(env or {})})

    jobs_deny = [job_events, subjects.ingest_wildcard(cluster, prefix=prefix)]
    worker_deny = [*jobs_deny, summaries]
    worker_common = [*manage(telemetry, dlq), *consume(telemetry), deadletter, counters]
    kinds = {
        "influx": make("worker-influx", "worker", [*worker_common, own_log], deny=worker_deny),
        "sonar": make(
            "worker-sonar", "worker", [*worker_common, sonar, metrics, events, logs], deny=worker_deny
        ),
        "jobs": make(
            "worker-jobs",
            "worker",
            [*worker_common, summaries, own_log, *pair("jobs")],
            deny=jobs_deny,
        ),
        "ingest": make(
            "worker-ingest",
            "worker",
            [
                *manage(ingest, telemetry, dlq),
                *consume(ingest),
                deadletter,
                counters,
                metrics,
                events,
                logs,
                *node_sonar,
            ],
            deny=worker_deny,
        ),
    }
    out = [
        make(
            f"node-{host}",
            "node",
            [
                *subjects.ingest_node_allowed(
                    cluster, host, events=NODE_EVENTS, sonar_kinds=NODE_SONAR_KINDS, prefix=prefix
                ),
                *info(ingest),
            ],
            subscribe=[subjects.control(cluster, m, prefix=prefix) for m in ("get", "put")],
            responses=True,
            env={"HPCBUS_NODE_INGEST": "1"},
        )
        for host in nodes
    ]
    out.append(
        make(
            "master",
            "master",
            [
                *[metrics, counters, events, logs, *master_sonar, *cc_subjects, *info(telemetry)],
                *pair("slurm"),
                *pair("ocs"),
            ],
            deny=[summaries],
        )
    )
    out.append(
        make(
            "gateway",
            "gateway",
            [metrics, counters, events, logs, *node_sonar, *master_sonar, *info(telemetry)],
            deny=[job_events, summaries],
        )
    )
    out += [kinds[k] for k in workers]
    out.append(make("reader", "reader", [], subscribe=[metrics, counters, events, logs, sonar, *cc_subjects]))
    out.append(monitor(cluster, root, telemetry, ingest, dlq, deadletter, cc_subjects, roles))
    out.append(
        make(
            "inject",
            "inject",
            [f"{root}.>", *info(telemetry, ingest)],
            deny=[deadletter],
            responses=True,
        )
    )
    out.append(make("admin", "admin", [">"], subscribe=[">"]))
    return out


def monitor(
    cluster: str,
    root: str,
    telemetry: str,
    ingest: str,
    dlq: str,
    deadletter: str,
    cc_subjects: list[str],
    roles: str,
) -> Identity:
    """`monitor`, for `hpcbus status` and `hpcbus tail`: it publishes to no data subject, only to the
        JetStream API subjects that read: account, stream and consumer info and lists, the newest dead letter
        (`STREAM.MSG.GET` on the dead-letter stream: its reason), and ephemeral readers of its streams
        (`CONSUMER.CREATE` by name, `MSG.NEXT`), and the leases of the roles bucket (who holds which active/standby
    role; not the state the holders keep there). It cannot acknowledge (`$JS.ACK` is not granted), so it can
        never take a message from a worker's durable, and it cannot update or delete anything (a consumer
        created by name could be made durable by its body, which permissions do not see: read load at worst). It subscribes to the cluster's tree (the dead letter's payloads excepted: the server filters
        them out of a `<c>.>` subscription) and to the cc-backend subjects."""
    api = "$JS.API"
    publish = [
        f"{api}.INFO",
        f"{api}.STREAM.LIST",
        f"{api}.STREAM.NAMES",
        *(f"{api}.STREAM.INFO.{s}" for s in (telemetry, ingest, dlq)),
        f"{api}.STREAM.MSG.GET.{dlq}",
        *(f"{api}.CONSUMER.{op}.{s}" for s in (telemetry, ingest) for op in ("LIST", "NAMES")),
        *(f"{api}.CONSUMER.{op}.{s}.>" for s in (telemetry, ingest) for op in ("CREATE", "INFO", "MSG.NEXT")),
        f"{api}.STREAM.INFO.KV_{roles}",
        f"{api}.DIRECT.GET.KV_{roles}.$KV.{roles}.lease.>",
        f"{api}.DIRECT.GET.KV_{roles}.$KV.{roles}.standby.>",
    ]
    inbox = "_INBOX.monitor"
    perms = Permissions(
        publish={"allow": publish, "deny": [f"{api}.CONSUMER.DURABLE.>", "$JS.ACK.>"]},
        subscribe={"allow": [f"{root}.>", *cc_subjects, f"{inbox}.>"], "deny": [deadletter]},
    )
    # HPCBUS_CLUSTER: it may read this cluster's streams only, so `status` must not look for others
    return Identity("monitor", "monitor", perms, {"NATS_INBOX_PREFIX": inbox, "HPCBUS_CLUSTER": cluster})


def new_seed() -> bytes:
    import nkeys

    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed


def public_key(seed: bytes) -> str:
    import nkeys

    key: bytes = nkeys.from_seed(bytearray(seed)).public_key
    return key.decode()


def render_conf(users: list[tuple[Identity, str]], cluster: str) -> str:
    """The `authorization` block; JSON values are valid nats-server configuration."""
    lines = [
        f"# nats-server authorization for hpcbus cluster {cluster}: written by `hpcbus deploy nats-auth`.",
        "# Public keys and permissions only (no secret); `include` it in every server's configuration and",
        "# reload (`nats-server --signal reload` or SIGHUP) after a change.",
        "authorization {",
        "  users: [",
    ]
    for identity, key in users:
        entry = {"nkey": key, "permissions": msgspec.to_builtins(identity.permissions)}
        lines.append(f"    # {identity.name} ({identity.role})")
        lines.append(f"    {json.dumps(entry)}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def write(settings: NatsAuthSettings, found: list[Identity], cluster: str) -> list[tuple[Identity, str]]:
    """The files of `--out`; OSError when one cannot be written, ValueError naming a kept seed file that
    is not a seed."""
    import nkeys

    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    users = []
    for identity in found:
        seed_path = out / f"{identity.name}.nk"
        if seed_path.exists() and not settings.rotate:
            seed = seed_path.read_bytes().strip()
            try:
                public_key(seed)
            except (nkeys.NkeysError, ValueError) as exc:
                raise ValueError(
                    f"{seed_path}: not an nkey seed ({exc}); remove it or use --rotate"
                ) from None
        else:
            seed = new_seed()
            fd = os.open(seed_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(seed + b"\n")
        users.append((identity, public_key(seed)))
        env = {"NATS_NKEY": f"{settings.seed_dir.rstrip('/')}/{identity.name}.nk", **identity.env}
        (out / f"{identity.name}.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    (out / "auth.conf").write_text(render_conf(users, cluster))
    return users


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, CCBACKEND)
    add_section_arguments(p, AUTH)


def run(args: argparse.Namespace) -> int:
    from hpcbus.schemas import noderange, subjects
    from hpcbus.settings import SettingsError

    bus = bus_settings(args)
    (cluster,) = cluster_names(bus)
    cc = cc_backend_settings(args)
    settings = read_section(args, AUTH)
    try:
        nodes = noderange.expand_all(settings.nodes)
        found = identities(
            cluster,
            prefix=bus.subject_prefix,
            nodes=nodes,
            workers=list(dict.fromkeys(settings.workers)),
            cc_subjects=[s for s in (cc.cc_job_subject, cc.cc_node_state_subject) if s],
        )
    except (ValueError, subjects.SubjectError) as exc:
        raise SettingsError(f"--nodes: {exc}") from None
    try:
        users = write(settings, found, cluster)
    except OSError as exc:
        log.error(
            "--out %s: %s%s", settings.out, exc.strerror or exc, f" ({exc.filename})" if exc.filename else ""
        )
        return 1
    except ValueError as exc:
        log.error("%s", exc)
        return 1
    stale = {p.stem for p in Path(settings.out).glob("*.nk")} - {i.name for i, _ in users}
    if stale:
        log.warning("not in auth.conf any more (their files remain): %s", ", ".join(sorted(stale)))
    print(f"wrote {settings.out}/auth.conf with {len(users)} identities ({len(nodes)} nodes):")
    for identity, key in users:
        print(f"  {identity.name:<20} {identity.role:<8} {key}")
    return 0
