"""The node agent's fixture trees (tests/fixtures/node/<case>: the /proc and /sys files of real machines,
see its PROVENANCE.md) and a writable copy of one for a test to change."""

from __future__ import annotations

import shutil
from pathlib import Path

FIX = Path(__file__).parent / "fixtures" / "node"


def tree(tmp_path: Path, case: str = "hpc") -> Path:
    """A copy of fixture `case` under `tmp_path`, as the collector's root."""
    root = tmp_path / case
    shutil.copytree(FIX / case, root)
    return root
