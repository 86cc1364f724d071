"""The gateway's pure parts: foreign line protocol into ClusterCockpit lines (schemas/foreign/influx.py), Sonar
envelopes checked for the authenticated cluster (schemas/foreign/sonar.py), and the auth file's hashes."""

from __future__ import annotations

import asyncio
import gzip
import logging
import zlib
from pathlib import Path

import pytest

from hpcbus.options import SettingsError
from hpcbus.producers.gateway.auth import (
    Authenticator,
    Busy,
    ClusterAuth,
    FailureBudget,
    Identity,
    Limited,
    TokenCheck,
    hash_secret,
    load_auth_file,
    verify,
)
from hpcbus.producers.gateway.inflate import Inflater
from hpcbus.producers.gateway.server import normalise_in_steps
from hpcbus.producers.gateway.tally import Tally
from hpcbus.retry import Stopping
from hpcbus.schemas.foreign import Normalised, normalise, read_envelopes, slurm_measurement, topic_kind
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.sonar import iter_envelopes
from tests.corpus import CORPUS

NOW = 1_700_000_100
T = 1_700_000_000


def texts(body: str, precision: str = "s", cluster: str = "fox") -> list[str]:
    return normalise(body, precision=precision, cluster=cluster, now=NOW, place="req").texts


def test_slurm_profile_lines_become_documented_cc_metrics() -> None:
    body = (
        f"RSS,job=17,step=-5,task=0,host=n1 value=2048 {T}\n"  # batch step, integer without `i`
        f"CPUUtilization,job=17,step=0,task=1,host=n1 value=99.50 {T}\n"
        f"Power,job=17,step=-4,task=Energy,host=n1 value=120 {T}\n"
        f"ReadMB,job=17,step=-6,task=Filesystem,host=n1 value=1.5 {T}\n"
        f"InMB,job=17,step=4294967291,task=Network,host=n1 value=3 {T}\n"  # the unsigned form of batch
    )
    out = normalise(body, precision="s", cluster="fox", now=NOW)
    assert out.problems == []
    assert out.texts == [
        # a task's figures: one child per task below the node (`task` / `task17.batch.0`), never the node's
        f"slurm_rss,hostname=n1,job=17,step=batch,stype=task,stype-id=17.batch.0,task=0,type=node,type-id=task"
        f" value=2048.0 {T}",
        f"slurm_cpu_utilization,hostname=n1,job=17,step=0,stype=task,stype-id=17.0.1,task=1,type=node,"
        f"type-id=task value=99.5 {T}",
        f"slurm_energy_power,hostname=n1,job=17,step=extern,type=node value=120.0 {T}",
        f"slurm_fs_read_mb,hostname=n1,job=17,step=interactive,type=node value=1.5 {T}",
        f"slurm_net_in_mb,hostname=n1,job=17,step=batch,type=node value=3.0 {T}",
    ]
    # what the bus' own parser makes of them: valid CC metrics, nothing repaired
    again = parse_payload("\n".join(out.texts), now=NOW)
    assert again.problems == [] and len(again.lines) == 5
    assert [slurm_measurement(f, "0") for f in ("CPUFrequency", "CPUTime", "VMSize", "Pages", "WriteMB")] == [
        "slurm_cpu_frequency",
        "slurm_cpu_time",
        "slurm_vm_size",
        "slurm_pages",
        "slurm_write_mb",
    ]


