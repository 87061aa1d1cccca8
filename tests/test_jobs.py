"""lhc_ina.jobs: the one validated function from a job to its table entries (docs/switch.md, "Admission
invariants"). Each broken job of the issue is rejected with an error that names what is wrong; a valid one
becomes exactly the entries the switch needs."""

from __future__ import annotations

import dataclasses

import pytest

from lhc_ina import constants as c
from lhc_ina.jobs import (
    ADMIT_WORKER,
    JOBS_TABLE,
    REPLICAS_TABLE,
    SET_JOB,
    SET_REPLICA_DST,
    WORKERS_TABLE,
    InvalidJob,
    JobLayout,
    WorkerEndpoint,
    ip_to_int,
    job_entries,
    mac_to_int,
    validate,
)


def worker(rank: int, **changes: object) -> WorkerEndpoint:
    fields = {"rank": rank, "ip": f"10.0.0.{rank + 1}", "udp_port": 40000 + rank,
              "mac": f"02:00:00:00:00:{rank + 1:02x}", "switch_port": rank + 1, **changes}
    return WorkerEndpoint(**fields)  # type: ignore[arg-type]


def job(count: int = 3, **changes: object) -> JobLayout:
    fields = {"job_id": 7, "job_index": 2, "slot_base": 16, "slot_count": 8, "epoch": 5, "mcast_grp": 9,
              "workers": tuple(worker(r) for r in range(count)), **changes}
    return JobLayout(**fields)  # type: ignore[arg-type]


def rejected(layout: JobLayout, match: str, **kwargs: object) -> None:
    with pytest.raises(InvalidJob, match=match) as caught:
        job_entries(layout, **kwargs)  # type: ignore[arg-type]
    assert str(caught.value).startswith(f"job {layout.job_id}: ")


def test_a_valid_job_becomes_its_entries_and_group():
    layout = job(3, fan_in=2)
    entries = job_entries(layout)
    jobs, *rest = entries.tables
    assert (jobs.table, jobs.match, jobs.action) == (JOBS_TABLE, (("hdr.lhc.job_id", 7),), SET_JOB)
    assert dict(jobs.params) == {"job_index": 2, "slot_base": 16, "slot_count": 8, "fan_in": 2,
                                 "mcast_grp": 9, "epoch": 5}
    workers = [e for e in rest if e.table == WORKERS_TABLE]
    assert [(dict(e.match)["hdr.lhc.worker_id"], dict(e.params)["worker_bit"]) for e in workers] == [
        (0, 1), (1, 2), (2, 4)]
    assert all(e.action == ADMIT_WORKER for e in workers)
    assert dict(workers[1].match)["hdr.ipv4.src_addr"] == ip_to_int("10.0.0.2")
    replicas = [e for e in rest if e.table == REPLICAS_TABLE]
    assert [e.action for e in replicas] == [SET_REPLICA_DST] * 3
    assert dict(replicas[2].params) == {"dst_mac": mac_to_int("02:00:00:00:00:03"),
                                        "dst_addr": ip_to_int("10.0.0.3"), "dst_port": 40002}
    assert (entries.group.group_id, entries.group.replicas) == (9, ((1, 0), (2, 1), (3, 2)))


def test_workers_given_out_of_order_come_out_in_rank_order():
    layout = job(3)
    shuffled = dataclasses.replace(layout, workers=tuple(reversed(layout.workers)))
    assert job_entries(shuffled) == job_entries(layout)


def test_fan_in_defaults_to_the_worker_count_so_a_table_never_gets_zero():
    assert dict(job_entries(job(3)).tables[0].params)["fan_in"] == 3
    rejected(job(3, fan_in=-1), r"fan-in -1 must be in 1\.\.3")
    rejected(job(3, fan_in=4), r"fan-in 4 must be in 1\.\.3")


