"""The one base class of the PTF suite: configures the target over P4Runtime and checks packets and counters.

Test parameters (``ptf --test-params "grpc_addr='127.0.0.1:9559';device_id=1;..."``, set by
``ptf_tests/run.py``):

- ``grpc_addr``: the target's P4Runtime server (default ``127.0.0.1:9559``);
- ``device_id``: its P4Runtime device id (default 1);
- ``p4info``: the P4Info text file (default ``p4src/v1model/lhc.p4info.txtpb``);
- ``device_config``: the file pushed as the device config (BMv2: the JSON; empty or absent for softswitch).

One connection serves the whole run: the first test connects, becomes primary and pushes the pipeline.
Tests then stay independent by construction rather than by resetting the switch: every entry a test
installs is deleted in ``tearDown`` (and a sweep deletes anything left over), every job gets an epoch no
earlier test used (so its slots reset lazily, as the contract requires), and counters are compared as
differences across the whole ``lhc_stats`` array, which also proves that nothing else was counted.
"""

from __future__ import annotations

import atexit
import itertools
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import ptf
import ptf.testutils as testutils
from p4.v1 import p4runtime_pb2
from ptf.base_tests import BaseTest
from scapy.packet import Packet

from lhc_ina import constants as c
from lhc_ina.jobs import (
    REPLICAS_TABLE,
    SET_JOB,
    JobLayout,
    TableEntrySpec,
    WorkerEndpoint,
    job_entries,
)
from lhc_ina.p4info import V1MODEL_P4INFO, P4InfoIndex
from lhc_ina.p4rt import P4RuntimeClient, multicast_group_entry
from lhc_ina.wire import LhcHeader, stream_position
from ptf_tests import frames
from ptf_tests.frames import Worker

STATS = "LhcIngress.lhc_stats"
_RID = "standard_metadata.egress_rid"
#: The suite's primary connection; a test may connect a backup with a lower id.
SESSION_ELECTION_ID = 10
#: How long a positive wait (a packet, a counter) may take before the test fails.
POSITIVE_TIMEOUT = 3.0

# Epochs are unique within a run (and start from the clock, so a second run against a switch that kept
# its registers does not collide either): a fresh job never sees another test's slot state as current.
_EPOCHS = itertools.count((int(time.time()) * 7) % 0x8000 + 1)


def next_epoch() -> int:
    return next(_EPOCHS) % 0xFFFF + 1


@dataclass(frozen=True)
class Job:
    """A job as installed: its `jobs` entry parameters and its workers (with their PTF ports). Its table
    entries come from ``lhc_ina.jobs.job_entries`` through :attr:`layout`."""

    job_id: int
    job_index: int
    slot_base: int
    slot_count: int
    fan_in: int
    mcast_grp: int
    epoch: int
    workers: tuple[Worker, ...]

    @property
    def full_mask(self) -> int:
        return sum(w.bit for w in self.workers[: self.fan_in])

    @property
    def layout(self) -> JobLayout:
        """The job as admission describes it (a worker's PTF port is its switch port)."""
        endpoints = tuple(WorkerEndpoint(w.rank, w.ip, w.udp_port, w.mac, w.port) for w in self.workers)
        return JobLayout(self.job_id, self.job_index, self.slot_base, self.slot_count, self.epoch,
                         self.mcast_grp, endpoints, self.fan_in)

    def position(self, p: int) -> dict[str, int]:
        """Where packet ``p`` of the job's stream goes: slot, copy and seq (``wire.stream_position``)."""
        return stream_position(p, self.slot_count)

    def header(self, worker: Worker, **fields: int) -> LhcHeader:
        """A DATA header from ``worker`` for this job (epoch and ids filled in; override any field)."""
        values = {
            "msg_type": c.MsgType.DATA,
            "worker_id": worker.rank,
            "job_id": self.job_id,
            "epoch": self.epoch,
        }
        return LhcHeader(**{**values, **fields})


