"""Flags, checks and help come from the settings structs (hpcbus.options): every command's settings are checked
where they are read, and a mistake stops the command with exit 2 and one line naming key, source and choices."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import msgspec
import pytest

from hpcbus import cli
from hpcbus.consumers.influx.command import influx_settings
from hpcbus.influx.settings import INFLUX
from hpcbus.options import (
    Section,
    SettingsError,
    add_section_arguments,
    field_docs,
    flags_of,
    literal_values,
    read_section,
)

CONFIGURED = {
    ("produce", "node"): ["--once"],
    ("produce", "slurm"): ["--once"],
    ("produce", "ocs"): ["--once", "--accounting", "/nonexistent"],
    ("consume", "influx"): [],
    ("consume", "sonar"): [],
    ("deadletter",): ["list"],
    ("pub",): ["x.metrics", "body"],
    ("deploy", "grafana"): ["--output", "/nonexistent"],
    ("deploy", "influx-retention"): ["--dry-run"],
    ("deploy", "nats-auth"): [],
    ("gateway",): [],
    ("consume", "ingest"): [],
    ("report",): ["--job", "1"],
    ("simulate",): [],
    ("consume", "jobs"): [],
    ("status",): [],
    ("tail",): ["x.metrics"],
}
"""Every command that reads a config file, with what else it needs on the command line."""

MISSPELT_ENUM = {
    ("produce", "node"): (
        "[node]\njob_events = 'slrum'\n",
        "[node] job_events = 'slrum' is not one of 'slurm', 'all', 'none'",
    ),
    ("consume", "influx"): (
        "[influx]\nprocesses = 'ful'\n",
        "[influx] processes = 'ful' is not one of 'aggregate', 'full'",
    ),
    ("consume", "sonar"): (
        "[sonar]\non_stop = 'drop'\n",
        "[sonar] on_stop = 'drop' is not one of 'return', 'flush'",
    ),
    ("consume", "jobs"): (
        "[delivery]\nmode = 'cor'\n",
        "[delivery] mode = 'cor' is not one of 'jetstream', 'core'",
    ),
}
"""Commands with choice settings: a misspelt value in the file."""

MISSPELT_KEY = {
    ("produce", "node"): (
        "[node_agent]\nintervall = 5\n",
        "[node_agent] unknown field `intervall` (did you mean `interval`?)",
    ),
    ("produce", "slurm"): (
        "[slurm]\nlookbak = 60\n",
        "[slurm] unknown field `lookbak` (did you mean `lookback`?)",
    ),
    ("produce", "ocs"): (
        "[ocs]\nacounting = 'x'\n",
        "[ocs] unknown field `acounting` (did you mean `accounting`?)",
    ),
    ("consume", "influx"): ("[influx]\ndatabase = 'x'\n", "[influx] unknown field `database`"),
    ("consume", "sonar"): (
        "[delivery]\nack_wiat = 5\n",
        "[delivery] unknown field `ack_wiat` (did you mean `ack_wait`?)",
    ),
    ("deadletter",): ("[bus]\nserver = 'x'\n", "[bus] unknown field `server`"),
    ("pub",): ("[bus]\nclustr = 'x'\n", "[bus] unknown field `clustr` (did you mean `cluster`?)"),
    ("deploy", "grafana"): (
        "[grafana]\noutptu = 'x'\n",
        "[grafana] unknown field `outptu` (did you mean `output`?)",
    ),
    ("deploy", "influx-retention"): (
        "[retention]\nraw_durations = '1d'\n",
        "[retention] unknown field `raw_durations` (did you mean `raw_duration`?)",
    ),
    ("deploy", "nats-auth"): (
        "[bus]\nclustr = 'x'\n",
        "[bus] unknown field `clustr` (did you mean `cluster`?)",
    ),
    ("gateway",): ("[gateway]\nlisen = 'x'\n", "[gateway] unknown field `lisen` (did you mean `listen`?)"),
    ("consume", "ingest"): (
        "[ingest]\nack_wiat = 5\n",
        "[ingest] unknown field `ack_wiat` (did you mean `ack_wait`?)",
    ),
    ("consume", "jobs"): ("[jobs]\ngrase = 5\n", "[jobs] unknown field `grase` (did you mean `grace`?)"),
    ("simulate",): ("[simulate]\nnode = 5\n", "[simulate] unknown field `node` (did you mean `nodes`?)"),
    ("report",): (
        "[report]\nmax_point = 5\n",
        "[report] unknown field `max_point` (did you mean `max_points`?)",
    ),
    ("status",): (
        "[status]\nstaled_after = 5\n",
        "[status] unknown field `staled_after` (did you mean `stalled_after`?)",
    ),
    ("tail",): ("[bus]\nclustr = 'x'\n", "[bus] unknown field `clustr` (did you mean `cluster`?)"),
}


def _run(words: tuple[str, ...], toml: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    conf = tmp_path / "config.toml"
    conf.write_text(toml)
    module = __import__(cli.COMMANDS[words], fromlist=["x"])
    bus = ["--cluster", "x"] if any(s.table == "bus" for s in cli.sections_of(module)) else []
    rc = cli.main([*words, *bus, "--config", str(conf), *CONFIGURED[words]])
    err = capsys.readouterr().err
    assert rc == 2, err
    (line,) = [ln for ln in err.splitlines() if "ERROR" in ln]
    return line


def test_every_command_with_a_config_is_covered() -> None:
    with_config = {
        words for words, name in cli.COMMANDS.items() if cli.sections_of(__import__(name, fromlist=["x"]))
    }
    assert with_config == set(CONFIGURED)
    assert set(MISSPELT_ENUM) | set(MISSPELT_KEY) <= with_config and set(MISSPELT_KEY) == with_config


@pytest.mark.parametrize("words", sorted(cli.COMMANDS), ids=" ".join)
def test_help(words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.build_parser().parse_args([*words, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    module = __import__(cli.COMMANDS[words], fromlist=["x"])
    for section in cli.sections_of(module):  # every setting has its flag, documented by its docstring
        for f in msgspec.inspect.type_info(section.struct).fields:  # type: ignore[attr-defined]
            if isinstance(f.type, msgspec.inspect.StructType):  # a nested table ([node.jobs]): no flag
                continue
            if not flags_of(section, f.name):  # a key the command accepts in a shared file but ignores
                continue
            assert flags_of(section, f.name)[0] in out, (words, f.name)
            assert field_docs(section.struct)[f.name].split()[0] in out


@pytest.mark.parametrize("words", sorted(MISSPELT_ENUM), ids=" ".join)
def test_misspelt_choice_is_named(
    words: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, message = MISSPELT_ENUM[words]
    assert _run(words, toml, tmp_path, capsys).endswith(f"{tmp_path / 'config.toml'}: {message}")


@pytest.mark.parametrize("words", sorted(MISSPELT_KEY), ids=" ".join)
def test_unknown_key_is_named(
    words: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    toml, message = MISSPELT_KEY[words]
    assert f"{tmp_path / 'config.toml'}: {message}" in _run(words, toml, tmp_path, capsys)


@pytest.mark.parametrize("words", sorted(CONFIGURED), ids=" ".join)
def test_unknown_table_is_named(
    words: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _run(words, "[bus]\ncluster = 'x'\n[influxdb]\nurl = 'x'\n", tmp_path, capsys)
    module = __import__(cli.COMMANDS[words], fromlist=["x"])
    own = ", ".join(f"[{s.table}]" for s in cli.sections_of(module) if s.table)  # flags-only sections: none
    assert (
        f"{tmp_path / 'config.toml'}: unknown table [influxdb] (did you mean [influx]?); hpcbus {' '.join(words)} reads {own}"
        in line
    )


def test_tables_of_other_commands_are_allowed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One file serves every service of a host: `produce ocs` does not trip over `[influx]`."""
    conf = tmp_path / "hpcbus.toml"
    conf.write_text("[influx]\nprocesses = 'ful'\n[ocs]\naccounting = '/nonexistent'\n")
    assert cli.main(["produce", "ocs", "--cluster", "x", "--config", str(conf), "--once"]) == 2
    err = capsys.readouterr().err
    assert "/nonexistent: no such file" in err and "processes" not in err


