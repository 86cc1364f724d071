"""`hpcbus translate`: Sonar <-> line protocol through the CLI, in-process and as piped processes.

The round trip Sonar -> LP -> Sonar runs as two processes joined by a pipe and must give back every valid
envelope of the real corpus; bad input is reported exactly as `hpcbus validate` reports it while the good
input beside it is translated; a live stream comes out as it goes in; and a 200 MB input is translated in a
small fraction of its size in memory (peak RSS of the translating process, its `VmHWM`).
"""

from __future__ import annotations

import io
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from hpcbus import cli
from hpcbus.commands import validate
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.problems import InvalidInput
from hpcbus.schemas.sonar import decode_envelope, encode_envelope, iter_envelopes
from hpcbus.schemas.sonar.types import SampleEnvelope
from hpcbus.schemas.sonar.validate import Envelope
from hpcbus.schemas.translate import envelope_to_lines, format_shared
from tests.corpus import CORPUS
from tests.services import PeakRss

SONAR_FILES = sorted(p for p in (CORPUS / "sonar").iterdir() if p.suffix in (".json", ".jsonl"))
FOX = CORPUS / "sonar" / "slurmmonitor__fox_sample_slurmnode_v0.18.json"
GPU_NODE = CORPUS / "sonar" / "jobanalyzer__n1_sample_gpu_v0.14.jsonl"
TRANSLATE = [sys.executable, "-m", "hpcbus", "translate"]
BIG = 200_000_000
"""Bytes of generated input for the memory tests."""
MAX_RSS = 100 * 1024 * 1024
"""Peak RSS allowed for translating BIG bytes: half of it (the interpreter and the codecs alone take ~40 MB)."""


def envelopes_of(text: str) -> list[Envelope]:
    """Every valid envelope of a Sonar text, decoded (what is compared: structures, not JSON spelling)."""
    return [env for _, env in iter_envelopes(text) if not isinstance(env, InvalidInput)]