def test_multi_field_lines_are_split_and_strings_named() -> None:
    body = f'cpu,host=n1,cpu=cpu0 usage_idle=90.5,usage_user=3i {T}\nsystem,host=n1 load1=0.5,uptime_format="1 day" {T}\n'
    out = normalise(body, precision="s", cluster="fox", now=NOW, place="req")
    assert sorted(out.texts) == [
        f"cpu_usage_idle,hostname=n1,type=hwthread,type-id=0 value=90.5 {T}",  # Telegraf's cpu0: a hwthread
        f"cpu_usage_user,hostname=n1,type=hwthread,type-id=0 value=3i {T}",
        f"system_load1,hostname=n1,type=node value=0.5 {T}",
    ]
    assert [str(p) for p in out.problems] == [
        "req:2: lp metric: field uptime_format: warning: a str cannot be a ClusterCockpit metric value; not published"
    ]
    assert out.rejected == 0
    # no host at all: the whole line is refused, by number
    out = normalise(f"mem free=1i {T}\n", precision="s", cluster="fox", now=NOW, place="req")
    assert out.lines == [] and [str(p) for p in out.errors] == [
        "req:1: lp metric: tag hostname: a metric needs a host or hostname tag"
    ]


def test_telegraf_device_tags_become_clustercockpit_levels() -> None:
    """Telegraf's `cpu`, `net`, `diskio`, `disk` and `mem` inputs as Telegraf writes them (tags as in
    plugins/inputs/*/: `cpu=cpu<n>|cpu-total`, `interface=<name>|all`, `name=<device>`, `path=<mount>`)."""
    body = (
        f"cpu,cpu=cpu-total,host=tg1 usage_idle=50 {T}\n"
        f"cpu,cpu=cpu12,core_id=6,host=tg1 usage_idle=90 {T}\n"
        f"net,host=tg1,interface=eth0 bytes_recv=100i {T}\n"
        f"net,host=tg1,interface=all tcp_activeopens=3i {T}\n"
        f"diskio,host=tg1,name=nvme0n1,serial=S4 reads=5i {T}\n"
        f"disk,device=sda1,fstype=ext4,host=tg1,mode=rw,path=/scratch used_percent=7.5 {T}\n"
        f"mem,host=tg1 used=9i {T}\n"
        f"cpu,cpu=other,host=tg1 usage_idle=1 {T}\n"  # no device form Telegraf writes: left as it came
        f"net,host=tg1,interface=eth1,type=node,stype=network,stype-id=x bytes_recv=1i {T}\n"  # has its level
    )
    out = normalise(body, precision="s", cluster="fox", now=NOW, place="req")
    assert out.problems == []
    assert out.texts == [
        f"cpu_usage_idle,hostname=tg1,type=node value=50.0 {T}",
        f"cpu_usage_idle,core_id=6,hostname=tg1,type=hwthread,type-id=12 value=90.0 {T}",
        f"net_bytes_recv,hostname=tg1,stype=network,stype-id=eth0,type=node,type-id=network value=100i {T}",
        f"net_tcp_activeopens,hostname=tg1,type=node value=3i {T}",
        f"diskio_reads,hostname=tg1,serial=S4,stype=disk,stype-id=nvme0n1,type=node,type-id=disk value=5i {T}",
        "disk_used_percent,device=sda1,fstype=ext4,hostname=tg1,mode=rw,stype=filesystem,stype-id=/scratch,"
        f"type=node,type-id=filesystem value=7.5 {T}",
        f"mem_used,hostname=tg1,type=node value=9i {T}",
        f"cpu_usage_idle,cpu=other,hostname=tg1,type=node value=1.0 {T}",
        f"net_bytes_recv,hostname=tg1,interface=eth1,stype=network,stype-id=x,type=node,type-id=network value=1i {T}",
    ]
    # what the bus' own parser makes of them: valid CC metrics, nothing repaired
    again = parse_payload("\n".join(out.texts), now=NOW)
    assert again.problems == [] and len(again.lines) == len(out.texts)


