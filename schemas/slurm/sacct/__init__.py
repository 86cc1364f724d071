"""`sacct` output -> typed rows -> Sonar `SlurmJob` records.

Two text forms are read (normally run with `--noheader`; a header line is skipped anyway):
- `sacct -aP --noheader -o <fields>` (what Sonar runs): `|` between fields, nothing after the last one.
- `sacct --parsable --noheader --delimiter=X -o <fields>` (`-p`, e.g. hb-jobinfo's `☃` files): a delimiter
  after *every* field, so each line ends with one; pass `trailing_delimiter=True`.
A free-text column (JobName, Comment, ...) may itself contain the delimiter; when it is the last column the
excess parts are joined back into it (Sonar puts JobName last for exactly this reason).

Parsing and conversion are split: `parse_sacct` validates every column once and yields a `SacctRow` (or a
`Problem` naming the line and column, and goes on with the next line); `to_slurm_job` renders a row exactly
as Sonar 0.18.1 does (`sonar_compat=True`), or by default with Sonar's two data-losing bugs fixed while its
wire conventions (seconds in `time_limit`, omitted zeros, ...) are kept, since consumers of Sonar data
expect them. The differences are listed in `to_slurm_job`'s docstring and asserted by
tests/test_slurm_sacct.py.

Speed: the field list is turned into per-column parser lists once per call (`columns.Plan`), and the
parsers of columns whose values repeat (zeros, a job's times and nodes on each of its steps) are memoized
for the duration of one `parse_sacct` call. Where it is built, the compiled reader (`_sacct.c`, loaded by
`compiled`) parses the lines and renders the default `to_slurm_job` form in C, about 5x less CPU per
record; every line or row it is not sure of goes to the pure code, which stays the reference
(`parse.parse_sacct_pure`, `render.to_slurm_job_pure`; equal output: tests/test_compiled_sacct.py).

Layout: `command` (Sonar's sacct command and field list), `row` (`SacctRow`), `columns` (the per-column
parsers and the plan made from a field list), `parse` (the line loop), `render` (`to_slurm_job`) and
`compiled` (what the C reader is told).
Import from `schemas.slurm.sacct`.
"""

from hpcbus.schemas.slurm.sacct.command import SACCT_FIELDS, SACCT_STATES, sacct_argv
from hpcbus.schemas.slurm.sacct.parse import parse_sacct, parse_sacct_line
from hpcbus.schemas.slurm.sacct.render import to_slurm_job
from hpcbus.schemas.slurm.sacct.row import SacctRow

__all__ = [
    "SACCT_FIELDS",
    "SACCT_STATES",
    "SacctRow",
    "parse_sacct",
    "parse_sacct_line",
    "sacct_argv",
    "to_slurm_job",
]
