"""Settings every bus-connected subcommand shares. Precedence: flag > environment > TOML file > default.

Names follow the `nats` CLI (`--server` is accepted as `--nats`), so admins reuse what they know.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import msgspec

T = TypeVar("T", bound=msgspec.Struct)


class BusSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where the NATS bus is and who we are on it."""

    nats: list[str] = msgspec.field(default_factory=lambda: ["nats://127.0.0.1:4222"])
    """NATS servers (NATS_URL, comma-separated)."""
    creds: str = ""
    """NATS credentials file (NATS_CREDS)."""
    user: str = ""
    """NATS user name (NATS_USER)."""
    password: str = ""
    """NATS password (NATS_PASSWORD)."""
    tlscert: str = ""
    """TLS client certificate (NATS_CERT)."""
    tlskey: str = ""
    """TLS client key (NATS_KEY)."""
    tlsca: str = ""
    """TLS CA to verify the server (NATS_CA)."""
    cluster: str = ""
    """Cluster name, the first part of every subject; may contain dots (HPCBUS_CLUSTER)."""


_ENV = {
    "nats": "NATS_URL",
    "creds": "NATS_CREDS",
    "user": "NATS_USER",
    "password": "NATS_PASSWORD",
    "tlscert": "NATS_CERT",
    "tlskey": "NATS_KEY",
    "tlsca": "NATS_CA",
    "cluster": "HPCBUS_CLUSTER",
}


class SettingsError(ValueError):
    """A configuration mistake, named by its option; reported once at start-up."""


def add_bus_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("bus")
    g.add_argument("--config", metavar="FILE", help="TOML file with the same keys as the flags")
    g.add_argument(
        "--nats", "--server", "-s", dest="nats", metavar="URL", help="NATS server URL(s), comma-separated"
    )
    g.add_argument("--creds", metavar="FILE", help="NATS credentials file")
    g.add_argument("--user", metavar="NAME", help="NATS user")
    g.add_argument("--password", metavar="SECRET", help="NATS password")
    g.add_argument("--tlscert", metavar="FILE", help="TLS client certificate")
    g.add_argument("--tlskey", metavar="FILE", help="TLS client key")
    g.add_argument("--tlsca", metavar="FILE", help="TLS CA certificate")
    g.add_argument("--cluster", metavar="NAME", help="cluster name (first part of every subject)")


def _split_servers(value: str) -> list[str]:
    return [s.strip() for s in value.split(",") if s.strip()]


def load_table(path: str | None, section: str = "bus") -> dict[str, object]:
    """The `[section]` table of a TOML config file (or {} without a file)."""
    if not path:
        return {}
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"--config {path}: {exc}") from None
    table = data.get(section, {})
    if not isinstance(table, dict):
        raise SettingsError(f"--config {path}: [{section}] must be a table")
    return table


def bus_settings(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> BusSettings:
    return section_settings(
        args, "bus", BusSettings, environ_vars=_ENV, environ=environ, comma_lists=("nats",)
    )


def nats_connect_options(s: BusSettings) -> dict[str, object]:
    """Keyword arguments for `nats.connect` that follow from the settings (TLS, auth)."""
    opts: dict[str, object] = {"servers": s.nats}
    if s.creds:
        opts["user_credentials"] = s.creds
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
    comma_lists: Iterable[str] = (),
) -> T:
    """A command's own settings: the `[section]` table of `--config`, then environment variables
    (`environ_vars`: field -> variable), then the flags that were given (attributes of `args` named like the
    fields, or only those in `flags`). Fields in `comma_lists` may be given as `a, b` strings (`NATS_URL`).
    Unknown keys and wrong types stop the command, naming the key."""
    values: dict[str, object] = dict(load_table(getattr(args, "config", None), section))
    env = os.environ if environ is None else environ
    for field, var in (environ_vars or {}).items():
        if env.get(var):
            values[field] = env[var]
    for name in struct.__struct_fields__ if flags is None else flags:
        flag = getattr(args, name, None)
        if flag is not None:
            values[name] = flag
    for name in comma_lists:
        if isinstance(values.get(name), str):
            values[name] = _split_servers(str(values[name]))
    try:
        return msgspec.convert(values, struct)
    except msgspec.ValidationError as exc:
        raise SettingsError(f"[{section}] settings: {exc}") from None


def add_stream_arguments(parser: argparse.ArgumentParser) -> None:
    """The JetStream stream's limits, for commands that create it when it is missing."""
    g = parser.add_argument_group("stream (when this command creates it)")
    g.add_argument(
        "--stream-max-age", type=float, metavar="S", help="seconds the stream keeps messages (7 days)"
    )
    g.add_argument("--stream-max-bytes", type=int, metavar="BYTES", help="bytes the stream keeps (1 GiB)")


def stream_overrides(max_age: float | None, max_bytes: int | None) -> dict[str, object]:
    """`telemetry_stream` keyword arguments for the limits a user set (0 or None: the default)."""
    overrides: dict[str, object] = {}
    if max_age:
        overrides["max_age"] = max_age
    if max_bytes:
        overrides["max_bytes"] = max_bytes
    return overrides
