"""The HTML report as a person sees it: rendered by headless Chromium (Debian's `chromium`), screenshot and
DOM checked. A busy one-core process group (no allocation) and a Slurm-like job with cores and a memory
request, built from buckets as `consume influx` stores them (tests/test_report_pipeline.py renders the
real pipeline's jobs the same way)."""

from __future__ import annotations

import re
import struct
import subprocess
import zlib
from pathlib import Path

from hpcbus.consumers.report import html, text
from hpcbus.consumers.report.model import Buckets, JobData, JobRef, Report, build
from hpcbus.consumers.report.settings import ReportSettings

CHROMIUM = "/usr/bin/chromium"
T0 = 1764097200
TIMES = [T0 + 10 * i for i in range(9)]


def group_job(cpuset: list[int] | None = None, seen_start: bool = True) -> Report:
    """A process group keeping 0.9 of a core busy for 90 s with ~2.7 MiB resident: no request, and no cores
    unless the node reported a `cpuset` (on a node outside any batch system: the node's cores)."""
    # started a step before the first sample (each point measures the step before it), ended at the last
    event: dict[str, object] = {"hostname": "n1", "startTime": TIMES[0] - 10, "stopTime": TIMES[-1]}
    if cpuset:
        event["hwthreads"] = cpuset
    data = JobData(
        ref=JobRef("c", "4242@99"),
        step=10,
        first=TIMES[0],
        last=TIMES[-1],
        samples=[Buckets("n1", values=dict.fromkeys(TIMES, 1.0))],
        # unseen start: no CPU point at the first sample (no earlier reading to measure an interval from)
        cpu=[Buckets("n1", values=dict.fromkeys(TIMES if seen_start else TIMES[1:], 90.0))],
        mem=[Buckets("n1", values=dict.fromkeys(TIMES, 2700.0))],
        mem_max=[Buckets("n1", values=dict.fromkeys(TIMES, 2800.0))],
        node_events=[event] if seen_start else [],
        mem_total={"n1": 16 * 2**20},
    )
    return build(data, ReportSettings())


def slurm_job(
    cpu: float = 50.0, mem_mib: float = 100.0, start: int = TIMES[0], end: int = TIMES[-1] + 10
) -> Report:
    """4 cores allocated, half of one used; 2 GiB requested, 100 MiB used: both flagged (by default)."""
    data = JobData(
        ref=JobRef("c", "77"),
        step=10,
        first=TIMES[0],
        last=TIMES[-1],
        start_job={
            "numHwthreads": 4,
            "numNodes": 1,
            "requestedMemory": 2048,
            "resources": [{"hostname": "n1"}],
            "startTime": start,
            "metaData": {"slurmInfo": "x"},
        },
        stop_job={"stopTime": end, "jobState": "completed"},
        samples=[Buckets("n1", values=dict.fromkeys(TIMES, 1.0))],
        cpu=[Buckets("n1", values=dict.fromkeys(TIMES, cpu))],
        mem=[Buckets("n1", values=dict.fromkeys(TIMES, mem_mib * 1024))],
        mem_max=[Buckets("n1", values=dict.fromkeys(TIMES, mem_mib * 1024))],
    )
    return build(data, ReportSettings())


def test_a_process_group_says_cores_busy_and_memory_in_mib() -> None:
    report = group_job()
    assert report.cores is None and report.cpu_eff is None
    assert report.cores_busy is not None and abs(report.cores_busy - 0.9) < 0.01
    out = text.render(report)
    assert "0.9 cores busy on average" in out and "unknown" not in out.split("CPU memory")[0]
    page = html.render(report)
    assert "memory (MiB)" in page and "GiB)" not in page
    assert "cores busy" in page and "time (UTC)" in page
    # A cpuset of the whole node is no allocation: still judged by the cores it kept busy.
    whole_node = group_job(cpuset=[0, 1])
    assert "0.9 cores busy on average of 2" in text.render(whole_node)
    page = html.render(whole_node)
    assert "cores in its cpuset: 2" in page and "verdict bad" not in page
    # Flagged as `consume jobs` flags it (0.9 of 4), in words that do not call the node's cores allocated.
    flagged = text.render(group_job(cpuset=[0, 1, 2, 3]))
    assert "22.5 % of the 4 cores' of its cpuset (a process group has no allocation)" in " ".join(
        flagged.split()
    )


