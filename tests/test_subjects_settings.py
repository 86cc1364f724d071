"""Subject tree (dotted cluster names) and the shared bus settings (flag > environment > TOML > default)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hpcbus.schemas import subjects
from hpcbus.settings import SettingsError, add_bus_arguments, bus_settings, nats_connect_options


@pytest.mark.parametrize(
    ("subject", "cluster", "category", "detail"),
    [
        ("fox.educloud.no.metrics", "fox.educloud.no", "metrics", ""),
        ("fox.educloud.no.events.job", "fox.educloud.no", "events", "job"),
        ("alex.log.ccb", "alex", "log", "ccb"),
        ("alex.control.put", "alex", "control", "put"),
        ("fox.educloud.no.sonar.sample", "fox.educloud.no", "sonar", "sample"),
        ("metrics.metrics", "metrics", "metrics", ""),
    ],
)
def test_parse_reads_from_the_right(subject: str, cluster: str, category: str, detail: str) -> None:
    parsed = subjects.parse(subject)
    assert (parsed.cluster, parsed.category, parsed.detail) == (cluster, category, detail)
    assert str(parsed) == subject


@pytest.mark.parametrize(
    "bad",
    ["metrics", "fox.control.delete", "fox.sonar.jobs2", "fox.events", ".metrics", "a..b.metrics", "x.y"],
)
def test_parse_refuses_what_is_not_ours(bad: str) -> None:
    with pytest.raises(subjects.SubjectError):
        subjects.parse(bad)


def test_builders() -> None:
    assert subjects.metrics("fox.educloud.no") == "fox.educloud.no.metrics"
    assert subjects.events("fox", "job") == "fox.events.job"
    assert subjects.log("fox", "hpcbus") == "fox.log.hpcbus"
    assert subjects.control("fox", "GET") == "fox.control.get"
    assert subjects.sonar("fox", "jobs") == "fox.sonar.job"  # Sonar's topic name, whatever the spec says
    assert subjects.wildcard("fox", "events") == "fox.events.>"
    for bad in (
        lambda: subjects.metrics("fo x"),
        lambda: subjects.events("fox", "a.b"),
        lambda: subjects.metrics(""),
    ):
        with pytest.raises(subjects.SubjectError):
            bad()


def test_subscription_and_dead_letter_builders() -> None:
    assert subjects.stored("fox.educloud.no") == [
        "fox.educloud.no.metrics",
        "fox.educloud.no.telemetry",
        "fox.educloud.no.events.>",
        "fox.educloud.no.log.>",
        "fox.educloud.no.sonar.>",
    ]
    assert subjects.wildcards("fox", "metrics", "events") == ["fox.metrics", "fox.events.>"]
    assert subjects.parse("fox.educloud.no.telemetry") == subjects.Subject("fox.educloud.no", "telemetry")
    assert subjects.deadletter("fox", "metrics") == "fox.deadletter.metrics"
    assert subjects.deadletter_wildcard("fox") == "fox.deadletter.>"
    for bad in (
        lambda: subjects.deadletter("fox", "a.b"),
        lambda: subjects.deadletter_wildcard("fo x"),
        lambda: subjects.wildcards("fox", "metrics", "deadletter"),
    ):
        with pytest.raises(subjects.SubjectError):
            bad()


def parse_args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_bus_arguments(p)
    return p.parse_args(argv)


def test_flag_beats_environment_beats_file(tmp_path: Path) -> None:
    conf = tmp_path / "hpcbus.toml"
    conf.write_text('[bus]\nnats = ["nats://file:4222"]\ncluster = "from-file"\nuser = "u"\n')
    env = {"NATS_URL": "nats://env1:4222, nats://env2:4222", "HPCBUS_CLUSTER": "from-env"}
    s = bus_settings(parse_args("--config", str(conf), "--cluster", "from-flag"), env)
    assert s.nats == ["nats://env1:4222", "nats://env2:4222"]
    assert s.cluster == "from-flag"
    assert s.user == "u"
    assert bus_settings(parse_args(), {}).nats == ["nats://127.0.0.1:4222"]


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    conf = tmp_path / "hpcbus.toml"
    conf.write_text('[bus]\nnats_url = "x"\n')
    with pytest.raises(SettingsError, match="nats_url"):
        bus_settings(parse_args("--config", str(conf)), {})


def test_connect_options_carry_auth() -> None:
    s = bus_settings(parse_args("--user", "a", "--password", "b", "--creds", "/c"), {})
    opts = nats_connect_options(s)
    assert (opts["user"], opts["password"], opts["user_credentials"]) == ("a", "b", "/c")