def test_key_outside_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    line = _run(("consume", "influx"), "cluster = 'x'\n", tmp_path, capsys)
    assert "`cluster` is outside any table; hpcbus consume influx reads [bus], [influx], [delivery]" in line


def test_bad_flag_choice_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli.main(["consume", "influx", "--processes", "ful"])
    assert exc.value.code == 2
    assert "invalid choice: 'ful' (choose from 'aggregate', 'full')" in capsys.readouterr().err


def test_constraint_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["consume", "sonar", "--cluster", "x", "--grace", "-1"]) == 2
    assert "--grace: [sonar] grace = -1.0: expected `float` >= 0.0" in capsys.readouterr().err


# --- the generator on a struct of its own --------------------------------------------------------------------


class Demo(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    colour: Literal["red", "green"] = "red"
    """Which colour (a choice)."""
    size: int = 3
    """How many, 100% sure."""
    names: list[str] = msgspec.field(default_factory=lambda: ["a"])
    """Comma-separated on the command line."""
    loud: bool = False
    """Shout."""
    secret: str = ""
    """From the environment."""


DEMO = Section("demo", Demo, env={"secret": "DEMO_SECRET", "size": "DEMO_SIZE"}, flags={"secret": ("--pw",)})


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--config")
    add_section_arguments(p, DEMO)
    return p


def test_docstrings_and_literals_are_read() -> None:
    assert field_docs(Demo)["size"] == "How many, 100% sure."
    assert literal_values(Demo, "colour") == ("red", "green")
    assert literal_values(Demo, "size") is None
    help_text = _parser().format_help()  # a % in a docstring does not break argparse
    assert "100% sure" in help_text and "--loud, --no-loud" in help_text and "{red,green}" in help_text


def test_precedence_flag_environment_file(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text('[demo]\ncolour = "green"\nsize = 5\nnames = "x, y"\nsecret = "file"\n')
    env = {"DEMO_SECRET": "env", "DEMO_SIZE": "7"}
    s = read_section(_parser().parse_args(["--config", str(conf), "--loud"]), DEMO, env)
    assert s == Demo(colour="green", size=7, names=["x", "y"], loud=True, secret="env")
    s = read_section(
        _parser().parse_args(["--config", str(conf), "--pw", "flag", "--names", "p,q"]), DEMO, env
    )
    assert (s.secret, s.names) == ("flag", ["p", "q"])
    assert read_section(_parser().parse_args([]), DEMO, {}) == Demo()


def test_environment_errors_name_the_variable() -> None:
    with pytest.raises(SettingsError, match=r"^DEMO_SIZE: \[demo\] size = 'many': "):
        read_section(_parser().parse_args([]), DEMO, {"DEMO_SIZE": "many"})


def test_wrong_type_in_file(tmp_path: Path) -> None:
    conf = tmp_path / "c.toml"
    conf.write_text("[demo]\nsize = 'big'\n")
    with pytest.raises(SettingsError, match=r"c.toml: \[demo\] size = 'big': expected `int`, got `str`$"):
        read_section(_parser().parse_args(["--config", str(conf)]), DEMO, {})


def test_influx_environment_and_renamed_flags() -> None:
    p = argparse.ArgumentParser()
    add_section_arguments(p, INFLUX)
    args = p.parse_args(["--influx-user", "u", "--no-gzip", "--influx-api", "v2"])
    s = influx_settings(args, {"INFLUX_TOKEN": "t", "INFLUX_URL": "http://i:8086"})
    assert (s.username, s.gzip, s.api, s.token, s.url) == ("u", False, "v2", "t", "http://i:8086")


@pytest.mark.parametrize("check", [True, False], ids=["check-config", "run"])
def test_a_missing_seed_or_certificate_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], check: bool
) -> None:
    """Issue 33 item 2: `--nkey /nonexistent.nk` was a traceback and exit 1, which the units restart every
    5 s, and `--check-config` passed it; so were a missing TLS file and a missing accounting file."""
    first = ["--check-config"] if check else []
    for argv, flag in (
        (["produce", "node", "--nkey", str(tmp_path / "none.nk")], "--nkey"),
        (["consume", "influx", "--tls-ca", str(tmp_path / "ca.pem")], "--tlsca"),
        (["produce", "ocs", "--accounting", str(tmp_path / "accounting")], "--accounting"),
        (["gateway", "--http-cert", str(tmp_path)], "--http-cert"),
    ):
        code = cli.main([*first, *argv, "--cluster", "x", "--nats", "nats://127.0.0.1:1"])
        err = capsys.readouterr().err
        assert code == 2 and f"{flag} {tmp_path}" in err and "Traceback" not in err, (argv, err)
        assert "no such file" in err or "not a file" in err, err


def test_check_config_reads_every_table_of_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 33 item 2: a typo in a table of another service of the host (`[jobs]` checked with `produce
    node`) passed `--check-config`; the file is one host's, so every table is checked."""
    config = tmp_path / "hpcbus.toml"
    config.write_text('[jobs]\ncolour = "green"\n')
    assert cli.main(["--check-config", "produce", "node", "--cluster", "x", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "[jobs]" in err and "colour" in err and "Traceback" not in err, err
    config.write_text("[jobs]\ngrace = 30.0\n")
    assert cli.main(["--check-config", "produce", "node", "--cluster", "x", "--config", str(config)]) == 0
