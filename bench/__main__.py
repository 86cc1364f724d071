"""Run every benchmark module listed here and print one line per measurement."""

from __future__ import annotations

import importlib
import os
import sys

BENCHMARKS = [
    "bench.lineprotocol",
    "bench.compiled",
    "bench.sonar",
    "bench.translate",
    "bench.consumer",
    "bench.node",
    "bench.batch_systems",
    "bench.gateway",
    "bench.scale",
    "bench.status",
]


def main() -> int:
    print(
        f"hpcbus benchmarks (python {sys.version.split()[0]}); rates are best of 5 or more, ratios vs a "
        f"baseline measured in the same run; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    )
    for name in BENCHMARKS:
        for line in importlib.import_module(name).run():
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
