"""The one `hpcbus` command. Each subcommand lives in the folder named by its words and exposes
`HELP`, `add_arguments(parser)` and `run(args) -> int`; this file only lists them. A command that reads a
config file lists its tables as `SECTIONS` (`hpcbus.options.Section`; `USES_BUS` alone means `[bus]`), and
may list flags-only sections there too (the stream limits): the file's tables, every key in them and every
listed section's flags and environment are checked before the command runs (and by `--check-config`).

Modules are imported only to build their own parser, so each keeps heavy imports inside `run`.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import logging
import sys
from collections.abc import Iterator, Sequence

from hpcbus import __version__
from hpcbus.logs import setup_logging
from hpcbus.options import (
    Section,
    add_section_arguments,
    check_every_table,
    check_files,
    check_places,
    check_tables,
    read_section,
)
from hpcbus.settings import BUS, SettingsError, add_config_argument

# (words) -> module. A newcomer finds `hpcbus produce node` in producers/node/.
COMMANDS: dict[tuple[str, ...], str] = {
    ("run",): "hpcbus.commands.run",
    ("validate",): "hpcbus.commands.validate",
    ("translate",): "hpcbus.commands.translate",
    ("produce", "node"): "hpcbus.producers.node.command",
    ("produce", "ocs"): "hpcbus.producers.ocs.command",
    ("consume", "influx"): "hpcbus.consumers.influx.command",
    ("consume", "sonar"): "hpcbus.consumers.sonar.command",
    ("deadletter",): "hpcbus.consumers.deadletter.command",
    ("pub",): "hpcbus.producers.pub.command",
    ("produce", "slurm"): "hpcbus.producers.slurm.command",
    ("gateway",): "hpcbus.producers.gateway.command",
    ("consume", "jobs"): "hpcbus.consumers.jobs.command",
    ("report",): "hpcbus.consumers.report.command",
    ("simulate",): "hpcbus.producers.simulate.command",
    ("consume", "ingest"): "hpcbus.consumers.ingest.command",
    ("status",): "hpcbus.commands.status.command",
    ("tail",): "hpcbus.commands.tail.command",
    ("deploy", "nats-auth"): "hpcbus.commands.deploy.nats_auth",
    ("deploy", "grafana"): "hpcbus.commands.deploy.grafana",
    ("deploy", "influx-retention"): "hpcbus.commands.deploy.influx_retention",
    ("deploy", "influxdb"): "hpcbus.commands.deploy.influxdb",
}

WITHOUT_WEBSOCKETS = {("produce", "node")}
"""Commands that run on every compute node. nats-py loads aiohttp, if installed, for its optional websocket
transport: about 10 MB of the node agent's resident memory that it never uses (it connects with nats:// or
tls://, and refuses ws:// URLs). These commands start with nats-py imported without it."""

EXTRAS = {
    "aiohttp": "workers",
    "influxdb_client": "workers",
    "grafana_foundation_sdk": "master",
}
"""Top-level module -> the pyproject extra that installs it. A compute node installs hpcbus alone (the node
agent's needs); a command that needs more stops with a line naming the extra (exit 2, like a configuration
mistake: systemd does not restart it) instead of a traceback. tests/test_dist.py checks this against
pyproject.toml."""

NEEDS_EXTRA: dict[tuple[str, ...], str] = {
    ("consume", "influx"): "workers",
    ("consume", "jobs"): "workers",
    ("gateway",): "workers",
    ("report",): "workers",
    ("deploy", "grafana"): "master",
    ("deploy", "influx-retention"): "master",
}
"""The extra each command needs (none for the others). Commands import their extras late, inside `run`, so
`--check-config` (which never calls `run`) looks them up here; the message names this extra even when the
first missing module belongs to a smaller one (`deploy grafana` imports the Grafana SDK late).
tests/test_dist.py checks it against the imports each command's code reaches."""

EXTRA_INCLUDES = {"master": ("workers",)}
"""pyproject.toml: `hpcbus[master]` installs `hpcbus[workers]`."""


OPTION_EXTRAS: dict[tuple[str, ...], str] = {("status",): "workers"}
"""Commands that need an extra for an option only (`status --influx` asks InfluxDB through aiohttp): they run
without it, so `--check-config` does not ask for it; the option's late import names the extra if missing."""


def check_extras(words: tuple[str, ...]) -> None:
    """Raise ModuleNotFoundError for the first module of the command's extra that is not installed, as its
    late import would: `--check-config` then fails on a host missing the extra, like the command itself."""
    extra = NEEDS_EXTRA.get(words)
    if extra is None:
        return
    wanted = {extra, *EXTRA_INCLUDES.get(extra, ())}
    for module, of in EXTRAS.items():
        if of in wanted and importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)


GROUP_HELP = {
    "produce": "publish measurements of this node or of the batch system",
    "consume": "workers that read the bus and write elsewhere",
    "deploy": "write configuration for the services around hpcbus (NATS, Grafana, InfluxDB)",
}


def sections_of(module: object) -> tuple[Section, ...]:
    """The tables a command reads."""
    default = (BUS,) if getattr(module, "USES_BUS", False) else ()
    return tuple(getattr(module, "SECTIONS", default))


