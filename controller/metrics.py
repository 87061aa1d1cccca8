"""Prometheus metrics (``--metrics-addr``): read at scrape time from the store, the session and the switch.

Per job: the switch's packet counters by outcome (``lhc_job_packets_total{job, outcome}``), members,
epoch and epoch changes. Per switch: connected, primary, primaryship changes, reconciles, updates written.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from controller.session import SwitchSession
from controller.store import JobStore
from lhc_ina import constants as c


class ControllerCollector(Collector):
    def __init__(self, store: JobStore, session: SwitchSession) -> None:
        self.store = store
        self.session = session

    def collect(self) -> Iterator:
        s = self.session.status
        labels = [self.session.address]
        for name, value, text in (
            ("lhc_switch_connected", s.connected, "1 while the P4Runtime stream is up"),
            ("lhc_switch_primary", s.primary, "1 while this controller is the switch's primary"),
        ):
            gauge = GaugeMetricFamily(name, text, labels=["switch"])
            gauge.add_metric(labels, float(value))
            yield gauge
        for name, value, text in (
            ("lhc_switch_primary_changes", s.primary_changes, "arbitration updates received"),
            ("lhc_switch_reconciles", s.reconciles, "reconcile passes"),
            ("lhc_switch_updates_written", s.updates_written, "P4Runtime updates written"),
        ):
            counter = CounterMetricFamily(name, text, labels=["switch"])
            counter.add_metric(labels, value)
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
        rows = self.session.read_counters() or {}
        for job in jobs:
            members.add_metric([job.name], sum(not m.left for m in job.members))
            epoch.add_metric([job.name], job.epoch)
            changes.add_metric([job.name], job.epoch_changes)
            row = rows.get(job.job_index)
            if row is not None:
                for stat in c.Stat:
                    packets.add_metric([job.name, stat.name.lower()], row[stat])
        if 0 in rows:
            for stat in c.Stat:
                packets.add_metric(["(no job)", stat.name.lower()], rows[0][stat])
        yield from (members, epoch, changes, packets)


def serve_metrics(address: str, store: JobStore, session: SwitchSession) -> tuple[object, int]:
    """Start the HTTP exporter on HOST:PORT (port 0 picks one); returns (server, bound port)."""
    host, _, port = address.rpartition(":")
    registry = CollectorRegistry()
    registry.register(ControllerCollector(store, session))
    server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    return server, server.server_port
