"""The compiled line scan (`schemas/lineprotocol/_scan.c`) gives what the pure path gives, line for line.

`scan_compiled` (C for canonical metric lines, the pure path alone for each other line) must equal
`scan_pure` (`parse_payload` of the whole payload): the same items (canonical texts and `Line`s, in order) and
the same problems, on the corpus, on generated lines (printable and hostile), and on the fault suite's
hostile messages. These tests need the extension built (`pip install -e .` with a compiler: setup.py) and
say so when it is not; `HPCBUS_PURE=1` must switch it off, and `hpcbus --version` says which path runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpcbus.schemas.lineprotocol import format_line, metric, parse_payload, scan
from hpcbus.schemas.lineprotocol.parse import latest_of, seconds_window
from hpcbus.schemas.lineprotocol.scan import Scanned, line_of, scan_compiled, scan_pure
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.native import ALL_COMPILED, implementation
from tests.compiled_inputs import (
    LEFT_TO_THE_PURE_PATH,
    LP_FILES,
    NOW,
    WINDOW_EDGES,
    WINDOWS,
    corpus_payloads,
    fault_messages,
    lines,
    near_canonical,
    printed_on_the_pure_path,
)


def test_the_extension_is_built() -> None:
    """The rest of this file compares the two paths: with the pure path alone it would compare it to itself."""
    assert scan._scan is not None, (
        "hpcbus.schemas.lineprotocol._scan is not built (pip install -e . with gcc)"
    )
    assert scan.scan is scan_compiled
    assert implementation() == ALL_COMPILED


def same(payload: bytes, now: int = NOW) -> Scanned:
    """Both paths on `payload`, asserted equal for each window; the compiled result in the workers' window."""
    for max_future in WINDOWS:
        fast = scan_compiled(payload, now=now, place="x.metrics", max_future=max_future)
        pure = scan_pure(payload, now=now, place="x.metrics", max_future=max_future)
        assert fast.items == pure.items, payload[:300]
        assert fast.problems == pure.problems, payload[:300]
        # a text stands for the very `Line` the pure path built (`line_of`: the writer's unusual cases)
        lines = parse_payload(payload, now=now, place="x.metrics", max_future=max_future).lines
        assert [line_of(i) if type(i) is str else i for i in fast.items] == lines, payload[:300]
    return fast


def taken(payload: bytes) -> int:
    """How many lines of `payload` the C scan itself took (not left to the pure path), in the workers'
    window (`now + DEFAULT_MAX_FUTURE`)."""
    earliest, end = seconds_window(latest_of(NOW, DEFAULT_MAX_FUTURE))
    items, _rest, _plain = scan._scan.scan(payload, earliest, end)  # type: ignore[union-attr]
    return sum(type(item) is str for item in items)


# --- the corpus ---------------------------------------------------------------------------------------------


def test_the_corpus_has_line_protocol() -> None:
    assert len(LP_FILES) >= 8


@pytest.mark.parametrize("path", LP_FILES, ids=lambda p: p.name)
def test_corpus_file(path: Path) -> None:
    for payload, now in corpus_payloads(path):
        same(payload, now)


def test_node_agent_lines_are_taken_by_the_c_scan() -> None:
    """The usual line (what the node agent writes) never leaves C, so the comparisons above test it."""
    lines = [
        metric("cpu_user", 0.25, hostname="n001", time=NOW, type="hwthread", type_id="7"),
        metric("mem_used", 123456789, hostname="n001", time=NOW),
        metric(
            "nv_util", 87.0, hostname="n001.fox", time=NOW, type="accelerator", type_id="00000000:01:00.0"
        ),
        metric("disk_read", 1.5, hostname="n001", time=NOW, stype="disk", stype_id="sda"),
        metric("cpu_load", -0.0, hostname="n-1_x", time=NOW, cluster="fox.educloud.no", job="123_4.batch"),
    ]
    payload = "".join(format_line(line) + "\n" for line in lines).encode()
    result = same(payload)
    assert taken(payload) == len(lines)
    assert result.items == [format_line(line) for line in lines] and not result.problems


@pytest.mark.parametrize("line", LEFT_TO_THE_PURE_PATH)
def test_lines_the_c_scan_leaves_to_the_pure_path(line: bytes) -> None:
    """Each of these is unusual in one way: the C scan does not take it, and the pure path's verdict (kept,
    repaired or refused with its reason) is what comes out."""
    assert taken(line) == 0
    same(line + b"\n" + b"m,hostname=n1,type=node value=2 200\n")


