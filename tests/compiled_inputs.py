"""The inputs the compiled-path tests (`tests/test_compiled_*.py`) give both paths, written once.

Why one module: the C extensions that read line protocol share their rules (`schemas/_lineshape.h`), so the
tests that hold them equal to the pure path share what they feed them: the corpus, the Hypothesis
strategies of printable, near-canonical and hostile lines, the hand-picked lines C must leave to the pure
path, the fault suite's hostile messages, the timestamp window's edges; and the checks every extension
needs: `HPCBUS_PURE=1` selects the pure path, memory does not grow. A new extension's test module imports
what fits instead of copying it.
"""

from __future__ import annotations

import gc
import os
import resource
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from hypothesis import strategies as st

from hpcbus.schemas.lineprotocol import format_line, metric
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from tests.corpus import CORPUS
from tests.faults.scenarios import N_BAD, N_DEEP, _hostile

NOW = 1_700_000_000
WINDOWS = (None, DEFAULT_MAX_FUTURE)
"""`max_future` as tests (no window) and workers (`now + 1 day`) give it."""

# --- the corpus -----------------------------------------------------------------------------------------------

LP_FILES = sorted(CORPUS.rglob("*.lp"))
"""The corpus's line-protocol files."""


def corpus_payloads(path: Path) -> list[tuple[bytes, int]]:
    """(payload, now) to read a corpus file with: as it is, at its own time (its lines' window), with CRLF."""
    data = path.read_bytes()
    return [(data, NOW), (data, int(path.stat().st_mtime)), (data.replace(b"\n", b"\r\n"), NOW)]


# --- hand-picked lines ----------------------------------------------------------------------------------------

LEFT_TO_THE_PURE_PATH = [
    b"m,hostname=n1,type=hwthread,type-id=1 value=1 100\r",  # CRLF
    b" m,hostname=n1,type=hwthread,type-id=1 value=1 100",  # leading space
    b"m,hostname=n1,type=hwthread,type-id=1 value=1 100 ",  # trailing space
    b"m,hostname=n1,type=hwthread,type-id=1 value=1 1700000000000000000",  # ns
    b"m,hostname=n1,type=hwthread,type-id=1 value=1e3 100",
    b"m,hostname=n1,type=hwthread,type-id=1 value=NaN 100",
    b"m,hostname=n1,type=hwthread,type-id=1 value=inf 100",
    b"m,hostname=n1,type=hwthread,type-id=1 value=1u 100",
    b"m,hostname=n1,type=hwthread,type-id=1 value=99999999999999999999i 100",
    b"m,hostname=n1,type=hwthread,type-id=1 value=" + b"9" * 400 + b" 100",  # huge float
    b"m,hostname=n1,type=node,type-id=0 value=1 100",  # put in its bus form
    b"m,hostname=n1,type=node,stype=disk value=1 100",
    b"m,hostname=n1,type=core value=1 100",  # no type-id
    b"m,hostname=n1,type=board,type-id=1 value=1 100",
    b"m,hostname=n1,host=n1,type=node value=1 100",
    b"m,hostname=n1,hostname=n1,type=node value=1 100",
    b"m,hostname=n1,type=node,value=x value=1 100",
    b"m,hostname=n1,type=node value=1,value=2 100",
    b'm,hostname=n1,type=node value="1" 100',
    b"m,hostname=../x,type=node value=1 100",
    b"m,hostname=n1,type=node,cluster=a..b value=1 100",
    b"m,hostname=n1,type=node,job=.. value=1 100",
    b"m,hostname=n1,type=node value=1",  # no timestamp
    b"m,hostname=n1,type=node value=1 -5",
    b"#m,hostname=n1,type=node value=1 100",
    b"m\\ x,hostname=n1,type=node value=1 100",
    b"m,hostname=n1,type=node,x=" + b"y" * 1100 + b" value=1 100",
    "m,hostname=n1,type=node,x=\u202e value=1 100".encode(),
    b"m,hostname=n1,type=node,x=\xff value=1 100",
    b'sample,hostname=n1,type=node,function=skeleton event="{\\"lines\\":1}" 100',
    # names that are no names (issue 29): a measurement with '/', '.', a wildcard; a type-id or stype that is
    # no device id; a type-id the pure path keeps that holds a byte the C leaves alone ('#')
    b"m/x,hostname=n1,type=node value=1 100",
    b"m.x,hostname=n1,type=node value=1 100",
    b"m*,hostname=n1,type=node value=1 100",
    b"m>,hostname=n1,type=node value=1 100",
    b"m,hostname=n1,type=socket,type-id=../../x value=1 100",
    b"m,hostname=n1,type=socket,type-id=a..b value=1 100",
    b"m,hostname=n1,type=socket,type-id=" + b"1" * 65 + b" value=1 100",
    b"m,hostname=n1,type=node,stype=../x,type-id=../x value=1 100",
    b"m,hostname=n1,type=socket,type-id=0,stype=a/b value=1 100",
    b"m,hostname=n1,type=accelerator,type-id=GPU-1#2 value=1 100",
]
"""Lines unusual in one way each, that a canonical-line reader (`_scan.c`, `_place.c`) must not take: the
pure path's verdict (kept, repaired or refused with its reason) is what comes out."""