def every_section() -> list[Section]:
    """The sections of every command (one config file may serve all the services of a host)."""
    return [s for name in COMMANDS.values() for s in sections_of(importlib.import_module(name))]


def known_tables() -> set[str]:
    """Every table some command reads: one config file may serve all the services of a host."""
    return {
        s.table for name in COMMANDS.values() for s in sections_of(importlib.import_module(name)) if s.table
    }


def check_settings(args: argparse.Namespace) -> None:
    """Stop on a config file table no command reads, and read every section once so that a bad key or
    value stops the command before it does anything."""
    sections: tuple[Section, ...] = getattr(args, "_sections", ())
    if not sections:
        return
    tables = [s.table for s in sections if s.table]
    check_tables(getattr(args, "config", None), f"hpcbus {args._words}", tables, known_tables())
    check_places(getattr(args, "config", None), sections)
    if getattr(args, "check_config", False):
        check_every_table(getattr(args, "config", None), every_section())
    for section in sections:
        settings = read_section(args, section)
        check_files(section, settings)
        if (
            section.table == BUS.table
        ):  # a URL nats-py would misread or choke on is a settings mistake, said now
            from hpcbus.connection import check_urls

            check_urls(settings.nats)


class _Version(argparse.Action):
    """`--version`: the version and the path the hot paths run on (`hpcbus 0.1.0 (compiled: lineprotocol
    scan, ...)` or `(pure Python)`: the C extensions are optional, `schemas.native`). The codec is imported only when asked, so
    building the parser stays light."""

    def __init__(
        self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None
    ) -> None:
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        from hpcbus.schemas.native import implementation

        print(f"hpcbus {__version__} ({implementation()})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hpcbus", description="Telemetry bus for HPC clusters.")
    parser.add_argument("--version", action=_Version, help="print the version and the path in use, then exit")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    parser.add_argument(
        "--check-config",
        action="store_true",
        help="read the command's config file, environment and flags, stop on a mistake (exit 2) and exit 0 "
        "without running the command: checks a unit's command line before it is started",
    )
    top = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    groups: dict[str, argparse._SubParsersAction] = {}
    for words, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        if len(words) == 1:
            sub = top.add_parser(words[0], help=module.HELP, description=module.HELP)
        else:
            group = groups.get(words[0])
            if group is None:
                gp = top.add_parser(words[0], help=GROUP_HELP.get(words[0], ""))
                group = gp.add_subparsers(dest="subcommand", metavar="KIND", required=True)
                groups[words[0]] = group
            sub = group.add_parser(words[1], help=module.HELP, description=module.HELP)
        if getattr(module, "USES_BUS", False):  # its `[bus]` section: BUS, or one with fewer flags
            bus = next((s for s in sections_of(module) if s.table == BUS.table), BUS)
            add_config_argument(add_section_arguments(sub, bus))
        elif any(s.table for s in sections_of(module)):
            add_config_argument(sub)
        module.add_arguments(sub)
        sub.set_defaults(
            _run=module.run,
            _check=getattr(module, "check", None),
            _sections=sections_of(module),
            _words=" ".join(words),
        )
    return parser


@contextlib.contextmanager
def _hidden(module: str) -> Iterator[None]:
    """While inside, `import <module>` fails as if it were not installed (a None entry in `sys.modules`
    is how Python spells that); afterwards it imports normally again."""
    hide = module not in sys.modules
    if hide:
        sys.modules[module] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        if hide:
            del sys.modules[module]


def command_words(argv: Sequence[str]) -> tuple[str, ...]:
    """The words naming the command (`produce node`): the first non-option arguments (the options before
    the command, -v and --version, take no value)."""
    return tuple(a for a in argv if not a.startswith("-"))[:2]


def missing_extra(exc: ModuleNotFoundError, words: tuple[str, ...]) -> str | None:
    """The one-line message for an import of an extra that is not installed; None for any other missing
    module (a broken install: the traceback is the useful report then)."""
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    extra = NEEDS_EXTRA.get(words, extra)
    return (
        f"hpcbus {' '.join(words)} needs the `{extra}` extra ({top} is not installed): "
        f"pip install 'hpcbus[{extra}]' (from a wheelhouse: --no-index --find-links <dir>; docs/deploy.md)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if command_words(argv) in WITHOUT_WEBSOCKETS and "nats" not in sys.modules:
        with _hidden("aiohttp"):
            importlib.import_module("nats.aio.client")
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        check_settings(args)
        if args.check_config:
            check_extras(tuple(args._words.split()))
            if args._check is not None:  # a command's own start-up checks beyond its tables (it never runs)
                args._check(args)
            return 0
        return int(args._run(args))
    except ModuleNotFoundError as exc:
        message = missing_extra(exc, tuple(args._words.split()))
        if message is None:
            raise
        logging.getLogger("hpcbus").error("%s", message)
        return 2
    except SettingsError as exc:  # a configuration mistake: one line naming the option, exit 2
        logging.getLogger("hpcbus").error("%s", exc)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
