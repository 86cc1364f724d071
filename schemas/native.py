"""The optional C extensions of the hot paths: which are built, and which are in use.

Each hot path keeps its Python source as the reference and may have a compiled twin, a C extension on the
stable ABI built by setup.py when a compiler is there (`optional=True`). A module that has one asks
`extension(name)` once at import and falls back to its pure path on None. `HPCBUS_PURE=1` in the
environment switches every extension off (tests compare both paths, an admin can rule the compiled code
out); `implementation()` is what `hpcbus --version` prints.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

EXTENSIONS: dict[str, str] = {
    "hpcbus.schemas.lineprotocol._scan": "lineprotocol scan",
    "hpcbus.schemas._influxdb": "InfluxDB splice",
    "hpcbus.schemas.translate._place": "LP->Sonar read",
    "hpcbus.schemas.slurm.sacct._sacct": "sacct reader",
    "hpcbus.schemas.translate._write": "Sonar->LP write",
    "hpcbus.schemas.ocs._read": "OCS accounting read",
}
"""Every extension setup.py may build (its import name) and what it compiles (words for `--version`)."""

ALL_COMPILED = "compiled: " + ", ".join(EXTENSIONS.values())
"""What `implementation()` says where every extension is built (`make install` with gcc there)."""

PURE = "HPCBUS_PURE"
"""Environment variable: `1` runs every hot path on its pure-Python path."""


def pure_asked() -> bool:
    return os.environ.get(PURE) == "1"


def extension(name: str) -> ModuleType | None:
    """The extension `name` (one of `EXTENSIONS`) when it was built and the pure path is not asked for."""
    if name not in EXTENSIONS:
        raise KeyError(f"{name} is not one of hpcbus's extensions (schemas.native.EXTENSIONS)")
    if pure_asked():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def implementation() -> str:
    """`compiled: lineprotocol scan, ...` (the extensions in use), `compiled: none of ...`, or `pure Python`
    when `HPCBUS_PURE=1` asks for it."""
    if pure_asked():
        return "pure Python: HPCBUS_PURE=1"
    used = [words for name, words in EXTENSIONS.items() if extension(name) is not None]
    if not used:
        return "pure Python"
    missing = [words for name, words in EXTENSIONS.items() if extension(name) is None]
    text = "compiled: " + ", ".join(used)
    return text + (f"; pure: {', '.join(missing)}" if missing else "")
