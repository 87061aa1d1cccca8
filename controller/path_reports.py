"""What each worker's heartbeat says of its aggregation paths (``host_agent.paths``): through the switch
or over the hosts, how many calls each took, and the fallbacks and returns so far.

A worker that has the process group as its fallback sends it as the heartbeat's call metadata
``lhc-path`` (``path=host,switch_calls=10,host_calls=4,fallbacks=1,returns=0``): metadata, so that the job
service's messages are unchanged. Kept in memory, as heartbeats are; read by the metrics
(``lhc_job_path_*``).
"""

from __future__ import annotations

import threading

#: The call metadata key a heartbeat carries the report in.
METADATA_KEY = "lhc-path"
COUNTS = ("switch_calls", "host_calls", "fallbacks", "returns")


def parse(text: str) -> dict[str, str | int] | None:
    """A report's fields, or None when it is not one (a worker without a fallback sends none)."""
    fields = dict(item.partition("=")[::2] for item in text.split(",") if "=" in item)
    if fields.get("path") not in ("switch", "host") or not all(fields.get(n, "").isdigit() for n in COUNTS):
        return None
    return {"path": fields["path"], **{name: int(fields[name]) for name in COUNTS}}


class PathReports:
    """The last report of each (job id, rank)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[tuple[int, int], dict[str, str | int]] = {}

    def record(self, job_id: int, rank: int, text: str) -> None:
        report = parse(text)
        if report is not None:
            with self._lock:
                self._last[(job_id, rank)] = report

    def of_job(self, job_id: int) -> list[dict[str, str | int]]:
        with self._lock:
            return [report for (job, _), report in self._last.items() if job == job_id]
