"""The sacct value syntaxes: each parser's accepted forms, its refusals, and Sonar's quirks where they differ."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hpcbus.schemas.slurm import values as v

CEST = timezone(timedelta(hours=2))


# --- durations ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("00:00:00", 0),
        ("15:10:50", 15 * 3600 + 10 * 60 + 50),
        ("1-04:33:44", 86400 + 4 * 3600 + 33 * 60 + 44),
        ("7-11:33:12", 7 * 86400 + 11 * 3600 + 33 * 60 + 12),
        ("05:30", 330),
    ],
)
def test_duration_whole_seconds_is_int(text: str, seconds: int) -> None:
    result = v.parse_duration(text)
    assert result == seconds
    assert isinstance(result, int)
    assert v.parse_duration_sonar(text) == seconds


@pytest.mark.parametrize(
    ("text", "exact", "sonar"),
    [
        ("14:50.006", 890.006, 840),  # PROVENANCE: SystemCPU=14:50.006 -> 840
        ("45:21.005", 2721.005, 2700),  # UserCPU=45:21.005 -> 2700
        ("00:02.617", 2.617, 0),
        ("00:00.001", 0.001, 0),
        ("23:08.358", 1388.358, 1380),
    ],
)
def test_duration_with_fraction(text: str, exact: float, sonar: int) -> None:
    result = v.parse_duration(text)
    assert isinstance(result, float)
    assert result == pytest.approx(exact)
    assert v.parse_duration_sonar(text) == sonar
    assert v.sonar_seconds(result) == sonar
    assert v.whole_seconds(result) == round(exact)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Unknown",
        "INVALID",
        "1:2:3:4",
        "12",
        "1-04:33",
        "00:60",
        "01:60:00",
        "1-24:00:00",
        "-1:00",
        "1.5:00",
        "\u0661\u0662:\u0660\u0660",  # Arabic-Indic digits: int() would take them, sacct never prints them
    ],
)
def test_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        v.parse_duration(text)


@given(st.integers(0, 400), st.integers(0, 23), st.integers(0, 59), st.integers(0, 59))
def test_duration_roundtrip(days: int, hours: int, minutes: int, seconds: int) -> None:
    text = f"{days}-{hours:02}:{minutes:02}:{seconds:02}" if days else f"{hours:02}:{minutes:02}:{seconds:02}"
    assert v.parse_duration(text) == ((days * 24 + hours) * 60 + minutes) * 60 + seconds


# --- sizes and ReqMem ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kib"),
    [
        ("0", 0),
        ("1294440K", 1294440),
        ("0.01M", 11),  # PROVENANCE: AveDiskRead=0.01M -> 11
        ("0.00M", 0),
        ("771.29M", 789801),
        ("891.26M", 912651),
        ("112488K", 112488),
        ("2G", 2 * 1024 * 1024),
        ("1T", 1 << 30),
        ("1000", 1),  # a bare number is bytes, rounded up
        ("1024", 1),
        ("1025", 2),
    ],
)
def test_size_kib(text: str, kib: int) -> None:
    assert v.parse_size_kib(text) == kib


@pytest.mark.parametrize("text", ["", "K", "12X", "1.M", "-1K", "1,5M", "12 K"])
def test_size_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        v.parse_size_kib(text)


@pytest.mark.parametrize(
    ("text", "kib", "per_cpu"),
    [
        ("4G", 4 << 20, False),
        ("128G", 134217728, False),  # PROVENANCE: ReqMem=128G -> 134217728
        ("32000M", 32000 * 1024, False),
        ("4000Mn", 4000 * 1024, False),
        ("4000Mc", 4000 * 1024, True),
        ("0", 0, False),
    ],
)
def test_reqmem(text: str, kib: int, per_cpu: bool) -> None:
    assert v.parse_reqmem(text) == (kib, per_cpu)


@pytest.mark.parametrize("text", ["", "4Gx", "Mc", "4G c"])
def test_reqmem_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="ReqMem"):
        v.parse_reqmem(text)


# --- timestamps ----------------------------------------------------------------------------------------------


def test_timestamp_fixed_offset() -> None:
    when = v.parse_timestamp("2025-09-12T14:06:12", CEST)
    assert when == datetime(2025, 9, 12, 12, 6, 12, tzinfo=UTC)
    assert when is not None
    assert v.format_timestamp(when) == "2025-09-12T14:06:12+02:00"
    assert v.epoch_seconds(when) == 1757678772


def test_timestamp_zone_with_dst_uses_offset_at_that_instant() -> None:
    oslo = ZoneInfo("Europe/Oslo")
    summer = v.parse_timestamp("2025-07-01T12:00:00", oslo)
    winter = v.parse_timestamp("2025-01-01T12:00:00", oslo)
    assert summer is not None and winter is not None
    assert v.format_timestamp(summer) == "2025-07-01T12:00:00+02:00"
    assert v.format_timestamp(winter) == "2025-01-01T12:00:00+01:00"


def test_timestamp_utc_is_written_with_offset_not_z() -> None:
    when = v.parse_timestamp("2025-01-01T00:00:00", UTC)
    assert when is not None
    assert v.format_timestamp(when) == "2025-01-01T00:00:00+00:00"


@pytest.mark.parametrize("text", ["Unknown", "None"])
def test_timestamp_no_value(text: str) -> None:
    assert v.parse_timestamp(text, CEST) is None
    assert v.epoch_seconds(None) == 0


@pytest.mark.parametrize(
    "text",
    ["", "2025-09-12", "2025-09-12 14:06:12", "2025-09-12T14:06:12+02:00", "2025-13-12T14:06:12", "garbage"],
)
def test_timestamp_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="timestamp"):
        v.parse_timestamp(text, CEST)


def test_format_timestamp_needs_aware() -> None:
    with pytest.raises(ValueError, match="aware"):
        v.format_timestamp(datetime(2025, 1, 1))


# --- state, exit code, limits, extended uint -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "state", "uid"),
    [
        ("CANCELLED by 2101037", "CANCELLED", 2101037),
        ("CANCELLED", "CANCELLED", None),
        ("OUT_OF_MEMORY", "OUT_OF_MEMORY", None),
        ("NODE_FAIL", "NODE_FAIL", None),
    ],
)
def test_state(text: str, state: str, uid: int | None) -> None:
    assert v.parse_state(text) == (state, uid)


@pytest.mark.parametrize("text", ["", "running", "CANCELLED by", "CANCELLED by x", "CANCELLED  by 1"])
def test_state_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="State"):
        v.parse_state(text)


def test_exit_code() -> None:
    assert v.parse_exit_code("1:0") == (1, 0)
    assert v.parse_exit_code("0:15") == (0, 15)
    for bad in ("", "1", "1:", ":0", "a:b", "-1:0"):
        with pytest.raises(ValueError, match="ExitCode"):
            v.parse_exit_code(bad)


def test_timelimit_raw() -> None:
    assert v.parse_timelimit_raw("20160") == 20160
    assert v.parse_timelimit_raw("UNLIMITED") == v.UNLIMITED
    assert v.parse_timelimit_raw("Partition_Limit") is None
    for bad in ("", "1:00", "unlimited", "-5"):
        with pytest.raises(ValueError, match="TimelimitRaw"):
            v.parse_timelimit_raw(bad)


def test_timelimit_formatted() -> None:
    assert v.parse_timelimit("19:50:00") == 1190
    assert v.parse_timelimit("1-05:50:00") == 1790
    assert v.parse_timelimit("UNLIMITED") == v.UNLIMITED
    assert v.parse_timelimit("Partition_Limit") is None
    with pytest.raises(ValueError, match="Timelimit"):
        v.parse_timelimit("soon")


def test_extended_uint() -> None:
    assert v.to_extended_uint(None) == 0
    assert v.to_extended_uint(v.UNLIMITED) == 1
    assert v.to_extended_uint(0) == 2
    assert v.to_extended_uint(11429) == 11431  # PROVENANCE: priority 11429 -> 11431
    assert v.from_extended_uint(0) is None
    assert v.from_extended_uint(1) == v.UNLIMITED
    assert v.from_extended_uint(1209602) == 1209600
    for bad in (-1, True, 1.5, "3"):
        with pytest.raises(ValueError, match="ExtendedUint"):
            v.to_extended_uint(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="negative"):
        v.from_extended_uint(-1)


@given(st.one_of(st.none(), st.just(v.UNLIMITED), st.integers(0, 2**62)))
def test_extended_uint_roundtrip(value: v.Limit) -> None:
    assert v.from_extended_uint(v.to_extended_uint(value)) == value


# --- job ids -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1879824", v.JobId(1879824)),
        ("1879824.batch", v.JobId(1879824, "batch")),
        ("1879824.extern", v.JobId(1879824, "extern")),
        ("1902893.interactive", v.JobId(1902893, "interactive")),
        ("973821.0", v.JobId(973821, "0")),
        ("5908801_3", v.JobId(5908801, array_task_id=3)),
        ("1467073_1.extern", v.JobId(1467073, "extern", array_task_id=1)),
        ("123_[1-5%2]", v.JobId(123, array_tasks="1-5%2")),
        ("123_[1,3,7-9]", v.JobId(123, array_tasks="1,3,7-9")),
        ("1467921+0", v.JobId(1467921, het_offset=0)),
        ("1467921+1.0", v.JobId(1467921, "0", het_offset=1)),
    ],
)
def test_job_id(text: str, expected: v.JobId) -> None:
    parsed = v.parse_job_id(text)
    assert parsed == expected
    assert parsed.is_array == (expected.array_task_id is not None or expected.array_tasks != "")
    assert parsed.is_het == (expected.het_offset is not None)


@pytest.mark.parametrize("text", ["", "abc", "12_", "12_[]", "12+", "12.", "12_3+4", "12 .batch", "12_[1-5"])
def test_job_id_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="JobID"):
        v.parse_job_id(text)


def test_job_id_raw() -> None:
    assert v.parse_job_id_raw("1467074") == (1467074, "")
    assert v.parse_job_id_raw("1467074.batch") == (1467074, "batch")
    for bad in ("", "1467073_1", "1+0", "x.batch"):
        with pytest.raises(ValueError, match="JobIDRaw"):
            v.parse_job_id_raw(bad)


# --- node lists and TRES --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("gpu-2", ["gpu-2"]),
        ("c1-[9-10]", ["c1-[9-10]"]),
        ("omni[2-3]", ["omni[2-3]"]),
        (
            "c1-[5-6,8-9,12-20,25,28],c1-[21,23],bigmem-2,c1-29",
            ["c1-[5-6,8-9,12-20,25,28]", "c1-[21,23]", "bigmem-2", "c1-29"],
        ),
        ("r[1-2]-n[1-3].fox,x", ["r[1-2]-n[1-3].fox", "x"]),
        ("a,b", ["a", "b"]),
    ],
)
def test_split_nodelist(text: str, parts: list[str]) -> None:
    assert v.split_nodelist(text) == parts


@pytest.mark.parametrize(
    "text", ["", "a,", ",a", "a,,b", "a[", "a[1", "a[1,]", "a[1-]", "a[x]", "a]", "a[1-3],"]
)
def test_split_nodelist_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="node list"):
        v.split_nodelist(text)


def test_tres() -> None:
    assert v.parse_tres("billing=32,cpu=32,gres/gpu:a100=1,gres/gpu=1,mem=128G,node=1") == {
        "billing": "32",
        "cpu": "32",
        "gres/gpu:a100": "1",
        "gres/gpu": "1",
        "mem": "128G",
        "node": "1",
    }
    assert v.parse_tres("") == {}
    with pytest.raises(ValueError, match="TRES"):
        v.parse_tres("cpu=1,oops")
