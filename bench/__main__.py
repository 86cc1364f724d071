"""Run every benchmark module listed here and print one line per measurement."""

from __future__ import annotations

import importlib
import sys

BENCHMARKS = [
    "bench.lineprotocol",
    "bench.sonar",
    "bench.translate",
    "bench.consumer",
    "bench.node",
    "bench.batch_systems",
]


def main() -> int:
    print(
        f"hpcbus benchmarks (python {sys.version.split()[0]}); rates are best of 5, ratios vs same-run baseline"
    )
    for name in BENCHMARKS:
        for line in importlib.import_module(name).run():
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
