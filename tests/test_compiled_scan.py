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
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hpcbus.schemas.lineprotocol import format_line, metric, parse_payload, scan
from hpcbus.schemas.lineprotocol.parse import latest_of, seconds_window
from hpcbus.schemas.lineprotocol.scan import Scanned, line_of, scan_compiled, scan_pure
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.native import implementation
from tests.corpus import CORPUS
from tests.faults.scenarios import N_BAD, N_DEEP, _hostile

NOW = 1_700_000_000
WINDOWS = (None, DEFAULT_MAX_FUTURE)
"""`max_future` as tests (no window) and workers (`now + 1 day`) give it."""


def test_the_extension_is_built() -> None:
    """The rest of this file compares the two paths: with the pure path alone it would compare it to itself."""
    assert scan._scan is not None, (
        "hpcbus.schemas.lineprotocol._scan is not built (pip install -e . with gcc)"
    )
    assert scan.scan is scan_compiled
    assert implementation().startswith("compiled: lineprotocol scan")  # other extensions may follow


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

LP_FILES = sorted(CORPUS.rglob("*.lp"))


def test_the_corpus_has_line_protocol() -> None:
    assert len(LP_FILES) >= 8


@pytest.mark.parametrize("path", LP_FILES, ids=lambda p: p.name)
def test_corpus_file(path: Path) -> None:
    data = path.read_bytes()
    same(data)
    same(data, now=int(path.stat().st_mtime))
    same(data.replace(b"\n", b"\r\n"))


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


@pytest.mark.parametrize(
    "line",
    [
        b"m,hostname=n1,type=hwthread,type-id=1 value=1 100\r",  # CRLF
        b" m,hostname=n1,type=hwthread,type-id=1 value=1 100",  # leading space
        b"m,hostname=n1,type=hwthread,type-id=1 value=1 100 ",  # trailing space
        b"m,hostname=n1,type=hwthread,type-id=1 value=1 1700000000000000000",  # ns
        b"m,hostname=n1,type=hwthread,type-id=1 value=1e3 100",
        b"m,hostname=n1,type=hwthread,type-id=1 value=NaN 100",
        b"m,hostname=n1,type=hwthread,type-id=1 value=1u 100",
        b"m,hostname=n1,type=hwthread,type-id=1 value=99999999999999999999i 100",
        b"m,hostname=n1,type=node,type-id=0 value=1 100",  # put in its bus form
        b"m,hostname=n1,type=node,stype=disk value=1 100",
        b"m,hostname=n1,type=core value=1 100",  # no type-id
        b"m,hostname=n1,type=board,type-id=1 value=1 100",
        b"m,hostname=n1,host=n1,type=node value=1 100",
        b"m,hostname=n1,hostname=n1,type=node value=1 100",
        b"m,hostname=n1,type=node,value=x value=1 100",
        b"m,hostname=n1,type=node value=1,value=2 100",
        b"m,hostname=../x,type=node value=1 100",
        b"m,hostname=n1,type=node,cluster=a..b value=1 100",
        b"m,hostname=n1,type=node,job=.. value=1 100",
        b"m,hostname=n1,type=node value=1",  # no timestamp
        b"#m,hostname=n1,type=node value=1 100",
        b"m\\ x,hostname=n1,type=node value=1 100",
        b"m,hostname=n1,type=node,x=" + b"y" * 1100 + b" value=1 100",
        "m,hostname=n1,type=node,x=\u202e value=1 100".encode(),
        b"m,hostname=n1,type=node,x=\xff value=1 100",
    ],
)
def test_lines_the_c_scan_leaves_to_the_pure_path(line: bytes) -> None:
    """Each of these is unusual in one way: the C scan does not take it, and the pure path's verdict (kept,
    repaired or refused with its reason) is what comes out."""
    assert taken(line) == 0
    same(line + b"\n" + b"m,hostname=n1,type=node value=2 200\n")


