"""What an InfluxDB write can answer, typed (`hpcbus.influx.writer` raises them; `hpcbus.permanent.outcome` says
what each means for a delivery): apart from the writer so that the outcome table, which every worker
imports, does not import the HTTP client, which a worker that never writes to InfluxDB (`consume sonar`,
`consume ingest`) does not install (`tests/test_dist.py`).
"""

from __future__ import annotations

__all__ = ["Partial", "Rejected", "Retryable", "TooLarge", "WriteError"]


class WriteError(Exception):
    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


class Retryable(WriteError):
    def __init__(self, message: str, status: int = 0, retry_after: float = 0.0) -> None:
        super().__init__(message, status)
        self.retry_after = retry_after


class TooLarge(WriteError):
    pass


class Rejected(WriteError):
    pass


class Partial(WriteError):
    """Some points were refused; the rest are stored. `dropped` is InfluxDB's count when it gives one."""

    def __init__(self, message: str, dropped: int) -> None:
        super().__init__(message, 400)
        self.dropped = dropped
