"""The optional C extensions (everything else is in pyproject.toml): the compiled twins of the hot paths.

The extensions are those of `schemas/native.py` (`EXTENSIONS`, read here as a file: the one list), each
built from the `.c` file its import name gives (`hpcbus.schemas.translate._place` ->
`schemas/translate/_place.c`). `optional=True`: where no compiler or Python headers are there, setuptools
warns and installs the pure path (each module falls back to it; `hpcbus --version` says which is in use).
Stable ABI (abi3, Python 3.11+): one wheel serves every later CPython of its platform. `HPCBUS_PURE=1` at
build time leaves the extensions out and makes a pure `py3-none-any` wheel (deploy/dist.sh, for a
wheelhouse of another platform, where a wheel compiled here would not install).
"""

import os
import runpy
from pathlib import Path

from setuptools import Extension, setup


def extensions() -> list[Extension]:
    names = runpy.run_path("schemas/native.py")["EXTENSIONS"]
    return [
        Extension(
            name,
            [name.removeprefix("hpcbus.").replace(".", "/") + ".c"],
            include_dirs=["schemas"],  # the headers the extensions share (schemas/_*.h)
            extra_compile_args=["-g0"],  # no debug info: a node's install stays small (docs/deploy.md)
            depends=[str(path) for path in Path("schemas").glob("_*.h")],
            optional=True,
            py_limited_api=True,
        )
        for name in names
    ]


if os.environ.get("HPCBUS_PURE") == "1":
    setup()
else:
    setup(
        ext_modules=extensions(),
        options={"bdist_wheel": {"py_limited_api": "cp311"}},  # the wheel is tagged cp311-abi3
    )
