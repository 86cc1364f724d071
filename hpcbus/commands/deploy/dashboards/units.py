"""A panel's Grafana unit from the metric registry (`hpcbus.schemas.metrics`): a dashboard's axis says what the
registry says a measurement's value is, so the two cannot drift apart."""

from __future__ import annotations

from collections.abc import Iterable

from hpcbus.schemas.metrics import BY_NAME

__all__ = ["GRAFANA_UNITS", "unit_of"]

GRAFANA_UNITS = {
    "%": "percent",
    "% of a core": "percent",
    "kB (KiB)": "kbytes",
    "MiB": "mbytes",
    "bytes/s": "Bps",
    "packets/s": "pps",
    "requests/s": "reqps",
    "W": "watt",
    "MHz": "rotmhz",
    "degC": "celsius",
    "s": "s",
}
"""Registry unit -> Grafana unit id; any other unit (counts, run-queue length, P-state, codes) is "none"."""


def unit_of(names: Iterable[str]) -> str:
    """The one Grafana unit of the measurements `names` (as plotted: not a rate of them); ValueError when
    they have different units or one is not declared, so a panel never mixes two units on one axis."""
    names = list(names)
    undeclared = [n for n in names if n not in BY_NAME]
    if undeclared:
        raise ValueError(f"not in the metric registry: {', '.join(undeclared)}")
    units = {GRAFANA_UNITS.get(BY_NAME[n].unit, "none") for n in names}
    if len(units) != 1:
        raise ValueError(f"{', '.join(names)}: more than one unit ({', '.join(sorted(units))})")
    return units.pop()
