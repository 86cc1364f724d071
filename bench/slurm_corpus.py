"""How fast sacct output becomes Sonar records, measured on the real corpus (for `make bench`).

`sacct_rate()` parses and converts every sacct file of `../shared/corpus/slurm` `repeat` times and returns
(records, seconds): what one poll of a big site costs us beyond sacct's own run time; on the compiled reader
when it is built (`schemas/slurm/sacct/_sacct.c`), whose output `check_sacct_output()` holds against the pure
path's before anything is timed. `changes_rate()` adds
the state filter (digests per field), which runs on every record of every poll. Both are plain functions so
`bench/` can report them as ratios against its same-run baselines.

The zone is a fixed offset (`TZ=CET-2`, as Sonar's own sacct test runs), the parser's fast path; a zone with
DST costs more per distinct timestamp (see `schemas.slurm.values.timestamp_parser`).
"""

from __future__ import annotations

import time
from datetime import timedelta, timezone
from pathlib import Path
from typing import Final

from hpcbus.producers.slurm.state import SlurmState
from hpcbus.schemas.slurm.sacct import SACCT_FIELDS, SacctRow, parse_sacct, to_slurm_job
from hpcbus.schemas.slurm.sacct.parse import parse_sacct_pure
from hpcbus.schemas.slurm.sacct.render import to_slurm_job_pure
from hpcbus.schemas.sonar.types import SlurmJob
from tests.corpus import HB_JOBINFO_FIELDS, SLURM_CORPUS

__all__ = ["changes_rate", "check_sacct_output", "corpus_files", "sacct_rate"]


TZ: Final = timezone(timedelta(hours=2))


class CorpusFile:
    """One sacct capture and how to read it."""

    def __init__(self, path: Path, fields: list[str] | tuple[str, ...], delimiter: str, trailing: bool):
        self.path = path
        self.text = path.read_text()
        self.fields = fields
        self.delimiter = delimiter
        self.trailing = trailing

    def rows(self) -> list[SacctRow]:
        return [
            item
            for item in parse_sacct(
                self.text, self.fields, TZ, delimiter=self.delimiter, trailing_delimiter=self.trailing
            )
            if isinstance(item, SacctRow)
        ]


def corpus_files(corpus: Path = SLURM_CORPUS) -> list[CorpusFile]:
    """The three sacct captures of the corpus (Sonar's two `-P` files and hb-jobinfo's `--parsable`)."""
    return [
        CorpusFile(corpus / "sonar_sacct-output_completed.txt", SACCT_FIELDS, "|", False),
        CorpusFile(corpus / "sonar_sacct_output_running-pending.txt", SACCT_FIELDS, "|", False),
        CorpusFile(corpus / "hb-jobinfo_sacct_snowman-delimited.txt", HB_JOBINFO_FIELDS, "☃", True),
    ]


def _convert(files: list[CorpusFile]) -> list[SlurmJob]:
    out = []
    for f in files:
        for row in f.rows():
            try:
                out.append(to_slurm_job(row))
            except ValueError:
                continue
    return out


def check_sacct_output(corpus: Path = SLURM_CORPUS) -> None:
    """Assert that what `sacct_rate` times (the compiled reader when it is built) gives the pure path's
    rows, problems and records on every corpus file, types included (an int is never a float)."""
    for f in corpus_files(corpus):
        kw = {"delimiter": f.delimiter, "trailing_delimiter": f.trailing}
        fast = list(parse_sacct(f.text, f.fields, TZ, **kw))
        pure = list(parse_sacct_pure(f.text, f.fields, TZ, **kw))
        assert fast == pure, f"{f.path.name}: the compiled sacct reader's rows differ from the pure path's"
        assert repr(fast) == repr(pure), f"{f.path.name}: rows of other types than the pure path's"
        for row in pure:
            if isinstance(row, SacctRow):
                a, b = to_slurm_job(row), to_slurm_job_pure(row)
                assert a == b and repr(a) == repr(b), f"{f.path.name}:{row.line}: records differ"


def sacct_rate(repeat: int = 200, corpus: Path = SLURM_CORPUS) -> tuple[int, float]:
    """(records produced, CPU seconds) for parsing + converting every corpus file `repeat` times."""
    files = corpus_files(corpus)
    records = 0
    started = time.process_time()  # CPU time: a neighbour's load does not count (bench.timing.best_of)
    for _ in range(repeat):
        records += len(_convert(files))
    return records, time.process_time() - started


def changes_rate(repeat: int = 200, corpus: Path = SLURM_CORPUS) -> tuple[int, float]:
    """(records filtered, seconds) for `SlurmState.changes` over the corpus records: each round starts
    with an empty state (every field is new) and then sees the same records again (nothing changed), the
    two cases of every poll."""
    records = _convert(corpus_files(corpus))
    count = 0
    started = time.perf_counter()
    for _ in range(repeat):
        state = SlurmState("bench")
        for now in (1, 2):
            for record in records:
                state.changes(record, now)
            count += len(records)
    return count, time.perf_counter() - started
