"""Slurm hostlists: examples from the Sonar spec and FACTS.md, Slurm edge cases, the real corpus lists, and
properties (expand against a model, compress round trip and canonical form)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hpcbus.schemas.noderange import MAX_HOSTS, compress, expand, expand_all, is_valid
from tests.corpus import CORPUS

SONAR_DIR = CORPUS / "sonar"
SACCT_SNOWMAN = CORPUS / "slurm" / "hb-jobinfo_sacct_snowman-delimited.txt"

# --- examples --------------------------------------------------------------------------------

SPEC_EXAMPLE = [
    "c1-2.fox",
    "c1-3.fox",
    "c1-4.fox",
    "c2-2.fox",
    "c2-3.fox",
    "c2-4.fox",
    "c3-2.fox",
    "c3-3.fox",
    "c3-4.fox",
    "c5-2.fox",
    "c5-3.fox",
    "c5-4.fox",
]


def test_spec_example_expands_in_spec_order() -> None:
    assert expand("c[1-3,5]-[2-4].fox") == SPEC_EXAMPLE


def test_spec_example_compresses_back() -> None:
    assert compress(reversed(SPEC_EXAMPLE)) == ["c[1-3,5]-[2-4].fox"]


@pytest.mark.parametrize(
    ("noderange", "hosts"),
    [
        ("n[01-10]", ["n01", "n02", "n03", "n04", "n05", "n06", "n07", "n08", "n09", "n10"]),
        ("n[8-10]", ["n8", "n9", "n10"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("n[9-010]", ["n9", "n10"]),  # the high bound's padding does not count
        ("n[9,010-011]", ["n9", "n010", "n011"]),  # each range has its own width
        ("r[1-2]-n[1-3]", ["r1-n1", "r1-n2", "r1-n3", "r2-n1", "r2-n2", "r2-n3"]),
        ("gpu-[1-2,4]", ["gpu-1", "gpu-2", "gpu-4"]),
        ("n[5]", ["n5"]),
        ("n[0]", ["n0"]),
        ("[1-3]", ["1", "2", "3"]),
        ("rack[1-2].node", ["rack1.node", "rack2.node"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("n[1-2,4],m[3,5]x", ["n1", "n2", "n4", "m3x", "m5x"]),
        ("n[3,1]", ["n3", "n1"]),  # order as written
        ("n1,n1", ["n1", "n1"]),  # top-level repeats are kept, as `scontrol show hostnames` does
        ("node17", ["node17"]),
        ("login-1.cluster.example.org", ["login-1.cluster.example.org"]),
        ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ],
)
def test_expand_examples(noderange: str, hosts: list[str]) -> None:
    assert expand(noderange) == hosts
    assert is_valid(noderange)


@pytest.mark.parametrize(
    ("noderange", "fragment"),
    [
        ("None assigned", "placeholder for a job that has no nodes"),
        ("None allocated", "placeholder for a job that has no nodes"),
        ("", "is empty"),
        ("n[3-1]", "range '3-1' has its first number greater than its second"),
        ("n[1-3,2]", "number 2 is repeated in '[1-3,2]'"),
        ("n[1-3,3-5]", "number 3 is repeated"),
        ("n[1,1]", "number 1 is repeated"),
        ("n[1,01]", "number 1 is repeated"),
        ("n[[1-2]]", "nested '['"),
        ("n[1-[2]]", "nested '['"),
        ("n[1-2", "'[' at offset 1 is never closed"),
        ("n1-2]", "']' at offset 4 has no matching '['"),
        ("n[]", "empty brackets"),
        ("n[1,,2]", "empty range in '[1,,2]'"),
        ("n[,1]", "empty range"),
        ("n[1-]", "range '1-' in '[1-]' is not N or N-M"),
        ("n[-1]", "range '-1'"),
        ("n[a-b]", "range 'a-b'"),
        ("n[1-2-3]", "range '1-2-3'"),
        ("n[1:3]", "character ':'"),
        ("n[\u0661-\u0663]", "character"),  # Arabic-Indic digits are not decimal digits here
        ("n1,,n2", "item 2 is empty"),
        (",n1", "item 1 is empty"),
        ("n1,", "item 2 is empty"),
        ("n[1-2],", "item 2 is empty"),
        ("n 1", "whitespace at offset 1"),
        ("n1\n", "whitespace"),
        ("n1;n2", "character ';'"),
        ("n[1-2000000]", f"more than {MAX_HOSTS}"),
        ("n[1-2000]-[1-2000]", f"more than {MAX_HOSTS} host names"),
    ],
)
def test_expand_rejects_with_reason(noderange: str, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        expand(noderange)
    assert fragment in str(info.value)
    assert repr(noderange) in str(info.value)  # the message quotes the node range it is about
    assert not is_valid(noderange)


def test_expand_rejects_non_strings() -> None:
    with pytest.raises(TypeError):
        expand(None)  # type: ignore[arg-type]
    assert not is_valid(None)
    assert not is_valid(["n1"])


def test_too_many_names_across_items() -> None:
    half = MAX_HOSTS // 2 + 1
    with pytest.raises(ValueError, match="more than"):
        expand(f"a[1-{half}],b[1-{half}]")
    assert not is_valid(f"a[1-{half}],b[1-{half}]")
    assert is_valid(f"a[1-{half}]")


def test_expand_all() -> None:
    assert expand_all(["bigmem-[1-2]", "c1-29"]) == ["bigmem-1", "bigmem-2", "c1-29"]
    assert expand_all([]) == []


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        (["n01", "n02"], ["n[01-02]"]),
        (["n9", "n10"], ["n[9-10]"]),
        (["n09", "n10"], ["n[09-10]"]),
        (["n8", "n9", "n10", "n11"], ["n[8-11]"]),
        (["n099", "n100"], ["n[099-100]"]),
        (["n9", "n010"], ["n[9,010]"]),
        (["n1", "n01"], ["n1", "n01"]),  # same number twice cannot share a bracket group
        (["n1", "n01", "n2", "n02"], ["n[1-2]", "n[01-02]"]),
        (["c1-5", "c1-6", "c1-7", "c1-9"], ["c1-[5-7,9]"]),
        (["c1-5", "c2-5"], ["c[1-2]-5"]),
        (["gpu-1", "bigmem-2", "c1-29", "c1-30"], ["bigmem-2", "c1-[29-30]", "gpu-1"]),
        (["c2", "c10", "c3"], ["c[2-3,10]"]),
        (["login", "n1", "n1"], ["login", "n1"]),
        (["a", "b"], ["a", "b"]),
        (["n0", "n00"], ["n0", "n00"]),
        ([], []),
    ],
)
def test_compress_examples(hosts: list[str], expected: list[str]) -> None:
    assert compress(hosts) == expected
    assert sorted(expand_all(expected)) == sorted(set(hosts))


@pytest.mark.parametrize("bad", ["", "n[1-2]", "a,b", "None assigned", "n 1", "n1\n"])
def test_compress_rejects_non_hostnames(bad: str) -> None:
    with pytest.raises(ValueError, match="not a plain host name"):
        compress(["n1", bad])


# --- the real lists in the corpus ------------------------------------------------------------


def _envelopes(path: Path) -> Iterator[dict[str, Any]]:
    """Concatenated (pretty-printed or one-per-line) JSON documents, as PROVENANCE.md describes."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        doc, pos = decoder.raw_decode(text, pos)
        yield doc