@pytest.mark.parametrize(
    ("precision", "stamp"),
    [
        ("n", T * 10**9 + 999),
        ("ns", T * 10**9),
        ("u", T * 10**6 + 5),
        ("us", T * 10**6),
        ("ms", T * 1000 + 999),
        ("s", T),
        ("m", T // 60),
        ("h", T // 3600),
    ],
)
def test_every_precision_is_read_as_declared(precision: str, stamp: int) -> None:
    expected = {"m": T // 60 * 60, "h": T // 3600 * 3600}.get(precision, T)
    assert texts(f"load,hostname=n1,type=node,type-id=0 value=1 {stamp}", precision) == [
        f"load,hostname=n1,type=node value=1.0 {expected}"  # the node level's bus form: no type-id
    ]
    assert texts(f"load,hostname=n1,type=node value=1 {stamp}", precision) == [
        f"load,hostname=n1,type=node value=1 {expected}"  # already in bus form: as sent
    ]


def test_a_timestamp_in_the_wrong_precision_is_refused_not_moved() -> None:
    body = f"a,hostname=n1,type=node,type-id=0 value=1 {T * 10**9}\na,hostname=n1,type=node,type-id=0 value=2 {T}\n"
    out = normalise(body, precision="s", cluster="fox", now=NOW, place="req")
    assert out.texts == [f"a,hostname=n1,type=node value=2.0 {T}"]
    assert [p.line for p in out.errors] == [1] and "precision" in out.errors[0].reason
    out = normalise(body, precision="h", cluster="fox", now=NOW, place="req")  # hours: both far in the future
    assert out.lines == [] and [p.line for p in out.errors] == [1, 2]


def test_bad_lines_are_named_and_the_good_ones_kept() -> None:
    body = (
        f"ok,hostname=n1,type=node,type-id=0 value=1 {T}\n"
        "# a comment\n"
        "not line protocol\n"
        f"ok,hostname=n1,type=node,type-id=0,cluster=other value=2 {T}\n"
        f"ok,hostname=n1,type=node,type-id=0,cluster=fox value=3 {T}\n"
        f'ctl,hostname=n1,method=GET control="interval" {T}\n'
        f'bad.class event="x" {T}\n'
        f'job,function=start_job event="{{}}" {T}\n'
    )
    out = normalise(
        body.encode() + b"\xff\xfe bad bytes\n", precision="s", cluster="fox", now=NOW, place="req"
    )
    assert [p.line for p in out.errors] == [3, 4, 6, 7, 9]
    assert "'other'" in out.errors[1].reason and out.errors[1].path == "tag cluster"
    assert "control" in out.errors[2].reason and "not UTF-8" in out.errors[4].reason
    assert out.texts == [
        f"ok,hostname=n1,type=node value=1.0 {T}",
        f"ok,cluster=fox,hostname=n1,type=node value=3.0 {T}",
        f'job,function=start_job event="{{}}" {T}',
    ]
    assert (out.received, out.rejected) == (8, 5)


def test_sonar_envelopes_for_the_authenticated_cluster_only() -> None:
    raw = (CORPUS / "sonar" / "jobanalyzer__cluster1_sample_v0.19.jsonl").read_bytes()
    assert topic_kind("sample") == topic_kind("test.sample") == "sample" and topic_kind("jobs") == "job"
    assert topic_kind("bogus") == ""
    good = read_envelopes(raw, "sample", "cluster1.naic.com", place="req")
    assert good.payloads == [raw.strip()] and good.problems == []
    other = read_envelopes(raw, "sample", "fox.educloud.no", place="req")
    assert other.payloads == [] and [p.path for p in other.problems] == ["data.attributes.cluster"]
    wrong_kind = read_envelopes(raw, "sysinfo", "cluster1.naic.com", place="req")
    assert wrong_kind.payloads == [] and wrong_kind.problems
    token = read_envelopes(raw, "sample", "cluster1.naic.com", token_ok=lambda t: t == "s3cret")
    assert token.payloads == [] and [p.path for p in token.problems] == ["meta.token"]
    # JSONL: one message per envelope, each re-encoded (deterministic), a bad one beside them refused
    jsonl = (CORPUS / "sonar" / "jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_bytes()
    both = read_envelopes(jsonl + b'{"meta": 1}\n', "sample", "cluster1.uio.no", place="req")
    assert len(both.payloads) == 2 and both.received == 3 and both.problems[0].line == 3
    assert [p for _, p in iter_envelopes(b"\n".join(both.payloads).decode(), expect="sample")]


def test_auth_file_hashes_and_checks(tmp_path: Path) -> None:
    hashed = hash_secret("s3cret", iterations=1000)
    assert verify("s3cret", hashed) and not verify("S3cret", hashed)
    good = tmp_path / "auth.toml"
    good.write_text(f'[clusters."fox.educloud.no"]\nsecret = "{hashed}"\nrole = "master"\n')
    auth = Authenticator(load_auth_file(str(good)))
    master = Identity("fox.educloud.no", "master", name="fox.educloud.no")
    assert asyncio.run(auth.identity_of("fox.educloud.no", "s3cret")) == master
    assert asyncio.run(auth.identity_of("fox.educloud.no", "s3cret")) == master  # remembered
    assert asyncio.run(auth.identity_of("fox.educloud.no", "nope")) is None
    assert asyncio.run(auth.identity_of("other", "s3cret")) is None

    async def flood() -> list[object]:
        """Five wrong secrets at once against room for one check: one is hashed, four are refused at once;
        the remembered good secret passes meanwhile."""
        bounded = Authenticator(auth.entries, max_checks=1)
        await bounded.identity_of("fox.educloud.no", "s3cret")
        wrong = [bounded.identity_of("fox.educloud.no", f"nope{i}") for i in range(5)]
        return await asyncio.gather(
            *wrong, bounded.identity_of("fox.educloud.no", "s3cret"), return_exceptions=True
        )

    answers = asyncio.run(flood())
    assert answers[0] is None and all(isinstance(a, Busy) for a in answers[1:5]), answers
    assert answers[5] == master
    for text, says in [
        ('[clusters."fox"]\nsecret = "plain"\nrole = "master"\n', "pbkdf2-sha256"),
        ('[clusters."fox"]\nsecret = "x"\ncolour = 1\n', "colour"),
        (f'[clusters."a b"]\nsecret = "{hashed}"\nrole = "master"\n', "a b"),
        (f'[clusters."fox"]\nsecret = "{hashed}"\n', "role: missing"),
        (f'[clusters."fox"]\nsecret = "{hashed}"\nrole = "boss"\n', "role"),
        (f'[clusters."fox"]\nsecret = "{hashed}"\nrole = "node"\n', "role node needs the hosts"),
        (
            f'[clusters."fox"]\nsecret = "{hashed}"\nrole = "master"\nhosts = ["n1"]\n',
            "hosts are for role node",
        ),
        (f'[clusters."fox".credentials.n1]\nsecret = "{hashed}"\nhosts = ["n[1-"]\n', "neither a host name"),
        (f'[clusters."fox".credentials."a:b"]\nsecret = "{hashed}"\n', "may not be empty or hold ':'"),
        ('[clusters."fox"]\n', "no secret and no"),
        ("not toml [", "not TOML"),
    ]:
        bad = tmp_path / "bad.toml"
        bad.write_text(text)
        with pytest.raises(SettingsError, match=says):
            load_auth_file(str(bad))


def test_wrong_secrets_are_remembered_and_limited_per_address() -> None:
    """A wrong secret sent again is answered from memory (nothing hashed, nothing spent); different wrong
    ones spend the address' budget of failed checks (an IPv6 /64 is one address), then are refused at once
    (`Limited`) until it refills, while another address and remembered good credentials pass. Sonar tokens
    share the check slots: one check slot busy with a secret refuses a token that needs a hash. Before:
    every wrong secret was hashed, every time, and tokens were hashed outside the slots."""
    now = [0.0]
    hashed = hash_secret("s3cret", iterations=1000)
    entries = {
        "fox": ClusterAuth(secret=hashed, role="master", sonar_token=hash_secret("tok", iterations=1000)),
        "slow": ClusterAuth(secret=hash_secret("x", iterations=1_000_000), role="master"),  # takes a while
    }

    async def run() -> list[object]:
        auth = Authenticator(entries, max_checks=1, budget=FailureBudget(2, 10.0, clock=lambda: now[0]))

        async def cluster_of(user: str, secret: str, *, peer: str) -> str | None:
            who = await auth.identity_of(user, secret, peer=peer)
            return None if who is None else who.cluster

        out: list[object] = [await cluster_of("fox", "s3cret", peer="10.0.0.1")]
        for secret, peer in [("a", "2001:db8::1"), ("a", "2001:db8::1"), ("b", "2001:db8::2")]:
            out.append(await cluster_of("fox", secret, peer=peer))  # None, None (remembered), None
        for secret, peer in [("c", "2001:db8::3"), ("s3cret", "2001:db8::4")]:
            try:
                out.append(await cluster_of("fox", secret, peer=peer))
            except Limited as exc:
                out.append(str(exc))
        out.append(await cluster_of("fox", "d", peer="10.0.0.2"))  # another address: hashed
        now[0] += 10.0  # one check regained
        out.append(await cluster_of("fox", "c", peer="2001:db8::3"))
        check = auth.sonar_token_check("fox", "10.0.0.3")
        assert check is not None
        hashing = asyncio.ensure_future(cluster_of("slow", "e", peer="10.0.0.3"))
        await asyncio.sleep(0)  # the secret's hash has its slot
        token = await asyncio.to_thread(lambda: _busy_or(check, "wrong-token"))
        await hashing
        out.append(token)
        return out

    got = asyncio.run(run())
    assert got[:4] == ["fox", None, None, None], got
    assert "too many failed credential checks from 2001:db8::3" in str(got[4]), got
    assert got[5] == "fox", got  # remembered good credentials pass from a limited address
    assert got[6] is None and got[7] is None, got
    assert got[8] == "busy: 1 credential checks in progress", got


def _busy_or(check: TokenCheck, token: str) -> object:
    try:
        return check(token)
    except Busy as exc:
        return f"busy: {exc}"


def test_a_large_body_is_read_in_steps_with_the_same_result() -> None:
    """The gateway normalises a large body a step at a time (the event loop runs between steps): the same
    lines, problems (with their line numbers) and counts as in one go; a stop between steps gives None
    (nothing published)."""
    now = 1_700_000_000
    rows = []
    for i in range(60):
        rows.append(f"gw_step,hostname=n{i},type=node,type-id=0 value={i} {now}")
        rows.append(f"cpu,host=n{i} usage_user={i}.5,usage_idle=9 {now}" if i % 7 else "broken line")
    body = ("\n".join(rows) + "\n").encode()
    options = {"precision": "s", "cluster": "fox", "now": now, "place": "POST /write"}
    whole = normalise(body, **options)  # type: ignore[arg-type]
    stepped = asyncio.run(normalise_in_steps(body, Stopping(1.0), step=300, **options))
    assert stepped is not None and whole.errors and whole.received == 120
    # split lines come after a step's CC lines, as after the body's in one go: the same set, each step in order
    assert sorted(stepped.texts) == sorted(whole.texts) and stepped.problems == whole.problems
    assert len(stepped.lines) == len(stepped.texts) == len(whole.lines)
    assert (stepped.received, stepped.rejected) == (whole.received, whole.rejected)

    async def stopped() -> Normalised | None:
        stopping = Stopping(1.0)
        stopping.set()
        return await normalise_in_steps(body, stopping, step=300, **options)

    assert asyncio.run(stopped()) is None


@pytest.mark.parametrize(
    ("precision", "stamp", "good"),
    [
        ("s", 7_258_118_400, T),
        ("ms", 7_258_118_400_000, T * 1000),
        ("ns", 7_258_118_400 * 10**9, T * 10**9),
        ("h", 2_016_144, T // 3600),
    ],
)
def test_a_timestamp_outside_the_window_is_named_in_the_declared_precision(
    precision: str, stamp: int, good: int
) -> None:
    """2200-01-01 sent with `precision=s` was refused as "read as ms (by magnitude)": 7258118400 is below the
    ms band's start only when read by magnitude. The reason names the precision the request declared."""
    body = f"a,hostname=n1,type=node,type-id=0 value=1 {stamp}\na,hostname=n1,type=node,type-id=0 value=2 {good}\n"
    out = normalise(body, precision=precision, cluster="fox", now=NOW, place="req")
    assert len(out.texts) == 1 and out.texts[0].startswith("a,hostname=n1,type=node value=2")
    (problem,) = out.errors
    assert problem.line == 1 and problem.path == "timestamp"
    assert f"read as {precision} (precision={precision})" in problem.reason, problem.reason
    assert "2200-01-01" in problem.reason and "by magnitude" not in problem.reason
    early = normalise(
        f"a,hostname=n1,type=node,type-id=0 value=1 1\n{body}", precision=precision, cluster="f", now=NOW
    )
    assert [p.line for p in early.errors] == [1, 2] and "before 2000-01-01" in early.errors[0].reason


def test_a_gzip_bomb_is_inflated_in_bounded_pieces() -> None:
    """64 MiB of zeros (64 KiB compressed) come out in pieces of at most `step` bytes, so the gateway can stop
    at its limit and run other clients between pieces; several gzip members are read as `gzip -d` reads them;
    a stream cut short is not complete; bytes that are not gzip are a zlib error."""
    bomb = gzip.compress(bytes(64 << 20), 9)
    inflater = Inflater("gzip", 1 << 18)
    sizes = [
        len(p)
        for chunk in (bomb[i : i + 65536] for i in range(0, len(bomb), 65536))
        for p in inflater.pieces(chunk)
    ]
    assert max(sizes) <= 1 << 18 and sum(sizes) == 64 << 20 and inflater.complete
    first = next(Inflater("gzip", 1 << 18).pieces(bomb))  # a caller stopping after one piece inflated one
    assert len(first) == 1 << 18
    two = gzip.compress(b"a 1\n") + gzip.compress(b"b 2\n")
    inflater = Inflater("gzip", 3)
    assert b"".join(inflater.pieces(two)) == b"a 1\nb 2\n" and inflater.complete
    cut = Inflater("gzip", 1 << 18)
    assert b"".join(cut.pieces(bomb[:1000])) and not cut.complete
    deflated = Inflater("deflate", 100)
    assert b"".join(deflated.pieces(zlib.compress(b"x" * 1000))) == b"x" * 1000 and deflated.complete
    with pytest.raises(zlib.error):
        list(Inflater("gzip", 100).pieces(b"not gzip at all"))


def test_repeats_are_one_line_and_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    """1,000 refusals in a row: one line for the first, one summary line with the count of the rest."""
    log = logging.getLogger("test.tally")
    tally = Tally(log, "gateway: 401", summary_seconds=3600)
    with caplog.at_level(logging.INFO, "test.tally"):
        for i in range(1000):
            tally.note(f"user u{i}")
        tally.flush()
        tally.flush()
    assert [r.getMessage() for r in caplog.records] == [
        "gateway: 401: user u0 (more like it are counted, one line every 3600 s)",
        "gateway: 401: 999 more in the last 0 s (latest: user u999)",
    ]
    assert tally.total == 1000


def test_a_sonar_token_that_is_no_utf8_text_is_refused_not_an_error() -> None:
    """JSON can carry a lone surrogate (`"\\ud800"`) in `meta.token`: refused like a wrong token (hashing it
    raised UnicodeEncodeError, a 500)."""

    async def in_a_thread() -> tuple[bool, ...]:
        """As the envelope reader calls it: from a thread, the check itself on the loop."""
        check = TokenCheck(Authenticator({}), "fox", hash_secret("tok", iterations=10))
        return await asyncio.to_thread(lambda: (check("tok"), check("\ud800"), check("")))

    assert asyncio.run(in_a_thread()) == (True, False, False)
