"""The systemd units of deploy/systemd/, one per long-running command, written by `make samples` from the
table below so that every unit has the same hardening, config path and stop rules, and a new command is one
line here. tests/test_units.py runs `systemd-analyze verify` on them and checks each command line.

Every unit runs `/opt/hpcbus/venv/bin/hpcbus <command> --config /etc/hpcbus/hpcbus.toml` as the system
user `hpcbus` (deploy/sysusers.d/hpcbus.conf), with secrets from `/etc/hpcbus/hpcbus.env` and its NATS
identity from `/etc/hpcbus/<unit>.env` (`hpcbus-influx.env` for every `hpcbus-influx@` worker). Exit status 2 is
a configuration mistake (`hpcbus.cli`: the journal has one line naming it): restarting would repeat it every
few seconds, so `RestartPreventExitStatus=2` leaves the unit failed instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

VENV = "/opt/hpcbus/venv"
CONFIG = "/etc/hpcbus/hpcbus.toml"
ENV_DIR = "/etc/hpcbus"
ENV_FILE = f"{ENV_DIR}/hpcbus.env"
USER = "hpcbus"
STATE_DIR = "/var/lib/hpcbus"
SONAR_TREE = "/var/lib/hpcbus-sonar"
"""The `consume sonar --directory` tree the unit may write: outside the StateDirectory, which is 0750 (spill
directories, state files) where Jobanalyzer, another user, must read the tree."""


@dataclass(frozen=True)
class Unit:
    name: str
    """File name without `.service`; ends in `@` for a template (several workers of one kind)."""
    words: str
    """The hpcbus command."""
    what: str
    """One line for `Description=`."""
    capabilities: tuple[str, ...] = ()
    """Capabilities the command needs as the unprivileged user (ambient and bounding set); none for most."""
    why: str = ""
    """Why it needs them (a comment in the unit)."""
    devices: bool = False
    """Needs the host's devices (NVML opens /dev/nvidia*): no PrivateDevices."""
    families: tuple[str, ...] = ("AF_INET", "AF_INET6", "AF_UNIX")
    writes: tuple[str, ...] = ()
    """Paths beyond the StateDirectory it may write (`ReadWritePaths=`, `-`: no error while missing)."""
    umask: str = "0077"
    """0022 for files other users read (Sonar's tree, read by Jobanalyzer)."""
    notes: tuple[str, ...] = field(default_factory=tuple)


UNITS = (
    Unit(
        "hpcbus-node",
        "produce node",
        "hpcbus node agent: samples this compute node every interval",
        capabilities=("CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"),
        why=(
            "CAP_SYS_PTRACE: the kernel shows /proc/<pid>/io (read and written bytes per process) only to\n"
            "the process's owner or a tracer (ptrace access mode READ); with it the agent reads every user's\n"
            "processes, and it traces nothing. /proc/<pid>/cgroup, stat and status and the cgroup tree are\n"
            "world-readable: no capability for them. CAP_DAC_READ_SEARCH: counters only root may read, such\n"
            "as RAPL's /sys/class/powercap/*/energy_uj (mode 0400 since Linux 5.10). Neither lets it write\n"
            "anything: the file system is read-only to it (ProtectSystem=strict)."
        ),
        devices=True,
        families=("AF_INET", "AF_INET6", "AF_UNIX", "AF_NETLINK"),
    ),
    Unit(
        "hpcbus-slurm",
        "produce slurm",
        "hpcbus Slurm producer: jobs, steps and cluster state from sacct, squeue and sinfo",
        notes=(
            "Runs sacct/squeue/sinfo as the hpcbus user (munge's socket: AF_UNIX). Where slurm.conf sets",
            "PrivateData=jobs, make it an operator: sacctmgr add user hpcbus account=root adminlevel=Operator",
        ),
    ),
    Unit("hpcbus-ocs", "produce ocs", "hpcbus OCS/SGE producer: follows the accounting file"),
    Unit("hpcbus-influx@", "consume influx", "hpcbus worker %i: the bus into InfluxDB"),
    Unit(
        "hpcbus-sonar@",
        "consume sonar",
        "hpcbus worker %i: Sonar envelopes to and from line protocol",
        notes=(
            f"[sonar] directory: Sonar's tree under {SONAR_TREE} (create it owned by hpcbus, mode 0755),",
            "files 0644 for Jobanalyzer to read as its own user. Another path: `systemctl edit hpcbus-sonar@`",
            "with [Service] ReadWritePaths=<path> (docs/deploy.md).",
        ),
        writes=(SONAR_TREE,),
        umask="0022",
    ),
    Unit("hpcbus-ingest@", "consume ingest", "hpcbus worker %i: checks what nodes send and forwards it"),
    Unit(
        "hpcbus-jobs",
        "consume jobs",
        "hpcbus job summaries (one per cluster: a job's aggregates in one process)",
    ),
    Unit(
        "hpcbus-gateway",
        "gateway",
        "hpcbus gateway: InfluxDB and Sonar HTTP writes onto the bus",
        notes=(
            "Listens on [gateway] listen (default 127.0.0.1:8086). For a port below 1024 add",
            "AmbientCapabilities=CAP_NET_BIND_SERVICE and CapabilityBoundingSet=CAP_NET_BIND_SERVICE.",
        ),
    ),
)