def _cluster_lists() -> list[tuple[str, str]]:
    """(file, node range) for every ClusterPartition.nodes and ClusterNodes.names entry in the corpus."""
    found: list[tuple[str, str]] = []
    for path in sorted(SONAR_DIR.glob("*cluster*.json*")):
        for envelope in _envelopes(path):
            data = envelope.get("data", {})
            if data.get("type") != "cluster":
                continue
            attributes = data["attributes"]
            for partition in attributes.get("partitions", []):
                found.extend((path.name, r) for r in partition["nodes"])
            for group in attributes.get("nodes", []):
                found.extend((path.name, r) for r in group["names"])
    return found


CLUSTER_LISTS = _cluster_lists()


def test_corpus_has_cluster_lists() -> None:
    files = {name for name, _ in CLUSTER_LISTS}
    assert files == {
        "jobanalyzer__cluster1_cluster_v0.14.jsonl",
        "slurmmonitor__fox_cluster_v0.18.json",
        "sonar__fox_cluster_v0.16.json",
        "sonar__newfmt_cluster.json",
    }
    assert len(CLUSTER_LISTS) > 100


@pytest.mark.parametrize(("name", "noderange"), CLUSTER_LISTS, ids=[f"{n}:{r}" for n, r in CLUSTER_LISTS])
def test_corpus_cluster_list_expands(name: str, noderange: str) -> None:
    hosts = expand(noderange)
    assert hosts
    assert len(set(hosts)) == len(hosts)
    assert is_valid(noderange)
    # Sonar writes one node range per prefix, so each of its lists is already our canonical form.
    assert compress(hosts) == [noderange]


