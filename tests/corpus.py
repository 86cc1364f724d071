"""Where the shared reference corpus lives; tests read it in place (never copied into the repo)."""

from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
CORPUS = SHARED / "corpus"
SPEC = SHARED / "spec"
