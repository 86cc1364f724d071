"""deploy/systemd/: a unit for every long-running command, each accepted by `systemd-analyze verify`, each
command line accepted by the CLI with the sample config, none running as root, and a configuration mistake
(exit 2) stopping the unit instead of restarting it.

`systemd-analyze verify --root` reads the units from a directory tree of the test's own (with Debian's
units and the venv path of the units), so it needs no systemd running as PID 1 and touches nothing of
the host's."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from hpcbus import cli, options
from hpcbus.commands.dev.units import CONFIG, UNITS, VENV

ROOT = Path(__file__).resolve().parents[1]
SYSTEMD = ROOT / "deploy" / "systemd"
LONG_RUNNING = {
    "produce node",
    "produce slurm",
    "produce ocs",
    "consume influx",
    "consume sonar",
    "consume jobs",
    "consume ingest",
    "gateway",
}
UNIT_FILES = sorted(SYSTEMD.glob("*.service"))


def keys(unit: Path) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in unit.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            k, v = line.split("=", 1)
            found.setdefault(k, []).append(v)
    return found


def command_line(unit: Path) -> list[str]:
    (line,) = keys(unit)["ExecStart"]
    return shlex.split(line)


def test_every_long_running_command_has_one_unit() -> None:
    words = {" ".join(command_line(u)[1:-2]) for u in UNIT_FILES}
    assert words == LONG_RUNNING
    assert len(UNIT_FILES) == len(LONG_RUNNING) == len(UNITS)


@pytest.fixture(scope="module")
def system_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tree like a host's: Debian's units, ours in /etc/systemd/system, the venv's `hpcbus`, our user."""
    root = tmp_path_factory.mktemp("root")
    for where in ("/usr/lib/systemd/system", "/lib/systemd/system"):
        if Path(where).is_dir():
            shutil.copytree(where, root / "usr/lib/systemd/system", symlinks=True, dirs_exist_ok=True)
            break
    units = root / "etc/systemd/system"
    units.mkdir(parents=True)
    for unit in UNIT_FILES:
        shutil.copy(unit, units / unit.name)
    exe = root / VENV.lstrip("/") / "bin" / "hpcbus"
    exe.parent.mkdir(parents=True)
    exe.write_text(f"#!{sys.executable}\n")
    exe.chmod(0o755)
    conf = ROOT / "deploy" / "sysusers.d" / "hpcbus.conf"
    subprocess.run(["systemd-sysusers", f"--root={root}", str(conf)], check=True, capture_output=True)
    return root