def test_corpus_known_partition() -> None:
    assert ("sonar__fox_cluster_v0.16.json", "gpu-[1-2,4-5,7-9,11-16]") in CLUSTER_LISTS
    gpus = (1, 2, 4, 5, 7, 8, 9, 11, 12, 13, 14, 15, 16)
    assert expand("gpu-[1-2,4-5,7-9,11-16]") == [f"gpu-{n}" for n in gpus]
    assert len(expand("c1-[5-28]")) == 24


def test_corpus_node_states_cover_the_partitions() -> None:
    """Within one cluster envelope, the union of ClusterNodes.names equals the union of partition nodes."""
    for path in sorted(SONAR_DIR.glob("*cluster*.json*")):
        for envelope in _envelopes(path):
            data = envelope.get("data", {})
            if data.get("type") != "cluster":
                continue
            attributes = data["attributes"]
            in_partitions = set(expand_all(r for p in attributes["partitions"] for r in p["nodes"]))
            with_state = set(expand_all(r for g in attributes["nodes"] for r in g["names"]))
            assert with_state == in_partitions, path.name


def test_corpus_sacct_nodelists() -> None:
    """sacct's NodeList column (5th) in a real Slurm dump: ranges expand; `None assigned` is refused."""
    placeholders = 0
    multi = 0
    for line in SACCT_SNOWMAN.read_text().splitlines():
        nodelist = line.split("\u2603")[4]
        if nodelist == "None assigned":
            placeholders += 1
            assert not is_valid(nodelist)
            continue
        hosts = expand(nodelist)
        multi += len(hosts) > 1
        assert compress(hosts) == [nodelist]
    assert placeholders == 10
    assert multi > 0
    assert expand("omni[19,21]") == ["omni19", "omni21"]


def test_corpus_job_nodes_none_assigned() -> None:
    """Older Sonar job records carry `nodes: ["None assigned"]` for pending jobs (FACTS.md)."""
    path = SONAR_DIR / "jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl"
    seen = []
    for envelope in _envelopes(path):
        for job in envelope["data"]["attributes"]["slurm_jobs"]:
            for noderange in job.get("nodes", []):
                seen.append(noderange)
                if noderange == "None assigned":
                    with pytest.raises(ValueError, match="placeholder"):
                        expand(noderange)
                else:
                    assert expand(noderange) == [noderange]
    assert "None assigned" in seen


# --- properties ------------------------------------------------------------------------------

# Small alphabets on purpose: they make shared prefixes, padding clashes (`1` vs `01`) and grids likely.
_text = st.text(alphabet="ab.-", max_size=2)
_digits = st.text(alphabet="0129", min_size=1, max_size=3)


@st.composite
def hostnames(draw: st.DrawFn) -> str:
    fields = draw(st.lists(st.tuples(_digits, _text), max_size=3))
    name = draw(_text) + "".join(d + t for d, t in fields)
    # a host name has no empty label and no label starting with `-` (schemas.names)
    return re.sub(r"(^|\.)-", r"\1x", re.sub(r"\.+", ".", name).strip(".")) or "x"


host_sets = st.sets(hostnames(), max_size=40)


