"""The optional C extensions (everything else is in pyproject.toml): the compiled line-protocol scan and the
compiled OCS accounting reader.

`optional=True`: where no compiler or Python headers are there, setuptools warns and installs the pure
path (`hpcbus.schemas.lineprotocol.scan`, `hpcbus.schemas.ocs.accounting` fall back to it; `hpcbus
--version` says which is in use).
Stable ABI (abi3, Python 3.11+): one wheel serves every later CPython of its platform. `HPCBUS_PURE=1` at
build time leaves the extension out and makes a pure `py3-none-any` wheel (deploy/dist.sh, for a
wheelhouse of another platform, where a wheel compiled here would not install).
"""

import os

from setuptools import Extension, setup

if os.environ.get("HPCBUS_PURE") == "1":
    setup()
else:
    setup(
        ext_modules=[
            Extension(
                "hpcbus.schemas.lineprotocol._scan",
                ["schemas/lineprotocol/_scan.c"],
                optional=True,
                py_limited_api=True,
            ),
            Extension(
                "hpcbus.schemas.ocs._read",
                ["schemas/ocs/_read.c"],
                optional=True,
                py_limited_api=True,
            ),
        ],
        options={"bdist_wheel": {"py_limited_api": "cp311"}},  # the wheel is tagged cp311-abi3
    )
