"""The controller end to end: a real lhc-softswitch (UDP mode), `lhc-controller serve` as a process, and
the job service over gRPC. The switch's entries must equal the job store exactly at every step, and
workers that joined through the service must aggregate through the switch bit for bit."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from lhc_ina import jobs as lj
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_launch.processes import ControllerProcess
from tests.harness.controller import Worker, aggregate_once, store_state, switch_state

RNG = np.random.default_rng(5)


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    made = [Worker() for _ in range(3)]
    yield made
    for w in made:
        w.close()


def _jobs_entry(state, job_id: int) -> dict[str, int]:
    entries = [
        e for e in state.tables if e.table == lj.JOBS_TABLE and dict(e.match)["hdr.lhc.job_id"] == job_id
    ]
    assert len(entries) == 1, entries
    return dict(entries[0].params)


@pytest.mark.timeout(120)
def test_job_lifecycle_over_the_job_service(switch, workers, tmp_path):
    with ControllerProcess(switch, tmp_path) as ctl:
        ctl.wait_for_switch()
        client = ctl.client
        created = client.create_job("train", workers=3, slots=8)
        assert created.state == pb.PENDING and created.slot_count == 8 and created.epoch > 0
        assert switch_state(switch) == store_state(tmp_path)  # nothing on the switch for a pending job
        assert not switch_state(switch).tables

        for i, w in enumerate(workers):
            w.joined = client.join("train", ip="127.0.0.1", udp_port=w.port, name=f"w{i}")
            assert w.joined.rank == i
        last = workers[-1].joined
        assert (last.job_id, last.slot_base, last.slot_count, last.epoch) == (
            created.job_id,
            created.slot_base,
            8,
            created.epoch,
        )
        assert (last.switch_ip, last.switch_udp_port) == (switch.host, switch.udp_port)
        assert last.lanes == 64 and [p.udp_port for p in last.peers] == [w.port for w in workers]
        assert last.job.state == pb.ACTIVE and last.job.installed

        state = switch_state(switch)
        assert state == store_state(tmp_path)
        params = _jobs_entry(state, created.job_id)
        assert (params["epoch"], params["slot_base"], params["slot_count"], params["fan_in"]) == (
            created.epoch,
            created.slot_base,
            8,
            3,
        )
        assert len(state.groups) == 1 and len(state.tables) == 1 + 3 + 3

        if switch.moves_udp:  # the installed entries aggregate (softswitch over UDP)
            for round_ in range(4):
                aggregate_once(workers, slot=round_, seq=round_, rng=RNG)
            counters = client.status("train").counters
            assert (counters["ABSORBED"], counters["RESULT"]) == (8, 4)

        listed = client.list_jobs()
        assert [j.name for j in listed] == ["train"] and listed[0].installed

        client.delete_job("train")
        assert not switch_state(switch).tables and not switch_state(switch).groups
        assert switch_state(switch) == store_state(tmp_path)
        assert client.list_jobs() == []
        status = client.switch_status()
        assert status.connected and status.primary and status.slots_free == status.slots_total
        assert ctl.terminate() == 0 and "stopping" in ctl.log()  # SIGTERM: a clean stop


@pytest.mark.timeout(120)
def test_leave_ends_the_job_with_its_last_member(switch, workers, tmp_path):
    with ControllerProcess(switch, tmp_path) as ctl:
        ctl.wait_for_switch()
        client = ctl.client
        client.create_job("short", workers=3, slots=4)
        first = client.join("short", ip="127.0.0.1", udp_port=workers[0].port)
        second = client.join("short", ip="127.0.0.1", udp_port=workers[1].port)
        # Leaving before the job starts frees the rank for the next join; the others keep theirs.
        assert client.leave("short", first.rank) is False
        assert [m.rank for m in client.status("short").members] == [1]
        again = client.join("short", ip="127.0.0.1", udp_port=workers[2].port)
        last = client.join("short", ip="127.0.0.1", udp_port=workers[0].port)
        assert (again.rank, second.rank, last.rank) == (0, 1, 2) and last.job.installed
        assert switch_state(switch) == store_state(tmp_path)
        assert client.leave("short", 0) is False and client.leave("short", 2) is False
        assert switch_state(switch) == store_state(tmp_path) and switch_state(switch).tables
        assert client.leave("short", 1) is True
        assert client.list_jobs() == [] and not switch_state(switch).tables
