"""Distinct values per tag of each measurement in InfluxDB (`hpcbus status --influx`): the number InfluxDB
1.x's `max-values-per-tag` limits.

On Debian's default configuration (the in-memory index, `max-values-per-tag` 100,000) InfluxDB refuses every
point that would add a value past the limit to a measurement's tag: once `job_processes` held 100,000 job
ids, every new job's per-job points were refused (issue 31). `consume influx` dead-letters those with
InfluxDB's reason, but by then data is lost: status warns well before (`tag_values_warn` of the limit) and
calls the limit itself a problem. The numbers come from `SHOW TAG VALUES CARDINALITY WITH KEY = "<key>"`,
one statement per tag key (`SHOW TAG KEYS` names them): InfluxDB answers it per measurement from its index
sketches (an estimate, within a few per cent; exact on the in-memory index, measured), without reading a
point, so it stays cheap at millions of series. The limit is the site's setting (`max_values_per_tag`):
InfluxDB does not tell it; 0 (what `hpcbus deploy influxdb` sets) means no limit, no warning.
"""

from __future__ import annotations

from hpcbus.commands.status.facts import TagValues
from hpcbus.influx.settings import InfluxSettings


async def tag_values(influx: InfluxSettings, limit: int) -> list[TagValues] | str:
    """Per tag key, the measurement that holds the most distinct values of it (the one nearest the limit),
    most values first; a sentence when InfluxDB cannot be asked."""
    from hpcbus.influx.query import Influx, QueryError, ident

    client = Influx(influx)
    try:
        keys = sorted({row["tagKey"] for s in await client.query("SHOW TAG KEYS") for row in s.rows()})
        most: dict[str, TagValues] = {}
        for key in keys:
            for s in await client.query(f"SHOW TAG VALUES CARDINALITY WITH KEY = {ident(key)}"):
                for row in s.rows():
                    count = int(row.get("count") or 0)
                    if key not in most or count > most[key].values:
                        most[key] = TagValues(tag=key, measurement=s.name, values=count, limit=limit)
    except QueryError as exc:
        return f"distinct tag values not known: {exc}"
    finally:
        await client.close()
    return sorted(most.values(), key=lambda t: (-t.values, t.tag))