def png_rows(path: Path) -> list[bytes]:
    """The rows of an 8-bit RGB or RGBA PNG (what Chromium writes), unfiltered, as RGB(A) bytes."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = chunk
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for r in range(height):
        f = raw[r * (stride + 1)]
        line = bytearray(raw[r * (stride + 1) + 1 : (r + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line[: width * bpp : 1]) if bpp == 3 else bytes(line))
        prev = line
    return rows if bpp == 3 else [bytes(v for i, v in enumerate(row) if i % 4 != 3) for row in rows]


def chromium(page: Path, out: Path, *args: str) -> str:
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        *args,
        page.as_uri(),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=180, check=False, cwd=out)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_html_is_small_and_chromium_draws_readable_plots(tmp_path: Path) -> None:
    # The memory axis fits what is drawn: MiB for the group's 2.7 MiB, GiB for the 2 GiB request line.
    for name, report, unit in (("group", group_job(), "MiB"), ("slurm", slurm_job(), "GiB")):
        page = tmp_path / f"{name}.html"
        page.write_text(html.render(report))
        assert page.stat().st_size < 40_000, page.stat().st_size  # plotly.js inline was 4.8 MB
        assert "<script" not in page.read_text()  # opens in any viewer, offline, without running code
        dom = chromium(page, tmp_path, "--dump-dom")
        assert dom.count('<svg class="plot"') == 2, dom[:3000]
        for label in (
            "cores busy",
            f"memory ({unit})",
            "time (UTC), from 2025-11-25",
            "19:00:00",
            ">cpu n1<",
        ):
            assert label in dom, label
        assert re.search(r'<path class="series" data-name="memory n1" d="M[\d.]+,[\d.]+ L', dom)
        shot = tmp_path / f"{name}.png"
        chromium(page, tmp_path, "--window-size=1000,1400", f"--screenshot={shot}")
        rows = png_rows(shot)
        white = [all(v > 245 for v in row) for row in rows]
        content = [i for i, w in enumerate(white) if not w]
        # The page is filled down to its end: the two plots, no blank half page between or below them.
        assert content[-1] > 0.7 * len(rows), (content[-1], len(rows))
        longest = max(len(m) for m in re.findall(r"1+", "".join("1" if w else "0" for w in white)))
        assert longest < 0.15 * len(rows), longest
        # The series are drawn: pixels in the first line colour (#1f77b4) in both plots' rows.
        blue = [i for i, row in enumerate(rows) if bytes((0x1F, 0x77, 0xB4)) in row]
        assert blue and blue[-1] - blue[0] > 200, blue[:3]
    slurm = html.render(slurm_job())
    # What the job was given is drawn, and what is bad is marked.
    assert "allocated cores: 4" in slurm and "requested: 2.0 GiB" in slurm
    assert 'class="verdict bad">Under-used' in slurm and 'class="verdict bad">Over-requested' in slurm


def busy_job() -> Report:
    """4 cores allocated, 3.8 kept busy (it started a step before the first sample); 1.5 GiB of 2 GiB
    used: both good."""
    return slurm_job(cpu=380.0, mem_mib=1536.0, start=TIMES[0] - 10, end=TIMES[-1])


def unstarted_group() -> Report:
    """A process group nobody saw start (no `nodejob` events): its first sample measured no interval."""
    return group_job(seen_start=False)


def longest_run(rows: list[bytes], colour: bytes) -> int:
    """The longest horizontal run of pixels of `colour` in any row."""
    best = 0
    for row in rows:
        run = 0
        for i in range(0, len(row), 3):
            run = run + 1 if row[i : i + 3] == colour else 0
            best = max(best, run)
    return best


def test_the_page_reads_like_a_report_in_chromium(tmp_path: Path) -> None:
    """Issue 32: the summary is a table with each use marked good or bad (class and a visible mark), not the
    80-column text in a scrolled `<pre>`; the plots take the page's width; a first CPU point that measured
    nothing is not drawn as 0."""
    pages = {"good": busy_job(), "bad": slurm_job(), "group": unstarted_group()}
    doms = {}
    for name, report in pages.items():
        page = tmp_path / f"{name}.html"
        page.write_text(html.render(report))
        doms[name] = dom = chromium(page, tmp_path, "--dump-dom")
        assert "<pre" not in dom and '<table class="summary">' in dom, dom[:3000]
        assert '<table class="facts">' in dom and '<th scope="row">Elapsed</th>' in dom
    good, bad = doms["good"], doms["bad"]
    assert re.search(
        r'<tr class="row good" data-resource="cpu">.*?<span class="mark"[^>]*>\u2714</span> Good', good
    )
    assert re.search(r'<tr class="row good" data-resource="mem">.*?\u2714', good)
    assert re.search(
        r'<tr class="row bad" data-resource="cpu">.*?<span class="mark"[^>]*>\u2716</span> Under-used', bad
    )
    assert re.search(r'<tr class="row bad" data-resource="mem">.*?\u2716</span> Over-requested', bad)
    assert "row good" not in bad and "row bad" not in good
    assert "95.0 %" in good and "75.0 %" in good  # the numbers in their cells
    # The CPU plot of the group starts at its second sample; memory, measured at once, at its first.
    group = doms["group"]
    cpu = group.split('id="plot-cpu"')[1].split("</section>")[0]
    mem = group.split('id="plot-mem"')[1].split("</section>")[0]
    assert cpu.count("<circle") == len(TIMES) - 1 and mem.count("<circle") == len(TIMES), (cpu, mem)
    assert (
        "19:00:00 UTC: 0<" not in cpu
        and "0.95 cores busy" not in cpu
        and "0.9 cores busy on average" in group
    )
    # Seen: the plots span the page (a grid line over 85 % of a 1600 px window), the marks in their colours.
    shot = tmp_path / "good.png"
    chromium(tmp_path / "good.html", tmp_path, "--window-size=1600,1400", f"--screenshot={shot}")
    rows = png_rows(shot)
    assert longest_run(rows, bytes((0xE0, 0xE0, 0xE0))) > 0.85 * 1600 * (1 - 112 / 1200)
    assert any(bytes((0x1A, 0x7F, 0x37)) in row for row in rows)  # the green of a good verdict
    shot = tmp_path / "bad.png"
    chromium(tmp_path / "bad.html", tmp_path, "--window-size=1600,1400", f"--screenshot={shot}")
    assert any(bytes((0xC6, 0x28, 0x28)) in row for row in png_rows(shot))