def test_the_length_limit_counts_a_crlf_lines_cr() -> None:
    """The pure path measures a line with the '\r' of its CRLF end: a canonical line of 1024 bytes before
    it is one over the limit there (formatted again, not forwarded as it came), and so in C (found by review)."""
    base = b"cpu,hostname=n1,type=node,pad=%s value=1.5 1699999990"
    for size in (1023, 1024, 1025):
        line = base % (b"a" * (size - len(base % b"")))
        assert len(line) == size
        same(line + b"\r\n" + line)
        same(line + b"\r\n" + line + b"\r\n")


def test_timestamp_window_bounds() -> None:
    """The window's edges: `now + max_future` is kept, one second later is refused, 2000-01-01 is kept."""
    for ts in WINDOW_EDGES:
        same(f"m,hostname=n1,type=node value=1 {ts}\n".encode())
    fast = scan_compiled(
        f"m,hostname=n1,type=node value=1 {NOW + DEFAULT_MAX_FUTURE + 1}\n".encode(),
        now=NOW,
        max_future=DEFAULT_MAX_FUTURE,
    )
    assert not fast.items and "later than now + max_future" in fast.problems[0].reason


# --- generated lines ----------------------------------------------------------------------------------------


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(near_canonical(), min_size=1, max_size=6), st.sampled_from(["\n", "\r\n"]))
def test_generated_near_canonical_lines(batch: list[str], end: str) -> None:
    same(end.join(batch).encode("utf-8", "surrogatepass"))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(lines(), min_size=1, max_size=6))
@example(
    ["cpu_load,hostname=n1,type=node value=1 1700000000", "cpu_load,hostname=n1,type=node value=1e309 1"]
)
def test_generated_lines(batch: list[str]) -> None:
    same("\n".join(batch).encode("utf-8", "surrogatepass"))


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_generated_bytes(data: bytes) -> None:
    same(data)
    same(b"m,hostname=n1,type=node value=1 " + data)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=120))
def test_generated_text(text: str) -> None:
    same(text.encode("utf-8", "surrogatepass"))


# --- the fault suite's hostile messages ---------------------------------------------------------------------


def test_fault_suite_hostile_messages() -> None:
    """Every bad or hostile message of fault scenario 6 (garbage bytes, NaN, inf, past, future, 10,000 tags,
    a 1 MB line, 10,000-deep JSON) with its valid neighbour, both paths, in the workers' window. The 10,000
    tags and the 1 MB line are the same bad line in each of their messages (only the neighbour's number
    differs) and cost a quarter second each on the pure path: three of each are read, all the others."""
    for payload, kind, good in fault_messages(NOW):
        result = same(payload)
        assert taken(payload) == good  # the valid neighbour is the C scan's, the bad line the pure path's
        assert len(result.problems) >= 1 or kind == "deepjson"


# --- the switch -----------------------------------------------------------------------------------------------


def version(env: dict[str, str], cwd: Path | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "hpcbus", "--version"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_version_says_which_path() -> None:
    env = {k: v for k, v in os.environ.items() if k != "HPCBUS_PURE"}
    assert version(env) == f"hpcbus 0.1.0 ({ALL_COMPILED})"
    assert version({**env, "HPCBUS_PURE": "1"}) == "hpcbus 0.1.0 (pure Python: HPCBUS_PURE=1)"


def test_hpcbus_pure_selects_the_pure_path() -> None:
    code = "from hpcbus.schemas.lineprotocol import scan; print(scan._scan, scan.scan.__name__)"
    assert printed_on_the_pure_path(code) == ["None", "scan_pure"]


def test_without_a_compiler_the_wheel_runs_the_pure_path(tmp_path: Path) -> None:
    """`CC=false pip wheel`: the optional extension fails to build, the wheel is still made, and the hpcbus
    in it runs (and says) the pure path."""
    # a copy of the sources alone: a `build/` left in the working tree by an earlier build holds a compiled
    # extension that setuptools would put into this wheel too
    root = tmp_path / "src"
    shutil.copytree(
        Path(__file__).resolve().parents[1],
        root,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "var", "*.so", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    env = {**os.environ, "CC": "false", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("HPCBUS_PURE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(root)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = tmp_path.glob("hpcbus-*.whl")
    with zipfile.ZipFile(wheel) as z:
        assert not [n for n in z.namelist() if n.endswith(".so")]
        z.extractall(tmp_path / "site")
    assert (
        version({**env, "PYTHONPATH": str(tmp_path / "site")}, cwd=tmp_path) == "hpcbus 0.1.0 (pure Python)"
    )


def test_bench_lines_are_the_c_scans() -> None:
    """`make bench` times the C scan on the node agent's lines: they are equal on both paths and all C's."""
    from bench.compiled import node_payloads

    for payload in node_payloads(NOW, 3000):
        assert same(payload).items == payload.decode().splitlines()
        assert taken(payload) == 1000
