"""`make schemas`: write the Sonar JSON Schema files `schemas/json/*.schema.json` from the structs.

`schemas.sonar.jsonschema` builds the texts (no I/O there); this writes them, or with `--check` only compares
and names the stale files (exit status 1), which is what `tests/test_sonar_jsonschema.py` relies on to fail
when the structs in `schemas/sonar/types/` changed without a `make schemas`. Run as `python -m hpcbus.commands.dev.schemas`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hpcbus import schemas
from hpcbus.schemas.sonar import jsonschema

OUT_DIR = Path(schemas.__file__).resolve().parent / "json"
"""`schemas/json/`, shipped as package data (see pyproject.toml)."""


def expected_files() -> dict[Path, str]:
    """Every schema file and the text it must have."""
    return {OUT_DIR / name: text for name, text in jsonschema.files().items()}


def stale_files() -> list[Path]:
    """The schema files that are missing or differ from what the structs generate."""
    return [
        path
        for path, text in expected_files().items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def main(argv: list[str] | None = None) -> int:
    """Write (or with `--check`, compare) the schema files; exit status 1 when `--check` finds drift."""
    args = sys.argv[1:] if argv is None else argv
    if "--check" in args:
        stale = stale_files()
        for path in stale:
            print(f"{path}: out of date; run `make schemas`", file=sys.stderr)
        return 1 if stale else 0
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for path, text in expected_files().items():
        path.write_text(text, encoding="utf-8")
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
