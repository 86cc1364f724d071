"""`make test` runs the codec and sink tests on both paths (issue 24): the whole suite on the compiled path
where it is built, then the `both_paths` tests again with `HPCBUS_PURE=1`. Checked here so that a renamed
test module or an edited recipe cannot drop the pure-path run silently."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

from hpcbus.schemas.native import ALL_COMPILED, EXTENSIONS
from tests.conftest import BOTH_PATHS

ROOT = Path(__file__).resolve().parents[1]


def test_make_test_runs_the_both_paths_tests_again_on_the_pure_path() -> None:
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe is not None
    commands = [line.strip() for line in recipe.group(1).splitlines()]
    assert commands == [
        "$(BIN)/python -m pytest -q",
        "HPCBUS_PURE=1 $(BIN)/python -m pytest -q -m both_paths",
    ]


def test_every_pattern_names_test_modules_and_none_compares_the_paths_itself() -> None:
    names = [p.name for p in (ROOT / "tests").glob("test_*.py")]
    for pattern in BOTH_PATHS:
        assert fnmatch.filter(names, pattern), f"{pattern} matches no test module"
    chosen = {n for n in names if any(fnmatch.fnmatch(n, p) for p in BOTH_PATHS)}
    assert not {n for n in chosen if n.startswith("test_compiled_")}
    assert {"test_lineprotocol.py", "test_consume_influx.py", "test_translate_corpus.py"} <= chosen
    assert len(chosen) >= 30


def test_the_docs_name_every_extension() -> None:
    """docs/development.md's table has a row per extension of `EXTENSIONS`, and docs/deploy.md quotes what
    `hpcbus --version` says on a compiled install."""
    development = (ROOT / "docs" / "development.md").read_text()
    for name in EXTENSIONS:
        assert f"| `{name.removeprefix('hpcbus.').replace('.', '/')}.c` |" in development, name
    deploy = " ".join((ROOT / "docs" / "deploy.md").read_text().split())
    assert f"`hpcbus 0.1.0 ({ALL_COMPILED})`" in deploy
