"""Options of `hpcbus consume sonar` (TOML table `[sonar]`; flags win over the file)."""

from __future__ import annotations

import typing
from typing import Annotated, Literal

import msgspec

from hpcbus.keys import MAX_FUTURE, PUBLISH_TIMEOUT, MaxFuture, PublishTimeout
from hpcbus.options import Section
from hpcbus.settings import HostnameSettings

Direction = Literal["sonar", "lp", "both"]
DIRECTIONS: tuple[str, ...] = typing.get_args(Direction)


class SonarSettings(HostnameSettings, kw_only=True, forbid_unknown_fields=True):
    """What the Sonar bridge translates and how long it waits for the parts of an envelope, and how it names
    nodes (`hostname_form`, `hostname_domain`: those of `produce node`, applied to every envelope it reads
    and writes, both directions)."""

    to: Direction = "both"
    """`sonar`: line protocol -> Sonar envelopes on `<cluster>.sonar.<kind>`; `lp`: Sonar envelopes -> lines
    on `<cluster>.metrics` / `.events.<class>`; `both` (safe: neither direction re-translates the other's
    output)."""
    directory: str = ""
    """Also append every envelope published or received to Sonar's directory tree here, the layout
    Jobanalyzer reads (`<yyyy>/<mm>/<dd>/0+<type>-<host>.json`); `{cluster}` is replaced by the cluster
    name (required with several clusters); "" = no files."""
    grace: Annotated[float, msgspec.Meta(ge=0.0)] = 30.0
    """Seconds an incomplete envelope waits for its missing lines before it is published partial. The input
    messages of a waiting envelope stay unacknowledged (in progress) that long."""
    max_groups: Annotated[int, msgspec.Meta(ge=1)] = 4096
    """Envelopes assembled at once (the oldest goes out partial beyond that)."""
    max_lines: Annotated[int, msgspec.Meta(ge=1)] = 200_000
    """Lines one sample envelope may collect."""
    on_stop: Literal["return", "flush"] = "return"
    """On SIGTERM, input whose envelope is still waiting is `return`ed to JetStream (negatively acknowledged:
    the next worker rebuilds the whole envelope), or the waiting envelopes are published partial at once
    and everything is acknowledged (`flush`: for a worker that is stopped for good). Core mode always
    flushes."""
    publish_timeout: PublishTimeout = PUBLISH_TIMEOUT
    max_future: MaxFuture = MAX_FUTURE


SONAR = Section("sonar", SonarSettings, metavars={"directory": "DIR", "grace": "S"})