def test_timestamp_window_bounds() -> None:
    """The window's edges: `now + max_future` is kept, one second later is refused, 2000-01-01 is kept."""
    for ts in (
        946_684_799,
        946_684_800,
        NOW + DEFAULT_MAX_FUTURE,
        NOW + DEFAULT_MAX_FUTURE + 1,
        4_999_999_999,
    ):
        same(f"m,hostname=n1,type=node value=1 {ts}\n".encode())
    fast = scan_compiled(
        f"m,hostname=n1,type=node value=1 {NOW + DEFAULT_MAX_FUTURE + 1}\n".encode(),
        now=NOW,
        max_future=DEFAULT_MAX_FUTURE,
    )
    assert not fast.items and "later than now + max_future" in fast.problems[0].reason


# --- generated lines ----------------------------------------------------------------------------------------

HOSTILE = [
    "\\",
    '"',
    "'",
    "=",
    ",",
    " ",
    "#",
    "\t",
    "\x00",
    "\x1b",
    "\x7f",
    "\x85",
    "\u202e",
    "\u2028",
    "é",
    "\r",
]
NAME_CHARS = st.sampled_from(["a", "Z", "0", "9", "_", "-", ".", ":", "[", "]", "@", "+", "/", *HOSTILE])
NAME = st.one_of(
    st.sampled_from(
        ["n1", "c001.fox", "fox.educloud.no", "123_4.batch", "0", "node", "disk", "sda", "x", ".."]
    ),
    st.text(NAME_CHARS, min_size=0, max_size=8),
)
KEY = st.one_of(
    st.sampled_from(["hostname", "type", "type-id", "stype", "stype-id", "cluster", "job", "host", "node"]),
    st.sampled_from(["nodename", "value", "unit", "a"]),
    st.text(NAME_CHARS, min_size=0, max_size=5),
)
LEVEL = st.sampled_from(
    ["node", "socket", "die", "memoryDomain", "llc", "core", "hwthread", "accelerator", "x"]
)
NUMBER = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(-(2**70), 2**70).map(lambda i: f"{i}i"),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        ["1e309", "-1e309", "-0", "-0.0", "0", ".5", "5.", "NaN", "inf", "-Inf", "1u", "t", "true"]
    ),
    st.sampled_from(['"1"', "1.2.3", "--1", "1i2", "0x10", "9223372036854775807i", "9223372036854775808i"]),
    st.text(NAME_CHARS, max_size=4),
)
TIME = st.one_of(
    st.integers(0, 5_000_000_100).map(str),
    st.sampled_from(["946684800", "946684799", str(NOW + 86_400), str(NOW + 86_401), "-1", "", "1e9", "01"]),
    st.integers(0, 2**64).map(str),
)


@st.composite
def lines(draw: st.DrawFn) -> str:
    measurement = draw(st.one_of(st.sampled_from(["cpu_load", "m", "job", "#m"]), NAME))
    tags = {"hostname": draw(NAME), "type": draw(LEVEL)}
    if draw(st.booleans()):
        tags["type-id"] = draw(NAME)
    for _ in range(draw(st.integers(0, 3))):
        tags[draw(KEY)] = draw(NAME)
    order = draw(st.permutations(list(tags)))
    pairs = [f"{key}={tags[key]}" for key in order]
    if draw(st.integers(0, 9)) == 0 and pairs:  # a key given twice
        pairs.append(draw(st.sampled_from(pairs)))
    fields = [f"value={draw(NUMBER)}"]
    if draw(st.integers(0, 9)) == 0:
        fields.append(draw(st.sampled_from(["value=2", 'event="x"', "x=1", 'value="s"'])))
    ts = draw(TIME)
    line = ",".join([measurement, *pairs]) + " " + ",".join(fields) + (f" {ts}" if ts else "")
    return draw(st.sampled_from(["", " ", "\t"])) + line + draw(st.sampled_from(["", "", " ", "\r"]))


