"""lhc_ina.fabric and the two-level parts of lhc_ina.jobs: one job over a spine and its leaves becomes each
switch's entries (docs/switch.md, "Two levels: leaf and spine"), and each broken fabric or layout is
rejected with an error that names what is wrong. Ranks are per level: a leaf admits its workers by their rank
within it, the spine each leaf by its index (docs/switch.md, "Ranks per level")."""

from __future__ import annotations

import dataclasses

import pytest

from lhc_ina import constants as c
from lhc_ina.fabric import FabricJob, Leaf, LeafLink, SwitchShare, fabric_entries, fabric_layouts, wire_ranks
from lhc_ina.jobs import (
    ADMIT_WORKER,
    FULL_ROUND_TABLE,
    JOBS_TABLE,
    ROUND_AWAITS_PARENT,
    ROUND_IS_FULL,
    SET_UPLINK,
    UPLINKS_TABLE,
    WORKERS_TABLE,
    InvalidJob,
    ip_to_int,
    job_entries,
    mac_to_int,
    validate,
)
from tests.test_jobs import job, worker


def link(leaf: int) -> LeafLink:
    return LeafLink(leaf_port=20, spine_port=30 + leaf, leaf_mac=f"02:00:00:00:0a:{leaf:02x}",
                    leaf_ip=f"10.0.{leaf}.254", leaf_udp_port=c.UDP_PORT_BASE + 1,
                    spine_mac="02:00:00:00:0b:01", spine_ip="10.0.100.1")


def fabric(per_leaf: tuple[int, ...] = (4, 4)) -> FabricJob:
    leaves, rank = [], 0
    for index, count in enumerate(per_leaf):
        workers = tuple(worker(r, ip=f"10.{r >> 8}.{r & 255}.1", mac=f"02:00:00:00:{r >> 8:02x}:{r%256:02x}",
                               switch_port=1 + r - rank)
                        for r in range(rank, rank + count))
        leaves.append(Leaf(f"leaf{index}", SwitchShare(job_index=3, slot_base=64 * index, mcast_grp=5),
                           workers, link(index)))
        rank += count
    return FabricJob(job_id=0x77, epoch=9, slot_count=8, spine="spine",
                     spine_share=SwitchShare(job_index=4, slot_base=100, mcast_grp=6), leaves=tuple(leaves))


def entries_of(spec_tables, table):
    return [e for e in spec_tables if e.table == table]


def test_each_leaf_gets_its_workers_and_an_uplink_and_counts_its_parent():
    entries = fabric_entries(fabric((4, 3)))
    assert set(entries) == {"leaf0", "leaf1", "spine"}
    leaf1 = entries["leaf1"]
    (jobs,) = entries_of(leaf1.tables, JOBS_TABLE)
    assert dict(jobs.params) == {"job_index": 3, "slot_base": 64, "slot_count": 8, "fan_in": 4,
                                 "mcast_grp": 5, "epoch": 9}
    workers = entries_of(leaf1.tables, WORKERS_TABLE)
    # job ranks 4, 5, 6 are the leaf's ranks 0, 1, 2 on the wire and in its bitmap
    assert [(dict(e.match)["hdr.lhc.worker_id"], dict(e.params)["worker_bit"]) for e in workers] == [
        (0, 1 << 0), (1, 1 << 1), (2, 1 << 2)]
    (up,) = entries_of(leaf1.tables, UPLINKS_TABLE)
    assert (up.match, up.action) == ((("hdr.lhc.job_id", 0x77),), SET_UPLINK)
    assert dict(up.params) == {
        "port": 20, "worker_id": 1, "src_mac": mac_to_int("02:00:00:00:0a:01"),
        "dst_mac": mac_to_int("02:00:00:00:0b:01"), "src_addr": ip_to_int("10.0.1.254"),
        "dst_addr": ip_to_int("10.0.100.1"), "src_port": c.UDP_PORT_BASE + 1, "dst_port": c.UDP_PORT_BASE}
    assert leaf1.group.replicas == ((1, 0), (2, 1), (3, 2))


def test_the_spine_admits_each_leaf_as_one_member_with_the_bit_of_its_index():
    spine = fabric_entries(fabric((4, 3)))["spine"]
    (jobs,) = entries_of(spine.tables, JOBS_TABLE)
    assert dict(jobs.params)["fan_in"] == 2
    assert not entries_of(spine.tables, UPLINKS_TABLE)
    members = entries_of(spine.tables, WORKERS_TABLE)
    assert [dict(e.match) for e in members] == [
        {"hdr.lhc.job_id": 0x77, "hdr.lhc.worker_id": 0, "hdr.ipv4.src_addr": ip_to_int("10.0.0.254"),
         "hdr.udp.src_port": c.UDP_PORT_BASE + 1, "standard_metadata.ingress_port": 30},
        {"hdr.lhc.job_id": 0x77, "hdr.lhc.worker_id": 1, "hdr.ipv4.src_addr": ip_to_int("10.0.1.254"),
         "hdr.udp.src_port": c.UDP_PORT_BASE + 1, "standard_metadata.ingress_port": 31}]
    assert [(e.action, dict(e.params)) for e in members] == [
        (ADMIT_WORKER, {"worker_bit": 0x1}), (ADMIT_WORKER, {"worker_bit": 0x2})]
    assert spine.group.replicas == ((30, 0), (31, 1))


