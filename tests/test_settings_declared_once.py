"""Each setting is declared once: the stream limits in `hpcbus.settings.PublisherSettings`, the outbox keys in
`hpcbus.outbox.OutboxSettings`, and every command that takes them checks them alike. Every producer's
`--once` runs on the source runtime's `hpcbus.sources.once`."""

from __future__ import annotations

import importlib
import inspect
import sys
import typing
from pathlib import Path

import msgspec
import pytest

from hpcbus import cli, keys
from hpcbus.options import Section, _own_field_docs, fields, read_section
from hpcbus.outbox import OutboxSettings
from hpcbus.producers.slurm.settings import SLURM_OUTBOX
from hpcbus.schemas.lineprotocol import parse_payload
from tests.test_node_producer import tree
from tests.test_ocs_producer import COLON_FILE

SHARED = {
    "stream_max_age": "hpcbus.settings.PublisherSettings",
    "stream_max_bytes": "hpcbus.settings.PublisherSettings",
    "spill_dir": "hpcbus.outbox.OutboxSettings",
    "max_messages": "hpcbus.outbox.OutboxSettings",
}
"""Keys several commands read -> the one struct that declares them."""


def _declared(struct: type, out: dict[str, set[str]]) -> None:
    """field -> the structs whose own body declares it, over `struct`, its bases and its nested tables."""
    for base in struct.__mro__:
        if isinstance(base, type) and issubclass(base, msgspec.Struct) and base is not msgspec.Struct:
            for name in inspect.get_annotations(base):
                out.setdefault(name, set()).add(f"{base.__module__}.{base.__qualname__}")
    for f in fields(struct):
        t = f.type
        if isinstance(t, msgspec.inspect.StructType):
            _declared(t.cls, out)


def _sections() -> list[Section]:
    """Every section of every command (its tables and flags-only sections)."""
    out: list[Section] = []
    for module_name in cli.COMMANDS.values():
        module = importlib.import_module(module_name)
        out += [*cli.sections_of(module), *(v for v in vars(module).values() if isinstance(v, Section))]
    return out


def test_shared_keys_are_declared_once() -> None:
    declared: dict[str, set[str]] = {}
    for section in _sections():
        _declared(section.struct, declared)
    assert {key: declared[key] for key in SHARED} == {key: {home} for key, home in SHARED.items()}


HOMONYMS = {
    "interval": "a producer's sampling or polling period, the jobs worker's assumed sample interval",
    "timeout": "status' and the InfluxDB client's request timeout, sacct's command timeout",
    "nodes": "the compute nodes of `deploy nats-auth` (identities), the simulated nodes' count",
    "password": "the NATS password ([bus]), the InfluxDB password ([influx])",
    "processes": "the InfluxDB writer's process-line mode, the node collector's process reading",
    "state": "where the jobs worker, `produce slurm` and `produce ocs` keep their state (each its own)",
    "state_file": "the state file of the jobs worker, `produce slurm` and `produce ocs`, each its own format",
    "grace": "the jobs worker's wait after a job's end, the Sonar worker's wait for an envelope's lines",
    "max_jobs": "open jobs of the jobs worker, jobs the OCS merger remembers",
    "stop_timeout": "a job without its stop (jobs worker), the node agent's flush at SIGTERM",
}
"""The same word for different things in different commands' tables: not one setting declared twice."""


def _hints(struct: type) -> dict[str, object]:
    return typing.get_type_hints(struct, include_extras=True)


def test_every_key_several_structs_have_is_declared_once() -> None:
    """Issue 30: a key that several settings structs carry is one declaration (`hpcbus.keys`: type, bounds,
    default, words) that each names, or a homonym listed above; a struct that declares it again (its own
    bounds, default or docstring: `max_future` was declared three times, two of them without `ge=0`) fails."""
    owners: dict[str, dict[str, type]] = {}
    for section in _sections():
        for f in fields(section.struct):
            for base in section.struct.__mro__:
                if isinstance(base, type) and f.name in inspect.get_annotations(base):
                    owners.setdefault(f.name, {})[f"{base.__module__}.{base.__qualname__}"] = base
                    break
    several = {name: structs for name, structs in owners.items() if len(structs) > 1}
    unlisted = sorted(set(several) - set(keys.SHARED) - set(HOMONYMS))
    assert not unlisted, f"declared in several structs: {[(n, sorted(several[n])) for n in unlisted]}"
    for name, structs in several.items():
        if name not in keys.SHARED:
            continue
        alias, default = keys.SHARED[name]
        for where, struct in structs.items():
            assert _hints(struct)[name] == alias, f"{where}.{name}: not declared as hpcbus.keys says"
            assert name not in _own_field_docs(struct), f"{where}.{name}: words of its own"
            assert getattr(struct(), name) == default, f"{where}.{name}: another default"
    assert set(keys.SHARED) <= set(several)  # each shared key is still shared
    assert set(HOMONYMS) <= set(several)  # each listed homonym still is one


def test_the_declared_once_check_finds_a_second_declaration() -> None:
    """The check above fails on a key declared again: a struct with its own `max_future`."""

    class Again(msgspec.Struct, kw_only=True):
        max_future: int = 86_400
        """Seconds ahead (a second declaration)."""

    assert _hints(Again)["max_future"] != keys.SHARED["max_future"][0]
    assert "max_future" in _own_field_docs(Again)


