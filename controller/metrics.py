"""Prometheus metrics (``--metrics-addr``): read at scrape time from the store, the session and the switch.

Per job: the switch's packet counters by outcome (``lhc_job_packets_total{job, outcome}``), members,
epoch and epoch changes; the members' paths, from their heartbeats (``controller.path_reports``). Per
switch: connected, primary, answering, primaryship changes, reconciles, updates written.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.path_reports import PathReports
from controller.sessions import Sessions
from controller.store import JobStore
from lhc_ina import constants as c


class ControllerCollector(Collector):
    def __init__(self, store: JobStore, sessions: Sessions, paths: PathReports | None = None) -> None:
        self.store = store
        self.sessions = sessions
        self.paths = paths or PathReports()

    def collect(self) -> Iterator:
        for name, attribute, text in (
            ("lhc_switch_connected", "connected", "1 while the P4Runtime stream is up"),
            ("lhc_switch_primary", "primary", "1 while this controller is the switch's primary"),
            ("lhc_switch_answering", "answering", "0 while a connected switch does not answer (hung)"),
        ):
            gauge = GaugeMetricFamily(name, text, labels=["switch"])
            for session in self.sessions.all:
                gauge.add_metric([session.address], float(getattr(session.status, attribute)))
            yield gauge
        for name, attribute, text in (
            ("lhc_switch_primary_changes", "primary_changes", "arbitration updates received"),
            ("lhc_switch_reconciles", "reconciles", "reconcile passes"),
            ("lhc_switch_updates_written", "updates_written", "P4Runtime updates written"),
        ):
            counter = CounterMetricFamily(name, text, labels=["switch"])
            for session in self.sessions.all:
                counter.add_metric([session.address], getattr(session.status, attribute))
            yield counter
        jobs = self.store.jobs()
        members = GaugeMetricFamily("lhc_job_members", "workers joined and not left", labels=["job"])
        epoch = GaugeMetricFamily("lhc_job_epoch", "the job's current epoch", labels=["job"])
        changes = CounterMetricFamily(
            "lhc_job_epoch_changes", "epochs renewed after switch state loss", labels=["job"]
        )
        packets = CounterMetricFamily(
            "lhc_job_packets", "lhc packets at the switch by outcome", labels=["job", "outcome"]
        )
        # Per switch (a fabric: a job's row is the same index on every switch); a job's counts are summed
        # over the switches that answer.
        every = [rows for rows in (s.read_counters() for s in self.sessions.all) if rows is not None]
        for job in jobs:
            members.add_metric([job.name], sum(not m.left for m in job.members))
            epoch.add_metric([job.name], job.epoch)
            changes.add_metric([job.name], job.epoch_changes)
            found = [rows[job.job_index] for rows in every if job.job_index in rows]
            if found:
                for stat in c.Stat:
                    packets.add_metric([job.name, stat.name.lower()], sum(row[stat] for row in found))
        idle = [rows[0] for rows in every if 0 in rows]
        if idle:
            for stat in c.Stat:
                packets.add_metric(["(no job)", stat.name.lower()], sum(row[stat] for row in idle))
        yield from (members, epoch, changes, packets)
        yield from self._paths(jobs)

    def _paths(self, jobs: list) -> Iterator:
        """What the members' heartbeats say of their paths (``controller.path_reports``): members on each
        path now, and the calls, fallbacks and returns counted by the member that counts most (every
        member makes the same calls)."""
        on = GaugeMetricFamily("lhc_job_path_members", "members whose calls now take this path",
                               labels=["job", "path"])
        calls = CounterMetricFamily("lhc_job_path_calls", "calls (buckets) aggregated on this path",
                                    labels=["job", "path"])
        fallbacks = CounterMetricFamily("lhc_job_path_fallbacks", "moves from the switch to the hosts",
                                        labels=["job"])
        returns = CounterMetricFamily("lhc_job_path_returns", "moves back to the switch", labels=["job"])
        for job in jobs:
            reports = self.paths.of_job(job.job_id)
            if not reports:
                continue
            for path in ("switch", "host"):
                on.add_metric([job.name, path], sum(r["path"] == path for r in reports))
                calls.add_metric([job.name, path], max(r[f"{path}_calls"] for r in reports))
            fallbacks.add_metric([job.name], max(r["fallbacks"] for r in reports))
            returns.add_metric([job.name], max(r["returns"] for r in reports))
        yield from (on, calls, fallbacks, returns)


def serve_metrics(address: str, store: JobStore, session: Sessions,
                  paths: PathReports | None = None) -> tuple[object, int]:
    """Start the HTTP exporter on HOST:PORT (port 0 picks one); returns (server, bound port)."""
    host, _, port = address.rpartition(":")
    registry = CollectorRegistry()
    registry.register(ControllerCollector(store, session, paths))
    server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    return server, server.server_port