WINDOW_EDGES = (
    946_684_799,
    946_684_800,
    NOW + DEFAULT_MAX_FUTURE,
    NOW + DEFAULT_MAX_FUTURE + 1,
    4_999_999_999,
)
"""Timestamps at the window's edges: 2000-01-01 is kept, `now + max_future` is kept, one second later is
refused (`now=NOW`, `max_future=DEFAULT_MAX_FUTURE`)."""

# --- the fault suite's hostile messages -----------------------------------------------------------------------

FAULT_KINDS = {"garbage", "nan", "inf", "past", "future", "tags", "mega", "deepjson"}


def fault_messages(now: int, heavy: int = 3) -> list[tuple[bytes, str, int]]:
    """(payload, kind, valid lines in it) of each bad or hostile message of fault scenario 6 (garbage
    bytes, NaN, inf, past, future, 10,000 tags, a 1 MB line, 10,000-deep JSON) with its valid neighbour.
    The 10,000 tags and the 1 MB line are the same bad line in each of their messages (only the neighbour's
    number differs) and cost a quarter second each on the pure path: `heavy` of each are kept."""
    kinds: Counter[str] = Counter()
    out = []
    for i in range(N_BAD + N_DEEP):
        _suffix, payload, kind, good = _hostile(i, now)
        if kind in ("tags", "mega") and kinds[kind] == heavy:
            continue
        kinds[kind] += 1
        out.append((payload, kind, good))
    assert set(kinds) == FAULT_KINDS
    return out


# --- generated lines ------------------------------------------------------------------------------------------

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
"""Characters that make a name unusual: separators, escapes, quotes, controls, non-ASCII."""
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
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:.17f}".rstrip("0") + "0"),
    st.integers(-(2**70), 2**70).map(lambda i: f"{i}i"),
    st.integers(-(2**70), 2**70).map(str),
    st.sampled_from(
        ["1e309", "-1e309", "-0", "-0.0", "0", ".5", "5.", "NaN", "inf", "-Inf", "1u", "t", "true", "1e3"]
    ),
    st.sampled_from(['"1"', "1.2.3", "--1", "1i2", "0x10", "9223372036854775807i", "9223372036854775808i"]),
    st.sampled_from(["1" * 64, "1" * 65]),
    st.text(NAME_CHARS, max_size=4),
)
"""Field values: every float, ints and integer texts past 64 bits, and texts that are no number."""
TIME = st.one_of(
    st.integers(0, 5_000_000_100).map(str),
    st.sampled_from(["946684800", "946684799", str(NOW + 86_400), str(NOW + 86_401), "-1", "", "1e9", "01"]),
    st.integers(0, 2**64).map(str),
)
"""Timestamps (text, maybe none): seconds, nanoseconds, past the window, not a number."""
LIVE = st.integers(NOW - 10**8, NOW + 100_000).map(str)
"""Timestamps in the window of `now=NOW`."""


@st.composite
def lines(draw: st.DrawFn) -> str:
    """A metric line of any shape: any names, numbers and timestamps, a key twice, two fields, spaces."""
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


def changed(draw: st.DrawFn, line: str) -> str:
    """`line` with one change: a hostile character in, or one character out."""
    at = draw(st.integers(0, len(line)))
    if draw(st.booleans()):
        return line[:at] + draw(st.sampled_from([*HOSTILE, "=", "i", "0", "-", "."])) + line[at:]
    return line[:at] + line[at + 1 :]


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
    ts = draw(st.one_of(LIVE, LIVE, LIVE, TIME.filter(bool)))
    line = f"{head} value={draw(CANONICAL_NUMBER)} {ts}"
    return changed(draw, line) if draw(st.integers(0, 3)) == 0 else line


# --- the checks every extension needs -------------------------------------------------------------------------


def printed_on_the_pure_path(code: str) -> list[str]:
    """What `python -c code` prints (split into words) with `HPCBUS_PURE=1`: each module's choice of path."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "HPCBUS_PURE": "1"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def rss_kib() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def assert_memory_flat(
    once: Callable[[], None], warm: int = 300, rounds: int = 3000, limit_kib: int = 2048
) -> None:
    """`once` (calls on good and bad input, errors included) run `rounds` times more leaves the process's
    memory where `warm` times left it (within `limit_kib`): nothing the C builds or drops on an error is kept."""
    for _ in range(warm):
        once()
    gc.collect()
    before = rss_kib()
    for _ in range(rounds):
        once()
    gc.collect()
    grown = rss_kib() - before
    assert grown < limit_kib, f"RSS grew {grown} KiB over {rounds} rounds"
