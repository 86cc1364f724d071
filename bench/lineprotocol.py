"""CC line parse+validate against bare `line_protocol_parser.parse_line` on the same 200k lines.

Both sides get the lines as 1000-line NATS payloads (a producer's message), so neither keeps 200k results
alive at once; the baseline only splits, parses and keeps the
dicts until the message is done; ours also checks the CC rules and builds `Line`s.
"""

from __future__ import annotations

from line_protocol_parser import parse_line

from bench.timing import interleaved, report
from hpcbus.schemas.lineprotocol import format_lines, parse_payload

N_LINES = 200_000


def sample_payload(n: int = N_LINES) -> str:
    """Lines as a 128-hwthread node sends them: per-hwthread CPU, node memory/load, GPU, ns timestamps."""
    out: list[str] = []
    ts = 1_740_027_951_000_000_000
    i = 0
    while len(out) < n:
        host = f"c{i % 64:03d}"
        for cpu in range(128):
            out.append(
                f"cpu_user,cluster=fox,hostname={host},type=hwthread,type-id={cpu} value={cpu * 0.37:.2f} {ts}"
            )
        out.append(f"mem_used,cluster=fox,hostname={host},type=node,type-id=0 value=123456789i {ts}")
        out.append(f"load_one,cluster=fox,hostname={host},type=node value=12.5 {ts}")
        for g in range(4):
            out.append(
                f"nv_util,cluster=fox,hostname={host},type=accelerator,type-id=00000000:{g + 1:02x}:00.0 value=87 {ts}"
            )
        i += 1
        ts += 30_000_000_000
    return "\n".join(out[:n]) + "\n"


def run() -> list[str]:
    text = sample_payload()
    all_lines = text.splitlines()
    payloads = ["\n".join(all_lines[i : i + 1000]) + "\n" for i in range(0, len(all_lines), 1000)]

    def bare() -> None:
        for payload in payloads:
            kept = []  # any consumer keeps what it parsed until the message is handled
            for s in payload.split("\n"):
                if s:
                    kept.append(parse_line(s))

    def ours() -> None:
        for payload in payloads:
            parse_payload(payload, now=0)

    parsed = parse_payload(text, now=0)
    assert len(parsed.lines) == N_LINES and not parsed.problems
    lines = parsed.lines
    # the written text reads back as the same lines (values, types, tags): formatting lost nothing
    assert parse_payload(format_lines(lines), now=0).lines == lines

    t_bare, t_ours, t_format = interleaved([bare, ours, lambda: format_lines(lines)])
    return [
        report("CC line parse+validate vs bare parse_line", t_ours, t_bare, N_LINES, "lines", target=0.7),
        report("CC line format vs bare parse_line", t_format, t_bare, N_LINES, "lines", target=0.8),
    ]