@pytest.mark.parametrize("changes, match", [
    # worker_bit 0 cannot be expressed (a bit is 1 << rank); ranks that are not 0..n-1 once each are
    # what would give two workers one bit, or a bit past 31.
    ({"workers": (worker(0), worker(0, ip="10.0.0.9", udp_port=41000))}, r"ranks must be 0\.\.1 once each"),
    ({"workers": (worker(0), worker(2))}, r"ranks must be 0\.\.1 once each, got \[0, 2\]"),
    ({"workers": tuple(worker(r) for r in range(c.MAX_WORKERS + 1))},
     r"33 members on one switch; a switch holds 1\.\.32 of a job \(one bit each"),
    ({"workers": ()}, r"0 members on one switch"),
    ({"mcast_grp": 0}, r"multicast group 0 .*results would leave by port 0"),
    ({"mcast_grp": 1 << 16}, r"multicast group 65536 must be in"),
    ({"job_index": c.MAX_JOBS}, rf"job index {c.MAX_JOBS} must be in 1\.\.{c.MAX_JOBS - 1}"),
    ({"job_index": 0}, r"job index 0 .*row 0 counts packets of no job"),
    ({"slot_base": 61440}, r"slots 61440\.\.61447 run past the switch's 4096 slots"),
    ({"slot_base": c.MAX_SLOTS - 4}, r"slots 4092\.\.4099 run past"),
    ({"slot_base": -1}, r"slots -1\.\.6 run past"),
    ({"slot_count": 0}, r"slot count must be at least 1"),
    ({"epoch": 0}, r"epoch 0 must be in 1\.\.65535 \(0 is the registers' reset value\)"),
    ({"epoch": 1 << 16}, r"epoch 65536 must be in 1\.\.65535"),
    ({"job_id": 1 << 16}, r"job id must fit 16 bits"),
])
def test_each_broken_job_is_rejected_with_the_invariant_it_breaks(changes, match):
    rejected(job(2, **changes), match)


@pytest.mark.parametrize("changes, match", [
    ({"ip": "10.0.0.300"}, r"rank 1: '10\.0\.0\.300' is not an IPv4 address"),
    ({"mac": "02:00:00:00:00"}, r"rank 1: '02:00:00:00:00' is not a MAC address"),
    ({"udp_port": 0}, r"rank 1: UDP port 0 is outside 1\.\.65535"),
    ({"udp_port": c.UDP_PORT_BASE + 3}, r"rank 1: UDP port 19523 is in the lhc range"),
    ({"switch_port": 511}, r"rank 1: switch port 511 is outside 0\.\.510"),
    ({"ip": "10.0.0.1", "udp_port": 40000}, r"ranks 0 and 1 share the address 10\.0\.0\.1:40000"),
])
def test_each_broken_worker_is_rejected_by_rank(changes, match):
    rejected(job(2, workers=(worker(0), worker(1, **changes))), match)


def test_an_epoch_that_cells_may_still_carry_is_rejected():
    rejected(job(2), r"epoch 5 may still stamp cells of slots 16\.\.23", stamped_epochs={4, 5})
    job_entries(job(2), stamped_epochs={4, 6})


def test_tofino_needs_one_pipe_and_leaves_the_recirculation_port_alone():
    two_pipes = job(workers=(worker(0, switch_port=1), worker(1, switch_port=129)))
    job_entries(two_pipes)  # fine on v1model
    rejected(two_pipes, r"workers on pipes \[0, 1\]: a job's workers must share one pipe", target="tna")
    recirc = job(workers=(worker(0, switch_port=128 + 68), worker(1, switch_port=130)))
    rejected(recirc, r"rank 0: switch port 196 is its pipe's recirculation port", target="tna")
    rejected(job(3, fan_in=2), r"fan-in 2 must equal the 3 workers on Tofino", target="tna")
    job_entries(job(3), target="tna")
    with pytest.raises(ValueError, match="unknown target 'tofino2'"):
        validate(job(2), target="tofino2")  # type: ignore[arg-type]