HARDENING = """\
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
"""

PROTECT_CLOCK = (
    "# No ProtectClock: on systemd 245-251 it adds DeviceAllow=char-rtc, which denies every other device",
    "# (/dev/nvidia*: NVML fails with EPERM; fixed in systemd 252, PR #25075).",
)
"""Said in place of `ProtectClock=yes` in the units that open devices."""


def exec_start(unit: Unit) -> str:
    return f"{VENV}/bin/hpcbus {unit.words} --config {CONFIG}"


def unit_text(unit: Unit) -> str:
    template = unit.name.endswith("@")
    head = [
        f"# {unit.what.replace('%i', '<instance>')}.",
        "# Generated by `make samples` (hpcbus/commands/dev/units.py); install and check it as docs/deploy.md says.",
    ]
    if template:
        head.append(
            f"# A template: `systemctl enable --now {unit.name}1 {unit.name}2` runs two workers sharing one"
            " durable."
        )
    head += [f"# {n}" for n in unit.notes]
    caps = " ".join(unit.capabilities)
    service = [
        "[Service]",
        "Type=exec",
        f"User={USER}",
        f"Group={USER}",
        "# Secrets: the host's in hpcbus.env (INFLUX_TOKEN, ...), this unit's NATS identity in <unit>.env",
        "# (the `<identity>.env` of `hpcbus deploy nats-auth`: each command its own permissions).",
        f"EnvironmentFile=-{ENV_FILE}",
        f"EnvironmentFile=-{ENV_DIR}/%p.env",
        f"ExecStart={exec_start(unit)}",
        "# SIGTERM: the process flushes, acks and exits within seconds; it reconnects by itself, so restarts",
        "# are for crashes only. Exit 2 is a configuration mistake named in the journal: no restart loop.",
        "KillSignal=SIGTERM",
        "TimeoutStopSec=30",
        "Restart=on-failure",
        "RestartSec=5",
        "RestartPreventExitStatus=2",
        "StateDirectory=hpcbus",
        "StateDirectoryMode=0750",
        f"WorkingDirectory={STATE_DIR}",
    ]
    if caps:
        service += [f"# {line}" for line in unit.why.splitlines()]
        service += [f"AmbientCapabilities={caps}", f"CapabilityBoundingSet={caps}"]
    else:
        service += ["CapabilityBoundingSet="]
    service += [f"ReadWritePaths=-{path}" for path in unit.writes]
    if unit.devices:
        service += PROTECT_CLOCK
    else:
        service += ["PrivateDevices=yes", "ProtectClock=yes"]
    service += [f"RestrictAddressFamilies={' '.join(unit.families)}", f"UMask={unit.umask}"]
    return (
        "\n".join(
            [
                *head,
                "[Unit]",
                f"Description={unit.what}",
                "Wants=network-online.target",
                "After=network-online.target",
                "",
                *service,
            ]
        )
        + "\n"
        + HARDENING
        + "\n[Install]\nWantedBy=multi-user.target\n"
    )


def unit_files() -> dict[str, str]:
    """File name -> content, for deploy/systemd/."""
    return {f"{u.name}.service": unit_text(u) for u in UNITS}
