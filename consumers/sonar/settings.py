"""Options of `hpcbus consume sonar` (TOML table `[sonar]`; flags win over the file)."""

from __future__ import annotations

import msgspec

DIRECTIONS = ("sonar", "lp", "both")


class SonarSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    to: str = "both"
    """`sonar`: line protocol -> Sonar envelopes on `<cluster>.sonar.<kind>`; `lp`: Sonar envelopes -> lines
    on `<cluster>.metrics` / `.events.<class>`; `both` (safe: neither direction re-translates the other's
    output)."""
    directory: str = ""
    """Also append every envelope published or received to Sonar's directory tree here, the layout
    Jobanalyzer reads (`<yyyy>/<mm>/<dd>/0+<type>-<host>.json`); "" = no files."""
    grace: float = 30.0
    """Seconds an incomplete envelope waits for its missing lines before it is published partial. The input
    messages of a waiting envelope stay unacknowledged (in progress) that long."""
    max_groups: int = 4096
    """Envelopes assembled at once (the oldest goes out partial beyond that)."""
    max_lines: int = 200_000
    """Lines one sample envelope may collect."""
    on_stop: str = "return"
    """On SIGTERM, input whose envelope is still waiting is `return`ed to JetStream (negatively acknowledged:
    the next worker rebuilds the whole envelope), or the waiting envelopes are published partial at once
    and everything is acknowledged (`flush`: for a worker that is stopped for good). Core mode always
    flushes."""
    publish_timeout: float = 5.0
    """Seconds to wait for JetStream's acknowledgement of one publish before trying again."""

    def __post_init__(self) -> None:
        if self.to not in DIRECTIONS:
            raise ValueError(f"to = {self.to!r}: must be one of {', '.join(DIRECTIONS)}")
        if self.on_stop not in ("return", "flush"):
            raise ValueError(f"on_stop = {self.on_stop!r}: must be return or flush")
        if self.grace < 0 or self.max_groups < 1 or self.max_lines < 1:
            raise ValueError("grace must be >= 0, max_groups and max_lines >= 1")