def lp_of(path: Path) -> str:
    return "".join(
        format_shared(line for env in envelopes_of(path.read_text()) for line in envelope_to_lines(env))
    )


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, list[str]]:
    code = cli.main(["translate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err.splitlines()


def same_envelopes(got: list[Envelope], want: list[Envelope]) -> bool:
    """Equal as multisets: envelopes of different kinds may come out in another order than they went in."""
    rest = list(got)
    for env in want:
        if env not in rest:
            return False
        rest.remove(env)
    return not rest


# --- the round trip through two processes ----------------------------------------------------------------


def test_corpus_round_trip_through_two_piped_processes(tmp_path: Path) -> None:
    """Every corpus file back to back in one input: `translate --to lp FILE | translate --to sonar -`."""
    both = tmp_path / "corpus.json"
    both.write_text("\n".join(p.read_text().strip() for p in SONAR_FILES) + "\n")
    with (tmp_path / "err").open("wb") as err:
        to_lp = subprocess.Popen([*TRANSLATE, "--to", "lp", str(both)], stdout=subprocess.PIPE, stderr=err)
    assert to_lp.stdout is not None
    back = subprocess.run(
        [*TRANSLATE, "--to", "sonar", "-"], stdin=to_lp.stdout, capture_output=True, timeout=120, check=False
    )
    to_lp.stdout.close()
    assert to_lp.wait(timeout=60) == 1  # the corpus holds envelopes Sonar's own reader rejects
    problems = [str(p) for p in validate.problems_of(str(both))]
    said = (tmp_path / "err").read_text().splitlines()
    warnings = [w for w in said if "warning: job " in w and "no start_job for cc-backend" in w]
    assert [w for w in said if w not in warnings] == problems and problems  # validate's words, in order
    assert warnings and all(re.match(rf"{re.escape(str(both))}:\d+: sonar job: warning", w) for w in warnings)
    assert (back.returncode, back.stderr) == (0, b"")

    want = envelopes_of(both.read_text())
    got = envelopes_of(back.stdout.decode())
    assert len(want) >= 20 and len(got) == len(want)
    assert same_envelopes(got, want)


# --- in process, through cli.main -------------------------------------------------------------------------


def test_to_lp_writes_the_bus_lines(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--to", "lp", str(FOX))
    assert (code, err) == (0, [])
    assert out == lp_of(FOX)
    assert len(out.splitlines()) == 361  # docs/mapping.md 4.2: 360 metric lines and the skeleton


def test_to_sonar_from_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    text = lp_of(GPU_NODE) + lp_of(FOX)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    code, out, err = run(capsys, "--to", "sonar")
    assert (code, err) == (0, [])
    got = [decode_envelope(line) for line in out.splitlines()]
    assert same_envelopes(got, envelopes_of(GPU_NODE.read_text()) + envelopes_of(FOX.read_text()))


def test_bad_lines_are_reported_like_validate_and_the_rest_is_translated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fox, gpu = lp_of(FOX), lp_of(GPU_NODE)
    f = tmp_path / "mixed.lp"
    f.write_bytes(
        fox.encode()
        + b"broken line\n"
        + b"mem_used,cluster=x,hostname=h\xff,type=node value=1 1700000000\n"  # not UTF-8
        + b"mem_used,cluster=x,type=node value=1 1700000000\n"  # no hostname
        + gpu.encode()
    )
    code, out, err = run(capsys, "--to", "sonar", str(f))
    assert code == 1
    assert err == [str(p) for p in validate.problems_of(str(f))]
    first_bad = fox.count("\n") + 1
    assert [line.split(": ")[0] for line in err] == [f"{f}:{first_bad + i}" for i in range(3)]
    assert "not UTF-8" in err[1]
    got = [decode_envelope(line) for line in out.splitlines()]
    assert same_envelopes(got, envelopes_of(FOX.read_text()) + envelopes_of(GPU_NODE.read_text()))


def test_bad_envelopes_are_reported_like_validate_and_the_rest_is_translated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = (CORPUS / "sonar" / "jobanalyzer__cluster1_sample_v0.19.jsonl").read_text().strip()
    bad = msgspec.json.decode(good)
    bad["data"]["attributes"]["jobs"][0]["processes"][0]["pid"] = -3
    f = tmp_path / "mixed.jsonl"
    f.write_text("\n".join([good, '{"meta": {', msgspec.json.encode(bad).decode(), good]) + "\n")
    code, out, err = run(capsys, "--to", "lp", str(f))
    assert code == 1
    assert err == [str(p) for p in validate.problems_of(str(f))]
    assert [line.split(": ")[0] for line in err] == [f"{f}:2", f"{f}:3"]
    parsed = parse_payload(out, now=0)
    assert parsed.problems == []
    [env] = envelopes_of(good)
    assert out == "".join(format_shared(envelope_to_lines(env))) * 2


def test_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "--to", "lp", str(tmp_path / "nope.json"))
    assert (code, out) == (2, "") and "No such file" in err[0]
    lp = tmp_path / "lines.lp"
    lp.write_text(lp_of(FOX))
    code, out, err = run(capsys, "--to", "sonar", str(FOX))
    assert (code, out) == (2, "") and err == [
        f"hpcbus translate: {FOX}: is Sonar JSON already; --to sonar reads line protocol"
    ]
    code, out, err = run(capsys, "--to", "lp", str(lp))
    assert (code, out) == (2, "") and "is line protocol already" in err[0]
    with pytest.raises(SystemExit) as exc:
        cli.main(["translate", str(lp)])  # --to is required
    assert exc.value.code == 2


def test_empty_input_is_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "empty.lp"
    f.write_text("\n# nothing yet\n\n")
    assert run(capsys, "--to", "sonar", str(f)) == (0, "", [])
    assert run(capsys, "--to", "lp", str(f)) == (0, "", [])


def test_cluster_names_lines_without_a_cluster_tag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ClusterCockpit collector without the router's cluster tag: `--cluster` says which cluster it is."""
    f = tmp_path / "cc.lp"
    f.write_text(
        "mem_used,hostname=node01,type=node value=12345678.0 1700000000\n"
        "load_one,hostname=node01,type=node value=3.25 1700000000\n"
        "mem_used,hostname=node01,type=node value=12345679.0 1700000060\n"
    )
    code, out, err = run(capsys, "--to", "sonar", "--cluster", "fox.example", str(f))
    assert (code, err) == (0, [])
    envs = [msgspec.json.decode(line, type=SampleEnvelope) for line in out.splitlines()]
    attrs = [e.data.attributes for e in envs if e.data is not None]
    assert [(a.cluster, a.node, a.time) for a in attrs] == [
        ("fox.example", "node01", "2023-11-14T22:13:20+00:00"),
        ("fox.example", "node01", "2023-11-14T22:14:20+00:00"),
    ]
    assert attrs[0].system.used_memory == 12345678 and attrs[0].system.load1 == 3.25


# --- live streams and big inputs, as separate processes ------------------------------------------------------


def test_a_live_stream_comes_out_as_it_goes_in() -> None:
    """Nothing waits for a buffer to fill or for the end of input: an envelope whose lines have arrived is
    written while the writer still holds the pipe open."""
    with subprocess.Popen(
        [*TRANSLATE, "--to", "sonar", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(lp_of(FOX).encode())
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready, "no envelope within 60 s while the input stayed open"
            assert [decode_envelope(proc.stdout.readline())] == envelopes_of(FOX.read_text())
            proc.stdin.close()
            assert proc.stdout.read() == b"" and proc.wait(timeout=60) == 0
        finally:
            proc.kill()


GENERATE = """
import sys
unit, old, copies = open(sys.argv[1], "rb").read(), sys.argv[2].encode(), int(sys.argv[3])
out = sys.stdout.buffer
for n in range(copies):
    out.write(unit.replace(old, b"n%0*d" % (len(old) - 1, n)))
"""


def _translate_generated(
    tmp_path: Path, unit: bytes, node: str, copies: int, to: str
) -> tuple[int, int, int]:
    """`python GENERATE | hpcbus translate --to TO -`, the generator writing `copies` times `unit` with the
    host name `node` renamed (same length) in each: (exit code, output lines, peak RSS of the translator)."""
    (tmp_path / "unit").write_bytes(unit)
    gen = subprocess.Popen(
        [sys.executable, "-c", GENERATE, str(tmp_path / "unit"), node, str(copies)], stdout=subprocess.PIPE
    )
    with (tmp_path / "err").open("wb") as err:
        translator = subprocess.Popen(
            [*TRANSLATE, "--to", to, "-"], stdin=gen.stdout, stdout=subprocess.PIPE, stderr=err
        )
    out = translator.stdout
    assert gen.stdout is not None and out is not None
    gen.stdout.close()  # the translator holds the read end now
    peak = PeakRss(translator.pid)
    try:
        lines = 0
        while block := out.read(1 << 20):
            lines += block.count(b"\n")
        peak.wait()
        _, status, _usage = os.wait4(translator.pid, 0)
        translator.returncode = os.waitstatus_to_exitcode(status)
        assert (tmp_path / "err").read_text() == ""  # before the generator's exit: it dies if this one did
        assert gen.wait(timeout=60) == 0
    finally:
        for proc in (gen, translator):
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    return translator.returncode, lines, peak.bytes


def test_200_mb_of_line_protocol_in_constant_memory(tmp_path: Path) -> None:
    """200 MB of a Slurm node's samples (the corpus node, 280 lines each, renamed per copy) -> JSONL."""
    unit = lp_of(FOX).encode()
    copies = -(-BIG // len(unit))
    code, lines, peak = _translate_generated(tmp_path, unit, "c1-10.fox", copies, "sonar")
    assert (code, lines) == (0, copies)
    assert 10 * 2**20 < peak < MAX_RSS, f"peak RSS {peak / 2**20:.0f} MiB for {BIG / 1e6:.0f} MB of input"


def test_200_mb_of_sonar_json_in_constant_memory(tmp_path: Path) -> None:
    """200 MB of JSONL (a GPU node's sysinfo, renamed per copy, and Slurm's 301-job envelope) -> LP."""
    sysinfo = (CORPUS / "sonar" / "jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl").read_bytes().split(b"\n")[0]
    [jobs] = envelopes_of((CORPUS / "slurm" / "sonar_sacct_output_expected-sonar-json.json").read_text())
    unit = (sysinfo + b"\n") * 20 + encode_envelope(jobs) + b"\n"
    per_unit = sum(len(envelope_to_lines(env)) for env in envelopes_of(unit.decode()))
    copies = -(-BIG // len(unit))
    code, lines, peak = _translate_generated(tmp_path, unit, "n1.cluster1.uio.no", copies, "lp")
    assert (code, lines) == (0, copies * per_unit)
    assert 10 * 2**20 < peak < MAX_RSS, f"peak RSS {peak / 2**20:.0f} MiB for {BIG / 1e6:.0f} MB of input"


def test_cc_backend_warnings_are_printed_and_the_envelope_still_translated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A started job without user and nodes gets no start_job (cc-backend would reject it): `translate`
    says so on stderr as a warning naming the file, as `consume sonar` does, and still writes the job's
    envelope event; exit 0 (a warning is not an error)."""
    envelope = {
        "meta": {"producer": "sonar", "version": "0.19.0"},
        "data": {
            "type": "jobs",
            "attributes": {
                "time": "2026-11-23T10:00:00Z",
                "cluster": "c1",
                "slurm_jobs": [
                    {
                        "job_id": 42,
                        "job_step": "",
                        "job_name": "x",
                        "job_state": "RUNNING",
                        "start_time": "2026-11-23T09:00:00Z",
                    }
                ],
            },
        },
    }
    src = tmp_path / "jobs.json"
    src.write_bytes(msgspec.json.encode(envelope) + b"\n")
    code, out, err = run(capsys, "--to", "lp", str(src))
    assert code == 0
    assert out.startswith("slurm,")
    assert [e for e in err if "job 42: no start_job for cc-backend" in e and f"{src}:1:" in e], err