def verify(root: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", f"--root={root}", name], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("unit", UNIT_FILES, ids=lambda p: p.name)
def test_systemd_analyze_verify_passes(system_root: Path, unit: Path) -> None:
    name = unit.name.replace("@.", "@1.")  # a template is verified as an instance
    done = verify(system_root, name)
    # verify exits 0 on an unknown key or a bad value (it only warns): any message is a failure here
    assert done.returncode == 0 and not done.stderr.strip() and not done.stdout.strip(), done.stderr


def test_verify_reports_what_this_test_relies_on(system_root: Path) -> None:
    """The check above can fail: a mistyped key and a missing command are reported."""
    units = system_root / "etc/systemd/system"
    (units / "hpcbus-broken.service").write_text(
        (SYSTEMD / "hpcbus-ocs.service").read_text().replace("ProtectHome=yes", "ProtectHomes=yes")
    )
    assert "Unknown key 'ProtectHomes'" in verify(system_root, "hpcbus-broken.service").stderr
    (units / "hpcbus-broken.service").write_text(
        (SYSTEMD / "hpcbus-ocs.service").read_text().replace(f"{VENV}/bin/hpcbus", "/nonexistent/hpcbus")
    )
    assert "is not executable" in verify(system_root, "hpcbus-broken.service").stderr
    (units / "hpcbus-broken.service").unlink()


SAMPLES = [(u, "hpcbus.toml") for u in UNIT_FILES] + [(SYSTEMD / "hpcbus-node.service", "node.toml")]


@pytest.mark.parametrize(("unit", "sample"), SAMPLES, ids=lambda p: getattr(p, "name", p))
def test_command_line_parses_with_the_sample_config(unit: Path, sample: str, tmp_path: Path) -> None:
    """The unit's own command line, the sample config in place of /etc/hpcbus/hpcbus.toml, through the CLI's
    settings loader (`--check-config`: every table and key read, nothing run). The files the sample names
    (an accounting file, an auth file: `Section.files`, which `--check-config` opens) are this test's own."""
    argv = command_line(unit)
    assert argv[0] == f"{VENV}/bin/hpcbus" and argv[-2:] == ["--config", CONFIG]
    argv[-1] = str(ROOT / "deploy" / sample)
    args = cli.build_parser().parse_args(argv[1:])
    config = tomllib.loads((ROOT / "deploy" / sample).read_text())
    for section in args._sections:
        for name in section.files:
            if config.get(section.table or "", {}).get(name):
                stand_in = tmp_path / name
                stand_in.write_text("")
                argv += [options.flags_of(section, name)[0], str(stand_in)]
    assert cli.main(["--check-config", *argv[1:]]) == 0


def test_config_mistake_exits_2_which_stops_the_unit(tmp_path: Path) -> None:
    config = tmp_path / "hpcbus.toml"
    sample = (ROOT / "deploy" / "hpcbus.toml").read_text()
    config.write_text(sample.replace("\n[node_agent]", "\n[node_agent]\nintervall = 5", 1))
    done = subprocess.run(
        [sys.executable, "-m", "hpcbus", "produce", "node", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "intervall" in done.stderr and "Traceback" not in done.stderr
    for unit in UNIT_FILES:
        assert keys(unit)["RestartPreventExitStatus"] == ["2"], unit.name


@pytest.mark.parametrize("unit", UNIT_FILES, ids=lambda p: p.name)
def test_unprivileged_and_hardened(unit: Path) -> None:
    k = keys(unit)
    assert k["User"] == ["hpcbus"] and "DynamicUser" not in k
    for option in ("NoNewPrivileges", "PrivateTmp", "ProtectKernelTunables", "ProtectControlGroups"):
        assert k[option] == ["yes"], option
    assert k["ProtectSystem"] == ["strict"] and k["StateDirectory"] == ["hpcbus"]
    (caps,) = k["CapabilityBoundingSet"]
    if unit.name == "hpcbus-node.service":  # /proc/<pid>/io of every user, root-only counters
        assert (
            caps.split() == ["CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"] == k["AmbientCapabilities"][0].split()
        )
    else:
        assert caps == "" and "AmbientCapabilities" not in k


def _written_kib(pid: int, caps: str, config: Path) -> int | None:
    """`data_written` of process `pid` in one node agent sample taken with only `caps` (a setpriv
    bounding set: the process runs as root with no capability outside it)."""
    argv = ["setpriv", f"--bounding-set=-all{caps}", f"--inh-caps=-all{caps}"]
    argv += [sys.executable, "-m", "hpcbus", "produce", "node", "--once", "--format", "sonar"]
    argv += ["--cluster", "caps", "--config", str(config), "--no-gpus"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    import json

    for line in done.stdout.splitlines():
        for job in json.loads(line)["data"]["attributes"].get("jobs", []):
            for proc in job.get("processes", []):
                if proc.get("pid") == pid:
                    return int(proc.get("data_written", 0))
    raise AssertionError(f"process {pid} not in the sample:\n{done.stdout[:2000]}")


def test_node_agent_capabilities_are_what_reading_other_users_io_takes(tmp_path: Path) -> None:
    """The node unit's CAP_SYS_PTRACE is what makes another user's /proc/<pid>/io readable: with the unit's
    capabilities the agent sees what a `nobody` process wrote, without them it sees nothing."""
    config = tmp_path / "node.toml"
    config.write_text("[node.jobs]\nmin_uid = 0\n")
    (ROOT / "var").mkdir(exist_ok=True)
    target = ROOT / "var" / f"caps-{os.getpid()}.bin"  # on disk: tmpfs writes are not counted in io
    # the system's python: the writer runs as nobody, who may not be able to reach this checkout's venv
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    with target.open("wb") as f:
        code = (
            f"import os, time; os.write({f.fileno()}, os.urandom(8 << 20)); os.fsync({f.fileno()}); "
            "print('ok', flush=True); time.sleep(120)"
        )
        writer = subprocess.Popen(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, "-c", code],
            pass_fds=(f.fileno(),),
            stdout=subprocess.PIPE,
            text=True,
        )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "ok\n"
        (caps,) = keys(SYSTEMD / "hpcbus-node.service")["CapabilityBoundingSet"]
        granted = "".join(f",+{c.lower().removeprefix('cap_')}" for c in caps.split())
        assert (_written_kib(writer.pid, granted, config) or 0) >= 8 << 10
        assert not _written_kib(writer.pid, "", config)
    finally:
        writer.kill()
        writer.wait()
        target.unlink()


def test_node_unit_leaves_the_devices_open() -> None:
    """NVML opens /dev/nvidiactl, /dev/nvidia<N> and /dev/nvidia-uvm: the node unit restricts no device.
    ProtectClock=yes would, on systemd 245-251 (Ubuntu 22.04, Debian 11, RHEL 9.0): it adds
    `DeviceAllow=char-rtc r`, and with DevicePolicy=auto that denies every other device (systemd PR #25075)."""
    k = keys(SYSTEMD / "hpcbus-node.service")
    for option in ("ProtectClock", "PrivateDevices", "DeviceAllow", "DevicePolicy"):
        assert option not in k, option
    for unit in UNIT_FILES:  # the others keep it (no device for them to open)
        if unit.name != "hpcbus-node.service":
            assert keys(unit)["ProtectClock"] == ["yes"] and keys(unit)["PrivateDevices"] == ["yes"], (
                unit.name
            )


def doc_config() -> dict[str, Any]:
    """The config file docs/deploy.md writes to /etc/hpcbus/hpcbus.toml."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(r"(?ms)^cat > /etc/hpcbus/hpcbus\.toml <<'EOF'\n(.*?)^EOF$", text)
    assert match, "docs/deploy.md writes no /etc/hpcbus/hpcbus.toml"
    return tomllib.loads(match.group(1))


def test_sonar_tree_is_writable_by_the_unit_and_readable_by_others(tmp_path: Path) -> None:
    """ProtectSystem=strict leaves the unit only its StateDirectory and ReadWritePaths= to write (elsewhere:
    EROFS, which the worker takes as permanent and dead-letters every envelope); docs/deploy.md's
    `[sonar] directory` is under one of them. With the unit's umask the tree is readable by Jobanalyzer,
    another user: files 0644, directories 0755."""
    k = keys(SYSTEMD / "hpcbus-sonar@.service")
    directory = doc_config()["sonar"]["directory"]
    writable = [p.lstrip("-") for p in k.get("ReadWritePaths", [])]
    writable += [f"/var/lib/{d}" for d in k["StateDirectory"][0].split()]
    assert any(directory == w or directory.startswith(f"{w}/") for w in writable), (directory, writable)
    assert not directory.startswith("/var/lib/hpcbus/")  # the StateDirectory is 0750: Jobanalyzer can't enter
    (umask,) = k["UMask"]
    root = tmp_path / "tree"
    code = (
        f"import os; os.umask(0o{umask}); from hpcbus.consumers.sonar.directory import DirectoryWriter; "
        f"DirectoryWriter({str(root)!r}).append([('2026/11/25/0+sample-c1.json', b'{{}}')])"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)
    made = [root, *root.rglob("*")]
    assert len(made) == 5
    for path in made:
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path
