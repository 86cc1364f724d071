"""The records of each OCS job (array task) merged across polls into one `JobUpdate` per job and poll.

A job's accounting lines come over several polls: PE tasks of a tightly integrated parallel job, intermediate
records of a long job (`exit_status` -1), a requeued job. `JobMerger` keeps the parts of each open job
(bounded: `max_jobs` jobs of `max_parts` parts, PE tasks folded beyond that) and answers, per poll, the
merged record and whether the job ended (now); `mapping` turns updates into Sonar records and cc-backend
events (see its module docstring). Compiled where the extension is built (`_read.merge_add`).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable
from typing import Final

import msgspec

from hpcbus.schemas.native import extension
from hpcbus.schemas.ocs import AccountingRecord, job_state, merge_job

__all__ = ["INTERMEDIATE_EXIT", "JobMerger", "JobUpdate"]

INTERMEDIATE_EXIT: Final = frozenset({-1, 2**32 - 1})
"""`exit_status` of an intermediate record: qmaster writes -1 as an unsigned 32-bit number."""
_read = extension("hpcbus.schemas.ocs._read")
"""The compiled merger (`_read.c`), None on the pure path (no compiler at install, or `HPCBUS_PURE=1`)."""


class JobUpdate(msgspec.Struct, frozen=True, gc=False):
    """A job (array task) as known after a poll (a struct: built once per job and poll, in C)."""

    record: AccountingRecord
    """Every record of the job seen so far (still remembered), merged."""
    ended: bool
    """A final record of the master task (not a PE task, not intermediate) is among them."""
    final_now: bool
    """That final record came in this poll: the moment to tell cc-backend the job stopped."""
    first_line: int = 0
    """Line number of the first of this poll's records of the job (for problems)."""


def _is_final(record: AccountingRecord) -> bool:
    return record.pe_taskid is None and record.exit_status not in INTERMEDIATE_EXIT


class JobMerger:
    """Merges the records of each job across polls; memory bounded by `max_jobs` x `max_parts`."""

    def __init__(self, *, max_jobs: int = 4096, max_parts: int = 1000) -> None:
        self.max_jobs = max(1, max_jobs)
        self.max_parts = max(2, max_parts)
        self._open: OrderedDict[tuple[int, int], list[AccountingRecord]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, records: Iterable[AccountingRecord], lines: Iterable[int] = ()) -> list[JobUpdate]:
        """One update per job among `records`, in order of first appearance.

        `lines` (optional, parallel to `records`) are the records' line numbers, reported in `first_line`.
        Compiled where the extension is built (`_read.merge_add`: the job of one new record, nothing
        earlier, in C; every other by `_update`).
        """
        if _read is not None:
            return _read.merge_add(self, list(records), list(lines), JobUpdate)
        return self.add_pure(records, lines)

    def add_pure(self, records: Iterable[AccountingRecord], lines: Iterable[int] = ()) -> list[JobUpdate]:
        """`add` in Python: the reference of the compiled one."""
        groups: dict[tuple[int, int], tuple[int, list[AccountingRecord]]] = {}
        for record, number in zip(records, itertools.chain(lines, itertools.repeat(0)), strict=False):
            key = (record.job_number, record.task_number)
            group = groups.get(key)
            if group is None:
                groups[key] = (number, [record])
            else:
                group[1].append(record)
        opened = self._open
        return [self._update(key, first, new, opened.pop(key, None)) for key, (first, new) in groups.items()]

    def _update(
        self,
        key: tuple[int, int],
        first: int,
        new: list[AccountingRecord],
        parts: list[AccountingRecord] | None,
    ) -> JobUpdate:
        """The update of job `key` from this poll's records `new` (the first at line `first`) and the `parts`
        seen before (popped from `_open`; None when none), which it puts back while the job may get more."""
        if (
            parts is None and len(new) == 1
        ):  # the common job: one line, nothing earlier (merge_job's own result)
            merged = new[0]
            ended = final_now = _is_final(merged)
            parts = new
        else:
            if parts is None:
                parts = new
            else:
                parts.extend(new)  # popped from `opened`: no one else holds this list
            if len(parts) > self.max_parts:
                parts = _collapse(parts)
            merged = merge_job(parts)
            ended = any(_is_final(p) for p in parts)
            final_now = any(_is_final(p) for p in new)
        if not ended or merged.granted_pe is not None or job_state(merged) == "REQUEUED":
            opened = self._open
            opened[key] = parts
            while len(opened) > self.max_jobs:
                opened.popitem(last=False)
        return JobUpdate(merged, ended, final_now, first)


def _collapse(parts: list[AccountingRecord]) -> list[AccountingRecord]:
    """Fold the PE-task parts into one (still marked as a PE task, so it never counts as the master)."""
    tasks = [p for p in parts if p.pe_taskid is not None]
    masters = [p for p in parts if p.pe_taskid is None]
    if len(tasks) < 2:
        return parts
    folded = msgspec.structs.replace(merge_job(tasks), pe_taskid="*")
    return [*masters, folded]