def test_a_job_of_1024_workers_is_32_leaves_of_32_with_nothing_wider_than_32_bits():
    layouts = fabric_layouts(fabric((c.MAX_WORKERS,) * c.MAX_LEAVES))
    leaves = [layout for name, layout in layouts.items() if name != "spine"]
    assert sum(len(layout.workers) for layout in leaves) == c.MAX_JOB_WORKERS
    spine = layouts["spine"]
    assert spine.full_mask == 0xFFFFFFFF and spine.countdown == c.MAX_LEAVES
    for index in range(c.MAX_LEAVES):
        leaf = layouts[f"leaf{index}"]
        assert leaf.full_mask == 0xFFFFFFFF and leaf.countdown == c.MAX_WORKERS + 1
        assert leaf.uplink.worker_id == index and leaf.result_mask == 0xFFFFFFFF
    for entries in fabric_entries(fabric((c.MAX_WORKERS,) * c.MAX_LEAVES)).values():
        assert all(0 < dict(e.params)["worker_bit"] < 1 << 32
                   for e in entries_of(entries.tables, WORKERS_TABLE))


def test_wire_ranks_number_each_leafs_workers_from_zero_in_job_rank_order():
    assert wire_ranks([[5, 0, 2], [1, 3, 4]]) == {0: (0, 0), 2: (0, 1), 5: (0, 2), 1: (1, 0), 3: (1, 1),
                                                  4: (1, 2)}


def test_a_one_switch_job_has_no_uplink_entry():
    assert not entries_of(job_entries(job(3)).tables, UPLINKS_TABLE)


@pytest.mark.parametrize("change, match", [
    (lambda f: dataclasses.replace(f, leaves=()), r"at least one leaf"),
    (lambda f: dataclasses.replace(f, spine="leaf0"), r"switches must be distinct"),
    (lambda f: dataclasses.replace(f, leaves=(f.leaves[0], dataclasses.replace(f.leaves[1], switch="leaf0"))),
     r"switches must be distinct"),
    (lambda f: dataclasses.replace(f, leaves=(f.leaves[0], f.leaves[0])), r"switches must be distinct"),
    (lambda f: dataclasses.replace(f, leaves=(f.leaves[1],)), r"ranks must be 0\.\.3 once each, got \[4, 5"),
    (lambda f: dataclasses.replace(f, leaves=(f.leaves[0], dataclasses.replace(f.leaves[1], workers=()))),
     r"leaves \['leaf1'\] have no workers"),
])
def test_a_broken_fabric_is_rejected_with_what_is_wrong(change, match):
    with pytest.raises(InvalidJob, match=match) as caught:
        fabric_layouts(change(fabric()))
    assert str(caught.value).startswith("job 119: ")


def test_more_than_32_workers_on_a_leaf_or_32_leaves_are_rejected_saying_why():
    fabric_entries(fabric((17, 16)))  # 33 workers over two leaves: fine
    with pytest.raises(InvalidJob, match=r"leaves \['leaf1'\] hold more than 32 workers .*one bit each"):
        fabric_entries(fabric((3, 33)))
    with pytest.raises(InvalidJob, match=r"33 leaves; a job spans 1\.\.32 \(one bit each in the spine"):
        fabric_entries(fabric((1,) * 33))


def leaf_layout(**uplink_changes: object):
    layout = fabric_layouts(fabric())["leaf1"]
    return dataclasses.replace(layout, uplink=dataclasses.replace(layout.uplink, **uplink_changes))


@pytest.mark.parametrize("layout, match", [
    (leaf_layout(worker_id=32), r"uplink worker id 32 \(the leaf's index at its parent\) must be below 32"),
    (leaf_layout(port=511), r"uplink port 511 is outside 0\.\.510"),
    (leaf_layout(dst_addr="10.0.0"), r"uplink dst_addr '10\.0\.0' is not an IPv4 address"),
    (leaf_layout(src_mac="nope"), r"uplink src_mac 'nope' is not a MAC address"),
    (leaf_layout(src_port=40000), r"uplink src_port 40000 is outside the lhc range"),
    (leaf_layout(dst_port=c.UDP_PORT_BASE + c.UDP_PORT_COUNT), r"uplink dst_port 19536 is outside the lhc"),
    (dataclasses.replace(leaf_layout(), fan_in=3), r"fan-in 3 must equal the 4 workers of a leaf"),
])
def test_a_broken_leaf_is_rejected(layout, match):
    with pytest.raises(InvalidJob, match=match):
        job_entries(layout)


