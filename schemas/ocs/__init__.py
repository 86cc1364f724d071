"""Open Cluster Scheduler / Grid Engine: pure readers of accounting records (no file following here).

`accounting` parses one line (JSONL, or colon format through `colon`) into `record.AccountingRecord`; `merge` folds a job's
PE-task and intermediate records into one; `state` maps a record to a Slurm/Sonar job state.
"""

from hpcbus.schemas.ocs.accounting import parse_jsonl_line, parse_line, parse_usual
from hpcbus.schemas.ocs.colon import parse_colon_line
from hpcbus.schemas.ocs.merge import merge_job, merge_jobs
from hpcbus.schemas.ocs.record import KIND, AccountingRecord, is_skippable
from hpcbus.schemas.ocs.state import FAILED_CODES, STATES, job_state, requested_runtime

__all__ = [
    "FAILED_CODES",
    "KIND",
    "STATES",
    "AccountingRecord",
    "is_skippable",
    "job_state",
    "merge_job",
    "merge_jobs",
    "parse_colon_line",
    "parse_jsonl_line",
    "parse_line",
    "parse_usual",
    "requested_runtime",
]