class _Session:
    """The run's one P4Runtime connection, opened by the first test."""

    client: P4RuntimeClient | None = None

    @classmethod
    def get(cls) -> P4RuntimeClient:
        if cls.client is None:
            params = testutils.test_params_get()
            p4info = P4InfoIndex.from_file(params.get("p4info") or V1MODEL_P4INFO)
            config_path = params.get("device_config") or ""
            device_config = Path(config_path).read_bytes() if config_path else b""
            client = P4RuntimeClient(
                params.get("grpc_addr", "127.0.0.1:9559"),
                device_id=int(params.get("device_id", 1)),
                election_id=SESSION_ELECTION_ID,
                p4info=p4info,
            ).connect()
            client.set_pipeline(p4info, device_config)
            cls.client = client
            atexit.register(client.close)
        return cls.client


class LhcTest(BaseTest):
    """Base of every test: a primary P4Runtime client, installed-entry bookkeeping, job helpers, exact
    packet checks and counter checks. Subclasses implement ``runTest``."""

    def setUp(self) -> None:
        super().setUp()
        self.dataplane = ptf.dataplane_instance
        self.dataplane.flush()
        self.client = _Session.get()
        self.entities = self.client.entities
        self.ports = sorted(port for _, port in testutils.ptf_ports())
        self._installed: list[object] = []
        self._stats_before = self.read_stats()

    def tearDown(self) -> None:
        try:
            if self._installed:
                self.client.delete(*reversed(self._installed))
            self._sweep()
        finally:
            self._installed = []
            self.dataplane.flush()
            super().tearDown()

    def _sweep(self) -> None:
        """Delete whatever a failed test left behind, so that it cannot affect the next one."""
        for table in self.client.p4info.tables:
            leftovers = self.client.read_table(table)
            if leftovers:
                self.client.delete(*leftovers)
        groups = self.client.read_multicast_groups()
        if groups:
            self.client.delete(*groups)

    # -- configuration --
    def install(self, *entities: object) -> None:
        """Insert entities and remember them for tearDown."""
        self.client.insert(*entities)
        self._installed.extend(entities)

    def add_job(
        self,
        job_id: int,
        workers: int | Sequence[Worker],
        *,
        job_index: int = 1,
        slot_base: int = 0,
        slot_count: int = 8,
        fan_in: int | None = None,
        mcast_grp: int | None = None,
        epoch: int | None = None,
        rewrites: Sequence[Worker] | None = None,
        broken: Mapping[str, int] | None = None,
    ) -> Job:
        """Install a job: the entries and multicast group that ``lhc_ina.jobs.job_entries`` gives for it
        (which rejects a job that breaks an admission invariant). ``workers`` is a count (spread over the
        PTF ports) or explicit workers.

        Two explicit escape hatches, for tests of what the data plane does with incomplete or broken
        tables: ``rewrites`` installs the `replicas` entries of only those workers, and ``broken``
        overrides `set_job` parameters after validation (e.g. a slot range past the registers)."""
        members = tuple(
            frames.make_workers(job_id, workers, self.ports) if isinstance(workers, int) else workers
        )
        job = Job(
            job_id=job_id,
            job_index=job_index,
            slot_base=slot_base,
            slot_count=slot_count,
            fan_in=len(members) if fan_in is None else fan_in,
            mcast_grp=job_id if mcast_grp is None else mcast_grp,
            epoch=next_epoch() if epoch is None else epoch,
            workers=members,
        )
        entries = job_entries(job.layout)
        ranks = {w.rank for w in (members if rewrites is None else rewrites)}
        self.install(
            *(
                self._entry(spec, broken if spec.action == SET_JOB else None)
                for spec in entries.tables
                if spec.table != REPLICAS_TABLE or dict(spec.match)[_RID] in ranks
            ),
            multicast_group_entry(entries.group.group_id, entries.group.replicas),
        )
        return job

    def install_layout(self, layout: JobLayout) -> None:
        """Install one switch's share of a job as admission describes it (e.g. a leaf's or a spine's,
        from ``lhc_ina.fabric``): every entry and the group that ``job_entries`` gives for it."""
        entries = job_entries(layout)
        self.install(*(self._entry(spec) for spec in entries.tables),
                     multicast_group_entry(entries.group.group_id, entries.group.replicas))

    def job_entry(self, job: Job) -> p4runtime_pb2.TableEntry:
        """The `jobs` entry of ``job`` (e.g. to MODIFY it with a new epoch), validated."""
        (spec,) = (s for s in job_entries(job.layout).tables if s.action == SET_JOB)
        return self._entry(spec)

    def _entry(
        self, spec: TableEntrySpec, broken: Mapping[str, int] | None = None
    ) -> p4runtime_pb2.TableEntry:
        params = dict(spec.params)
        if broken:
            unknown = set(broken) - set(params)
            self.assertFalse(unknown, f"{spec.action} has no parameters {sorted(unknown)}")
            params.update(broken)
        return self.entities.table_entry(spec.table, dict(spec.match), spec.action, params)

    # -- traffic --
    def send(self, port: int, frame: Packet | bytes) -> None:
        testutils.send_packet(self, port, frame)

    def contribute(
        self,
        job: Job,
        worker: Worker,
        words: Sequence[int],
        *,
        switch_ip: str = frames.SWITCH_IP,
        dport: int = c.UDP_PORT_BASE,
        **fields: int,
    ) -> LhcHeader:
        """Send one DATA packet from ``worker`` (header ``fields`` override the job's defaults); returns
        its header, from which the expected result or retransmission is derived."""
        header = job.header(worker, **fields)
        self.send(worker.port, frames.data_frame(worker, header, words, switch_ip=switch_ip, dport=dport))
        return header

    def expect_result(
        self,
        job: Job,
        last: LhcHeader,
        words: Sequence[int],
        bitmap: int | None = None,
        *,
        switch_ip: str = frames.SWITCH_IP,
        dport: int = c.UDP_PORT_BASE,
    ) -> None:
        """Exactly one RESULT copy per worker of ``job``, each on its worker's port, and nothing else.
        ``last`` is the header of the packet that finished the slot; ``bitmap`` defaults to all workers."""
        mask = job.full_mask if bitmap is None else bitmap
        copies = [
            (w.port, frames.result_copy(last, words, mask, w, switch_ip=switch_ip, dport=dport))
            for w in job.workers
        ]
        self.expect_packets(copies)

    def expect_retx(
        self,
        asker: Worker,
        sent: LhcHeader,
        words: Sequence[int],
        bitmap: int,
        *,
        dport: int = c.UDP_PORT_BASE,
    ) -> None:
        """Exactly one RESULT_RETX back to ``asker`` on its own port, and nothing else."""
        self.expect_packets([(asker.port, frames.retx_reply(sent, words, bitmap, asker, dport=dport))])

    def expect_packets(
        self, expected: Iterable[tuple[int, Packet | bytes]], timeout: float = POSITIVE_TIMEOUT
    ) -> None:
        """Exactly these frames (as a multiset, in any order across and within ports), then no others.

        Several multicast copies may leave through one port, in an order the contract does not fix, so
        each received frame is matched against whatever is still expected rather than polled in turn.
        """
        missing = Counter((port, bytes(frame)) for port, frame in expected)
        deadline = time.monotonic() + timeout
        while missing:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            result = self.dataplane.poll(timeout=min(left, 0.05))
            if not isinstance(result, self.dataplane.PollSuccess):
                continue
            key = (result.port, bytes(result.packet))
            if missing[key]:
                missing[key] -= 1
                if not missing[key]:
                    del missing[key]
                continue
            self.fail(self._unexpected(result.port, key[1], missing))
        if missing:
            lines = [
                f"port {port}: {frames.describe(frame)}"
                for (port, frame), n in missing.items()
                for _ in range(n)
            ]
            self.fail(f"{sum(missing.values())} expected frame(s) never arrived:\n  " + "\n  ".join(lines))
        self.expect_silence()

    def expect_silence(self, timeout: float | None = None) -> None:
        """No frame on any port for the negative timeout."""
        wait = ptf.ptfutils.default_negative_timeout if timeout is None else timeout
        result = self.dataplane.poll(timeout=wait)
        if isinstance(result, self.dataplane.PollSuccess):
            self.fail(self._unexpected(result.port, bytes(result.packet), Counter()))

    @staticmethod
    def _unexpected(port: int, frame: bytes, missing: Counter) -> str:
        text = f"unexpected frame on port {port}: {frames.describe(frame)}"
        same_port = [f for (p, f) in missing if p == port] or [f for (_, f) in missing]
        if same_port:
            closest = min(same_port, key=lambda f: len(frames.difference(f, frame)))
            text += f"\n  differs from an expected one in: {frames.difference(closest, frame)}"
        return text

    # -- counters --
    def read_stats(self) -> dict[int, int]:
        """Packet counts of every `lhc_stats` cell, by index."""
        return {index: value.packets for index, value in self.client.read_counter(STATS).items()}

    @staticmethod
    def stat_index(job_index: int, stat: c.Stat) -> int:
        return job_index * c.NUM_STATS + stat

    def wait_stats(self, deltas: Mapping[tuple[int, c.Stat], int], timeout: float = POSITIVE_TIMEOUT) -> None:
        """Wait until the given (job_index, Stat) cells have grown by at least the given counts since setUp.

        Tests call this before a packet whose outcome depends on earlier packets sent on other ports, so
        that a target serving ports concurrently still sees them in the intended order."""
        cells = {self.stat_index(j, s): n for (j, s), n in deltas.items()}
        deadline = time.monotonic() + timeout
        while True:
            entities = self.client.read(*(self.entities.counter_entry(STATS, i) for i in cells))
            now = {e.counter_entry.index.index: e.counter_entry.data.packet_count for e in entities}
            grown = {i: now.get(i, 0) - self._stats_before.get(i, 0) for i in cells}
            if all(grown[i] >= n for i, n in cells.items()):
                return
            if time.monotonic() > deadline:
                self.fail(f"counters did not reach {self._named(cells)} (now {self._named(grown)})")
            time.sleep(0.005)

    def assert_stats(self, deltas: Mapping[tuple[int, c.Stat], int]) -> None:
        """Since setUp, exactly these (job_index, Stat) cells grew by exactly these counts; no other cell
        of `lhc_stats` changed."""
        want = {self.stat_index(j, s): n for (j, s), n in deltas.items() if n}
        now = self.read_stats()
        got = {i: now.get(i, 0) - self._stats_before.get(i, 0) for i in now}
        got = {i: n for i, n in got.items() if n}
        self.assertEqual(self._named(got), self._named(want), "lhc_stats changes since the test began")

    @staticmethod
    def _named(cells: Mapping[int, int]) -> dict[str, int]:
        """Counter cells keyed by "job_index J STAT", so a failed comparison reads as outcomes."""

        def name(index: int) -> str:
            job_index, column = divmod(index, c.NUM_STATS)
            stat = c.Stat(column).name if column < len(c.Stat) else f"column {column}"
            return f"job_index {job_index} {stat}"

        return {name(i): n for i, n in sorted(cells.items())}


def reduce_round(
    test: LhcTest,
    job: Job,
    payloads: Sequence[Sequence[int]],
    *,
    slot: int = 0,
    ver: int = 0,
    seq: int = 1,
    op: c.Op = c.Op.ADD,
    absorbed_before: int = 0,
) -> list[int]:
    """One full round on (slot, ver): every worker but the last contributes (and is absorbed), then the
    last finishes the slot; checks the multicast result and returns the aggregate. ``absorbed_before``
    is the job's ABSORBED count earlier in the same test, so the wait counts only this round."""
    contributors = job.workers[: job.fan_in]
    assert len(payloads) == len(contributors), "one payload per contributing worker"
    for worker, words in zip(contributors[:-1], payloads[:-1], strict=True):
        test.contribute(job, worker, words, slot=slot, ver=ver, seq=seq, op=op)
    test.wait_stats({(job.job_index, c.Stat.ABSORBED): absorbed_before + job.fan_in - 1})
    header = test.contribute(job, contributors[-1], payloads[-1], slot=slot, ver=ver, seq=seq, op=op)
    result = frames.aggregate(payloads, op)
    test.expect_result(job, header, result)
    return result
