"""Sonar envelope decode+validate against bare (untyped) `msgspec.json.decode` of the same bytes."""

from __future__ import annotations

import msgspec

from bench.timing import best_of, report
from hpcbus.schemas.sonar import decode_envelope
from tests.corpus import CORPUS

FILES = {
    "sample (128 cpus, Slurm node)": CORPUS / "sonar/slurmmonitor__fox_sample_slurmnode_v0.18.json",
    "jobs (301 sacct records)": CORPUS / "slurm/sonar_sacct_output_expected-sonar-json.json",
}
REPEATS = 200


def run() -> list[str]:
    out = []
    for name, path in FILES.items():
        raw = path.read_bytes().strip()
        decode_envelope(raw)  # valid input: the comparison is about the cost of checking it

        def bare(raw: bytes = raw) -> None:
            for _ in range(REPEATS):
                msgspec.json.decode(raw)

        def ours(raw: bytes = raw) -> None:
            for _ in range(REPEATS):
                decode_envelope(raw)

        out.append(
            report(f"Sonar {name} decode+validate", best_of(ours), best_of(bare), REPEATS, "envelopes")
        )
    return out