def spine_layout(*members):
    return dataclasses.replace(fabric_layouts(fabric())["spine"], workers=tuple(members))


def member(rank: int, **changes: object):
    fields = {"udp_port": c.UDP_PORT_BASE + 1, "switch_port": 30 + rank, "leaf": True, **changes}
    return worker(rank, **fields)


@pytest.mark.parametrize("layout, match", [
    (spine_layout(member(0), member(2)), r"ranks must be 0\.\.1 once each, got \[0, 2\]"),
    (spine_layout(member(0), member(0, ip="10.9.9.9")), r"ranks must be 0\.\.1 once each, got \[0, 0\]"),
    (spine_layout(member(0), member(1, udp_port=40000)),
     r"rank 1 \(a leaf\): UDP port 40000 is outside the lhc range"),
])
def test_a_broken_spine_member_is_rejected(layout, match):
    with pytest.raises(InvalidJob, match=match):
        job_entries(layout)


def test_a_spine_may_also_hold_workers_of_its_own():
    layout = spine_layout(member(0), worker(1, udp_port=40004, switch_port=40))
    entries = job_entries(layout)
    assert [dict(e.params)["worker_bit"] for e in entries_of(entries.tables, WORKERS_TABLE)] == [0x1, 0x2]


def test_tofino_tells_each_switch_its_masks_in_full_round():
    # TNA finishes a round by its bitmap: one entry per job and switch, the members' mask; on a leaf it
    # means "every worker is in" (the copy then awaits its parent, or holds its result: the copy's state,
    # not the bitmap, tells which; p4src/tna, `bitmaps`).
    found = fabric_entries(fabric((4, 3)), target="tna")
    rounds = {switch: {(dict(e.match)["hdr.lhc.bitmap"], e.action)
                       for e in entries_of(entries.tables, FULL_ROUND_TABLE)}
              for switch, entries in found.items()}
    assert all(dict(e.match)["hdr.lhc.job_id"] == 0x77 for entries in found.values()
               for e in entries_of(entries.tables, FULL_ROUND_TABLE))
    assert rounds == {
        "spine": {(0x3, ROUND_IS_FULL)},
        "leaf0": {(0x0F, ROUND_AWAITS_PARENT)},
        "leaf1": {(0x07, ROUND_AWAITS_PARENT)},
    }
    assert not any(entries_of(e.tables, FULL_ROUND_TABLE) for e in fabric_entries(fabric()).values())
    one_switch = job_entries(job(3), target="tna")
    rows = entries_of(one_switch.tables, FULL_ROUND_TABLE)
    assert [(dict(e.match)["hdr.lhc.bitmap"], e.action) for e in rows] == [(0x7, ROUND_IS_FULL)]


@pytest.mark.parametrize("per_leaf", [(1,), (2, 2), (3, 5, 1), (c.MAX_WORKERS,) * c.MAX_LEAVES])
def test_tofino_admits_a_leaf_with_as_many_workers_as_the_job_has_leaves(per_leaf):
    # Its workers' mask equals the result's (the mask of leaves), up to 32 leaves of 32 workers: Tofino
    # tells a copy awaiting its parent from a final one by the copy's state, so both masks may be equal,
    # and each switch has one full_round entry.
    found = fabric_entries(fabric(per_leaf), target="tna")
    assert sum(len(entries_of(e.tables, WORKERS_TABLE)) for name, e in found.items() if name != "spine") \
        == sum(per_leaf)
    for index, workers in enumerate(per_leaf):
        rows = entries_of(found[f"leaf{index}"].tables, FULL_ROUND_TABLE)
        assert [(dict(e.match)["hdr.lhc.bitmap"], e.action) for e in rows] == \
            [((1 << workers) - 1, ROUND_AWAITS_PARENT)]
    rows = entries_of(found["spine"].tables, FULL_ROUND_TABLE)
    assert [(dict(e.match)["hdr.lhc.bitmap"], e.action) for e in rows] == \
        [((1 << len(per_leaf)) - 1, ROUND_IS_FULL)]


def test_a_result_mask_must_be_a_leafs_and_hold_its_own_bit():
    leaf = fabric_layouts(fabric())["leaf1"]
    assert leaf.result_mask == 0x3
    with pytest.raises(InvalidJob, match=r"result mask 0x1 must be a leaf's parent's mask of leaves, hold"):
        validate(dataclasses.replace(leaf, result_mask=0x1))
    with pytest.raises(InvalidJob, match=r"result mask 0x7 must be a leaf's"):
        validate(dataclasses.replace(job(3), result_mask=0x7))