SAFE = st.text(st.sampled_from("abcXYZ019_-."), min_size=1, max_size=6)
GOOD = st.sampled_from(["n1", "c001.fox", "a-b_c", "x", "0"])
JOB = st.one_of(st.text(st.sampled_from("0123456789_.+:@[]-abc"), min_size=1, max_size=8), st.just("x" * 65))
CANONICAL_NUMBER = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(
        lambda f: format_line(metric("m", f, hostname="h", time=1)).split(" ")[1][6:]
    ),
    st.integers(-(10**18), 10**18).map(lambda i: f"{i}i"),
    st.sampled_from(
        [
            "0",
            "-0",
            "1.5",
            "0.000001",
            "1" * 19 + "i",
            "9" * 19 + "i",
            "-" + "9" * 19 + "i",
            "-" + "9" * 18 + "i",
            "1" * 64,
            "1" * 65,
        ]
    ),
)


@st.composite
def near_canonical(draw: st.DrawFn) -> str:
    """A canonical metric line (most of them the C scan's), sometimes changed in one place."""
    level = draw(LEVEL)
    tags = {"hostname": draw(st.one_of(GOOD, GOOD, SAFE, NAME)), "type": level}
    if level != "node" or draw(st.integers(0, 3)) == 0:
        tags["type-id"] = draw(st.one_of(SAFE, st.just("0")))
    if draw(st.booleans()):
        tags["stype"] = draw(st.sampled_from(["disk", "process", "0"]))
        if level == "node" and draw(st.integers(0, 3)):
            tags["type-id"] = tags["stype"]
    if draw(st.booleans()):
        tags["cluster"] = draw(st.one_of(GOOD, SAFE))
    if draw(st.booleans()):
        tags["job"] = draw(st.one_of(GOOD, JOB))
    if draw(st.booleans()):
        tags[draw(st.sampled_from(["unit", "stype-id", "host", "a"]))] = draw(SAFE)
    order = draw(st.permutations(list(tags)))
    head = ",".join([draw(SAFE), *(f"{key}={tags[key]}" for key in order)])
    live = st.integers(NOW - 10**8, NOW + 100_000).map(str)
    ts = draw(st.one_of(live, live, live, TIME.filter(bool)))
    line = f"{head} value={draw(CANONICAL_NUMBER)} {ts}"
    if draw(st.integers(0, 3)) == 0:  # one change: a hostile character in, or one character out
        at = draw(st.integers(0, len(line)))
        if draw(st.booleans()):
            line = line[:at] + draw(st.sampled_from([*HOSTILE, "=", "i", "0", "-", "."])) + line[at:]
        else:
            line = line[:at] + line[at + 1 :]
    return line


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
    kinds: Counter[str] = Counter()
    for i in range(N_BAD + N_DEEP):
        _suffix, payload, kind, good = _hostile(i, NOW)
        if kind in ("tags", "mega") and kinds[kind] == 3:
            continue
        kinds[kind] += 1
        result = same(payload)
        assert taken(payload) == good  # the valid neighbour is the C scan's, the bad line the pure path's
        assert len(result.problems) >= 1 or kind == "deepjson"
    assert set(kinds) == {"garbage", "nan", "inf", "past", "future", "tags", "mega", "deepjson"}


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
    assert version(env).startswith("hpcbus 0.1.0 (compiled: lineprotocol scan")
    assert version({**env, "HPCBUS_PURE": "1"}) == "hpcbus 0.1.0 (pure Python: HPCBUS_PURE=1)"


def test_hpcbus_pure_selects_the_pure_path() -> None:
    code = "from hpcbus.schemas.lineprotocol import scan; print(scan._scan, scan.scan.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "HPCBUS_PURE": "1"},
        timeout=60,
    )
    assert done.stdout.split() == ["None", "scan_pure"], done.stderr


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
