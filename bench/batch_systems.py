"""Master-node producers: sacct output parsed into Sonar records, and an OCS accounting file ingested.

Baselines in the same run: splitting the same sacct lines on their delimiter (the least any parser does),
and bare `json.loads` per line of the same accounting file.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.ocs_ingest import bench_baseline, bench_ingest, check_output, sample_lines, write_sample
from bench.slurm_corpus import changes_rate, check_sacct_output, corpus_files, sacct_rate
from bench.timing import verdict
from hpcbus.schemas.ocs import accounting

REPEAT = 50
SACCT_TARGET = 0.20
"""sacct -> records at least this fraction of bare `str.split`'s rate on the same lines (issue 24)."""
OCS_RECORDS = 30_000
OCS_TARGET = 0.60
"""Issue 24: the OCS ingest (compiled path) at least 0.6x of bare `json.loads` of the same lines."""


def _split_baseline() -> tuple[int, float]:
    files = corpus_files()
    texts = [(f.text, f.delimiter) for f in files]
    started = time.process_time()  # CPU time, as `sacct_rate` measures
    rows = 0
    for _ in range(REPEAT):
        for text, delimiter in texts:
            for line in text.splitlines():
                line.split(delimiter)
                rows += 1
    return rows, time.process_time() - started


def _rate(fn: Callable[[], tuple[int, float]]) -> tuple[int, float]:
    """The fastest of three runs (the machine is noisy)."""
    best = (0, float("inf"))
    for _ in range(3):
        n, t = fn()
        if t < best[1]:
            best = (n, t)
    return best


def run() -> list[str]:
    check_sacct_output()  # the compiled sacct reader gives the pure path's rows and records
    (n, t), (bn, bt) = (0, float("inf")), (0, float("inf"))
    for _ in range(5):  # interleaved: both sides see the same load
        n, t = min((n, t), sacct_rate(REPEAT), key=lambda r: r[1])
        bn, bt = min((bn, bt), _split_baseline(), key=lambda r: r[1])
    sacct_ratio = (n / t) / (bn / bt)
    cn, ct = _rate(lambda: changes_rate(REPEAT))
    # the typed decode gives the records the key-by-key reader gives, on the benchmark's own records
    sample = sample_lines(OCS_RECORDS)
    assert [accounting.parse_jsonl_line(x) for x in sample] == [
        accounting._parse_jsonl_keys(x) for x in sample
    ]
    # the whole fast path (compiled reader, merger and mapping where built; typed decode, direct records, event
    # text) publishes what the general path does, and what the pure-Python path does
    with tempfile.TemporaryDirectory(prefix="hpcbus-ocs-check-") as tmp:
        write_sample(Path(tmp) / "accounting.jsonl", OCS_RECORDS)
        check_output(Path(tmp) / "accounting.jsonl")
    inf = float("inf")
    (on, ot), (jn, jt), (pn, pt) = (0, inf), (0, inf), (0, inf)
    for _ in range(3):  # interleaved: every side sees the same load
        on, ot = min((on, ot), bench_ingest(OCS_RECORDS), key=lambda r: r[1])
        jn, jt = min((jn, jt), bench_baseline(OCS_RECORDS), key=lambda r: r[1])
        pn, pt = min((pn, pt), bench_ingest(OCS_RECORDS, pure=True), key=lambda r: r[1])
    ratio = (on / ot) / (jn / jt)
    path = (
        "compiled"
        if accounting.parse_usual_lines is not None
        else "pure: extension not built or HPCBUS_PURE=1"
    )
    return [
        f"{'sacct output -> Sonar SlurmJob records':<56} {n / t:>12,.0f} records/s  baseline {bn / bt:>12,.0f} "
        f"lines/s (str.split)  ratio {sacct_ratio:5.2f}x  target >= {SACCT_TARGET:.2f}x: "
        f"{verdict(sacct_ratio >= SACCT_TARGET)}",
        f"{'Slurm changed-fields filter':<56} {cn / ct:>12,.0f} records/s",
        f"{'OCS accounting file ingest (JSONL -> bus messages)':<56} {on / ot:>12,.0f} records/s  baseline "
        f"{jn / jt:>12,.0f} records/s (json.loads)  ratio {ratio:5.2f}x  target >= {OCS_TARGET:.2f}x: "
        f"{verdict(ratio >= OCS_TARGET)} ({path})",
        f"{'OCS accounting file ingest, pure-Python path':<56} {pn / pt:>12,.0f} records/s  baseline "
        f"{jn / jt:>12,.0f} records/s (json.loads)  ratio {(pn / pt) / (jn / jt):5.2f}x  (before issue 24)",
    ]
