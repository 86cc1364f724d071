"""Which time zone sacct's times are in, as a `tzinfo`, and the `TZ` that makes the commands agree.

sacct prints local times without an offset and reads `-S`/`-E` as local times, "local" being whatever the
C library of the sacct process believes (`TZ`, else /etc/localtime). Guessing that zone separately is how
timestamps end up an hour off for half the year. So either the zone is chosen (`--tz`) and the commands are
run with `TZ` set to it, or this process's own zone is used through the same C library calls sacct makes
(`SystemLocal`), which is right for any `TZ` glibc understands, POSIX strings such as `CET-1CEST` included.
"""

from __future__ import annotations

import calendar
import re
import time
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["SystemLocal", "resolve_zone"]

_OFFSET = re.compile(r"([+-])(\d{2}):?(\d{2})")


class SystemLocal(tzinfo):
    """This process's local zone as the C library computes it (`mktime`/`localtime`), DST included.

    Wall time -> offset uses `mktime` with `tm_isdst = -1`, as sacct's own parsing does; in the hour a DST
    change repeats the C library picks one of the two, and so does sacct.
    """

    def utcoffset(self, dt: datetime | None) -> timedelta:
        if dt is None:
            return timedelta(seconds=time.localtime().tm_gmtoff)
        seconds = time.mktime((dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, 0, 0, -1))
        return timedelta(seconds=time.localtime(seconds).tm_gmtoff)

    def dst(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str:
        if dt is None:
            return time.localtime().tm_zone
        seconds = time.mktime((dt.year, dt.month, dt.day, dt.hour, dt.minute, dt.second, 0, 0, -1))
        return time.localtime(seconds).tm_zone

    def fromutc(self, dt: datetime) -> datetime:
        offset = time.localtime(calendar.timegm(dt.timetuple())).tm_gmtoff
        return dt + timedelta(seconds=offset)

    def __repr__(self) -> str:
        return "SystemLocal()"


def resolve_zone(name: str) -> tuple[tzinfo, str | None]:
    """(zone, value for the commands' `TZ` or None to leave it alone) for a `--tz` value.

    `""` -> this process's zone; `UTC`; `+hh:mm`/`-hh:mm` (a fixed offset, given to the commands as the
    POSIX string `<+0200>-02:00`, whose sign is the other way round); otherwise an IANA name. Raises
    `ValueError` for a name the zone database does not know, before any command runs with it.
    """
    if not name:
        return SystemLocal(), None
    if name.upper() in ("UTC", "Z", "GMT"):
        return UTC, "UTC0"
    m = _OFFSET.fullmatch(name)
    if m:
        sign, hours, minutes = m.groups()
        delta = timedelta(hours=int(hours), minutes=int(minutes))
        if delta >= timedelta(hours=24):
            raise ValueError(f"--tz {name!r}: offset out of range")
        posix_sign = "-" if sign == "+" else "+"
        return (
            timezone(delta if sign == "+" else -delta),
            f"<{sign}{hours}{minutes}>{posix_sign}{hours}:{minutes}",
        )
    try:
        return ZoneInfo(name), name
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"--tz {name!r} is not a known time zone (an IANA name such as Europe/Oslo, UTC, or +hh:mm)"
        ) from None