@st.composite
def grids(draw: st.DrawFn) -> set[str]:
    """Whole or partial products like `c[1-3]-[2-4]`, so multi-dimensional folding gets exercised."""
    firsts = draw(st.sets(st.integers(0, 12), min_size=1, max_size=6))
    seconds = draw(st.sets(st.integers(0, 12), min_size=1, max_size=6))
    pad = draw(st.sampled_from([0, 2]))
    names = {f"c{a:0{pad}d}-{b}.x" for a in firsts for b in seconds}
    dropped = draw(st.sets(st.sampled_from(sorted(names)), max_size=3))
    return (names - dropped) or names


@settings(max_examples=300)
@given(host_sets)
def test_compress_round_trips(hosts: set[str]) -> None:
    ranges = compress(hosts)
    expanded = expand_all(ranges)
    assert set(expanded) == hosts
    assert len(expanded) == len(hosts)  # the node ranges do not overlap
    assert all(is_valid(r) for r in ranges)
    assert compress(expanded) == ranges  # canonical: a function of the set only
    assert compress(sorted(hosts, reverse=True)) == ranges


@settings(max_examples=200)
@given(grids())
def test_compress_grids(hosts: set[str]) -> None:
    ranges = compress(hosts)
    assert set(expand_all(ranges)) == hosts
    assert compress(expand_all(ranges)) == ranges
    assert len(ranges) <= len(hosts)


@settings(max_examples=300)
@given(host_sets)
def test_compress_expand_is_idempotent(hosts: set[str]) -> None:
    once = compress(expand(",".join(compress(hosts)))) if hosts else []
    twice = compress(expand(",".join(once))) if once else []
    assert once == twice


@st.composite
def bracket_ranges(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A random valid `prefix[ranges]suffix` and the hosts a straightforward model says it stands for."""
    prefix = draw(st.text(alphabet="abc-", max_size=3).map(lambda p: "x" + p if p.startswith("-") else p))
    # a suffix may not end in `.`, hold `..` (an empty label) nor start a label with `-` (schemas.names)
    suffix = draw(st.sampled_from(["", "x", "-", ".x", "x.x", "-x", "x-", "--", ".x-"]))
    numbers = sorted(draw(st.sets(st.integers(0, 120), min_size=1, max_size=8)))
    # cut the sorted numbers into runs, each run a range with its own width
    pieces: list[str] = []
    model: list[str] = []
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1 and draw(st.booleans()):
            j += 1
        width = draw(st.integers(1, 4))
        low, high = numbers[i], numbers[j]
        pieces.append(f"{low:0{width}d}" if i == j else f"{low:0{width}d}-{high}")
        model.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(low, high + 1))
        i = j + 1
    order = draw(st.permutations(range(len(pieces))))
    text = ",".join(pieces[k] for k in order)
    return f"{prefix}[{text}]{suffix}", model


@settings(max_examples=300)
@given(bracket_ranges())
def test_expand_matches_model(case: tuple[str, list[str]]) -> None:
    noderange, model = case
    assert sorted(expand(noderange)) == sorted(model)
    assert is_valid(noderange)


@settings(max_examples=200)
@given(st.lists(bracket_ranges(), min_size=1, max_size=4))
def test_expand_list_matches_model(cases: list[tuple[str, list[str]]]) -> None:
    """Top-level commas split items; commas inside brackets stay with their range."""
    noderange = ",".join(text for text, _ in cases)
    assert sorted(expand(noderange)) == sorted(h for _, model in cases for h in model)
    assert expand(noderange) == expand_all(text for text, _ in cases)


@settings(max_examples=500)
@given(st.text(alphabet="ab01-,[] \n.", max_size=12))
def test_expand_only_raises_value_error(text: str) -> None:
    try:
        hosts = expand(text)
    except ValueError as err:
        assert repr(text) in str(err)
        assert not is_valid(text)
    else:
        assert is_valid(text)
        assert hosts
        assert all(h and "[" not in h and "," not in h for h in hosts)
        assert set(expand_all(compress(hosts))) == set(hosts)