PUBLISHERS = [
    ["produce", "node"],
    ["produce", "slurm"],
    ["produce", "ocs", "--accounting", __file__],  # a file that exists: --check-config opens it now
    ["gateway"],
    ["simulate"],
]


@pytest.mark.parametrize("argv", PUBLISHERS, ids=lambda a: " ".join(a[:2]))
@pytest.mark.parametrize("flag", ["--stream-max-age", "--stream-max-bytes"])
def test_every_publisher_checks_the_stream_limits(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """One declaration, one check: `produce ocs` took a negative limit before, and `--check-config` of the
    gateway and `simulate` did not read their stream flags."""
    assert cli.main(["--check-config", *argv, "--cluster", "x", flag, "-1"]) == 2
    err = capsys.readouterr().err
    key = flag[2:].replace("-", "_")
    assert f"{flag}: " in err and f"{key} = -1" in err and ">= 0" in err and "Traceback" not in err
    assert cli.main(["--check-config", *argv, "--cluster", "x", flag, "0"]) == 0


def test_slurm_outbox_keys_are_the_outbox_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`produce slurm` reads `[slurm_outbox]` (`OutboxSettings`); the keys in `[slurm]`, where they were
    declared a second time, stop it with the table they belong in."""
    moved = tmp_path / "old.toml"
    moved.write_text('[slurm]\nspill_dir = "/var/spool/hpcbus/slurm"\n')
    assert cli.main(["--check-config", "produce", "slurm", "--cluster", "x", "--config", str(moved)]) == 2
    assert "[slurm] spill_dir: `spill_dir` belongs in [slurm_outbox], not [slurm]" in capsys.readouterr().err

    config = tmp_path / "hpcbus.toml"
    config.write_text('[slurm_outbox]\nspill_dir = "/var/spool/hpcbus/slurm"\nmax_messages = 50\n')
    argv = ["produce", "slurm", "--cluster", "x", "--config", str(config)]
    assert cli.main(["--check-config", *argv]) == 0
    args = cli.build_parser().parse_args([*argv, "--publish-timeout", "2"])
    assert read_section(args, SLURM_OUTBOX) == OutboxSettings(
        spill_dir="/var/spool/hpcbus/slurm", max_messages=50, publish_timeout=2.0
    )


def test_ocs_once_polls_until_the_end_of_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    """The runtime's `once` polls a source again while it has more at hand: chunks of one line give the
    rows of one big chunk."""
    argv = [
        "produce",
        "ocs",
        "--once",
        "--no-start-jobs",
        "--cluster",
        "fox",
        "--accounting",
        str(COLON_FILE),
    ]
    assert cli.main(argv) == 0
    whole = capsys.readouterr().out
    assert cli.main([*argv, "--max-chunk-bytes", "1"]) == 0
    chunked = capsys.readouterr().out
    stops = [row for row in whole.splitlines() if row.startswith("fox.events.job\t")]
    assert len(stops) > 1
    assert sorted(row for row in chunked.splitlines() if row.startswith("fox.events.job\t")) == sorted(stops)


def test_ocs_once_starts_where_the_service_would(capsys: pytest.CaptureFixture[str]) -> None:
    """`--once` is the service's source: without a state, `--from-end` skips the history there too."""
    argv = ["produce", "ocs", "--once", "--cluster", "fox", "--accounting", str(COLON_FILE), "--from-end"]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out == ""


def test_node_once_prints_the_sample_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`produce node --once` is the agent's first poll through the runtime's `once`: the sample's lines, but
    neither the start-up sysinfo nor backlog lines (there is no outbox)."""
    root = tree(tmp_path, "hpc")
    argv = ["produce", "node", "--once", "--root", str(root), "--settle", "0.05"]
    assert cli.main(argv) == 0
    names = {line.measurement for line in parse_payload(capsys.readouterr().out, now=0).lines}
    assert {"sample", "mem_used", "hpcbus_collect_seconds"} <= names
    assert not {"hpcbus_outbox_messages", "hpcbus_outbox_dropped", "sysinfo"} & names


def test_read_section_has_the_type_of_its_section(tmp_path: Path) -> None:
    """`Section` is generic over its struct: mypy knows what `read_section` returns without an annotation,
    and a wrong attribute is an error (with an untyped section it was `Any`, and nothing was checked)."""
    from mypy import api

    code = tmp_path / "typed.py"
    code.write_text(
        "import argparse, msgspec\n"
        "from hpcbus.options import Section, read_section\n"
        "class Limits(msgspec.Struct):\n"
        "    most: int = 1\n"
        "LIMITS = Section('limits', Limits)\n"
        "reveal_type(read_section(argparse.Namespace(), LIMITS))\n"
        "read_section(argparse.Namespace(), LIMITS).fewest\n"
    )
    limit = sys.getrecursionlimit()
    try:  # mypy raises the interpreter's recursion limit for good; later tests rely on the default
        out, _, _ = api.run(
            [str(code), "--no-incremental", "--follow-imports=silent", "--ignore-missing-imports"]
        )
    finally:
        sys.setrecursionlimit(limit)
    assert 'Revealed type is "typed.Limits"' in out
    assert '"Limits" has no attribute "fewest"' in out
