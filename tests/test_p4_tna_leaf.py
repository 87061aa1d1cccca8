"""A leaf's copy on TNA through its three states, checked without a Tofino compiler.

On v1model a leaf's copy counts down (docs/switch.md, "The leaf"); on TNA a round ends by its bitmap
(`full_round`), so the copy's state in `bitmaps.hi` tells a copy awaiting its parent from a final one, and
`parent_bitmaps` keeps the bitmap of the parent's result that the copy repeats. This test runs the
RegisterActions and the `outcome` table's const entries as written in p4src/tna, with the `full_round`
entries the controller writes (``lhc_ina.jobs.job_entries(..., target="tna")``), through a round of a leaf
with fewer, as many (up to 32 of 32) and more workers than the job has leaves: the masks coincide when the
counts are equal, and the state, not the bitmap, must tell the copies apart.
"""

from __future__ import annotations

import re

import pytest
from test_p4_program import TNA_P4, _block, _const_entries, _register_actions, parse_program, preprocess
from test_p4_tna_rounds import Cell, execute

from lhc_ina import constants as c
from lhc_ina.fabric import fabric_layouts
from lhc_ina.jobs import FULL_ROUND_TABLE, ROUND_AWAITS_PARENT, ROUND_IS_FULL, job_entries
from tests.test_fabric import entries_of, fabric


class Tna:
    """What the test reads from the program: RegisterActions, constants, `outcome`'s keys and entries."""

    def __init__(self, text: str) -> None:
        program = parse_program(text)
        ingress = program.controls["LhcIngress"]
        self.actions = _register_actions(ingress)
        self.consts = {name: int(value, 0) for name, value in
                       re.findall(r"\bconst\s+bit<\d+>\s+(\w+)\s*=\s*(\w+)\s*;", text)}
        self.outcome_keys = [key for key, _ in program.tables["LhcIngress.outcome"].keys]
        table = _block(ingress, ingress.index("{", ingress.index("table outcome ")))
        self.outcome_entries = _const_entries(table)
        self.apply = re.sub(r"\s+", " ", ingress)

    def register(self, action: str, cell: Cell, **fields: int) -> int:
        names = {name.replace("__", "."): value for name, value in fields.items()} | self.consts
        return execute(self.actions[action][1], cell, names)

    def outcome(self, **keys: int) -> str:
        """The first const entry that matches (entries are in priority order; `_` matches anything)."""
        values = [keys[key.split(".")[-1]] for key in self.outcome_keys]
        for entry, action in self.outcome_entries:
            if all(k == "_" or self.value(k) == v for k, v in zip(entry, values, strict=True)):
                return action
        return "NoAction"

    def value(self, token: str) -> int:
        return self.consts[token] if token in self.consts else int(token, 0)


@pytest.fixture(scope="module")
def tna(tmp_path_factory: pytest.TempPathFactory) -> Tna:
    return Tna(preprocess(TNA_P4, tmp_path_factory.mktemp("cpp_tna_leaf")))


class Copy:
    """One cell of a switch running one job: its registers, and the first pass of ingress.p4's apply block
    for packets of the copy's round (the round registers' verdict, `stale` 0, is the caller's `first`)."""

    def __init__(self, tna: Tna, full_round: dict[int, str], has_uplink: int) -> None:
        self.tna, self.full_round, self.has_uplink = tna, full_round, has_uplink
        self.bitmaps, self.parent = Cell(0, 0), Cell(0, 0)

    def _outcome(self, from_parent: int, vmode: str, seen: int, bitmap: int, finished: int,
                 parent_bitmap: int) -> str:
        action = self.full_round.get(bitmap)
        finished |= action == ROUND_IS_FULL
        return self.tna.outcome(from_parent=from_parent, vmode=self.tna.consts[vmode], seen=seen,
                                finished=finished, awaits=int(action == ROUND_AWAITS_PARENT), flags=0,
                                has_uplink=self.has_uplink, parent_bitmap=parent_bitmap)

    def data(self, rank: int, first: bool = False) -> tuple[str, int]:
        """A worker's DATA (a leaf's partial, at a spine): the outcome and the bitmap it carries on."""
        bit = 1 << rank
        if first:  # start_round(); forget_parent_result();
            self.tna.register("bitmap_start", self.bitmaps, meta__worker_bit=bit)
            self.tna.register("parent_bitmap_clear", self.parent)
            old, vmode, parent_bitmap = 0, "LHC_VMODE_START", 0
        else:  # join_round(); read_parent_result();
            old = self.tna.register("bitmap_join", self.bitmaps, meta__worker_bit=bit)
            parent_bitmap = self.tna.register("parent_bitmap_read", self.parent)
            vmode = "LHC_VMODE_SAME"
        bitmap = old | bit  # note_bitmap()
        action = self._outcome(0, vmode, old & bit, bitmap, 0, parent_bitmap)
        if action in ("up", "up_retransmit"):  # the later pass that sends the partial up
            self.tna.register("bitmap_await", self.bitmaps, hdr__lhc__bitmap=bitmap)
        return action, parent_bitmap if action == "retransmit_parent_result" else bitmap

    def parent_result(self, bitmap: int) -> str:
        """The parent's result of the copy's round (store_result(), then the branch on the state)."""
        state = self.tna.register("bitmap_store", self.bitmaps, hdr__lhc__bitmap=bitmap)
        vmode, finished = "LHC_VMODE_NONE", 0
        if state == self.tna.consts["LHC_AWAITING_PARENT"]:  # stored_result()
            vmode = "LHC_VMODE_START"
            self.tna.register("parent_bitmap_store", self.parent, hdr__lhc__bitmap=bitmap)
        elif state == self.tna.consts["LHC_COPY_FINAL"]:  # result_already_stored()
            finished = 1
        return self._outcome(1, vmode, 0, bitmap, finished, 0)


def test_the_model_follows_the_program(tna: Tna) -> None:
    # The apply block and actions the Copy above mirrors, as they are written.
    for text in (
        "start_round(); forget_parent_result(); } else { join_round(); read_parent_result(); } "
        "note_bitmap();",
        "store_result(); if (meta.old_bitmap == LHC_AWAITING_PARENT) { stored_result(); } "
        "else if (meta.old_bitmap == LHC_COPY_FINAL) { result_already_stored(); }",
        "action forget_parent_result() { parent_bitmap_clear.execute(meta.cell); }",
        "action read_parent_result() { meta.parent_bitmap = parent_bitmap_read.execute(meta.cell); }",
        "action stored_result() { meta.vmode = LHC_VMODE_START; parent_bitmap_store.execute(meta.cell); }",
        "action result_already_stored() { meta.finished = 1; }",
        "action retransmit_parent_result() { hdr.lhc.bitmap = meta.parent_bitmap; retransmit(); }",
    ):
        assert text in tna.apply, text
    assert [key.split(".")[-1] for key in tna.outcome_keys] == [
        "from_parent", "vmode", "seen", "finished", "awaits", "flags", "has_uplink", "parent_bitmap"]


@pytest.mark.parametrize("per_leaf, leaf", [
    ((1,), 0), ((2, 2), 1), ((c.MAX_WORKERS,) * c.MAX_LEAVES, c.MAX_LEAVES - 1),  # as many as leaves
    ((5, 3), 0), ((c.MAX_WORKERS, 1), 0),  # more workers than leaves
    ((1, 2, 3), 0), ((2,) + (1,) * 30, 0),  # fewer
])
def test_a_leafs_copy_awaits_its_parent_then_is_final(tna: Tna, per_leaf, leaf) -> None:
    layout = fabric_layouts(fabric(per_leaf))[f"leaf{leaf}"]
    rows = entries_of(job_entries(layout, target="tna").tables, FULL_ROUND_TABLE)
    full_round = {dict(e.match)["hdr.lhc.bitmap"]: e.action for e in rows}
    n, leaves = per_leaf[leaf], (1 << len(per_leaf)) - 1
    workers = (1 << n) - 1
    copy = Copy(tna, full_round, has_uplink=1)
    # Aggregating: the last worker's packet sends the partial up; a parent's result is not awaited yet.
    for rank in range(n):
        want = "up" if rank == n - 1 else "absorbed"
        assert copy.data(rank, first=rank == 0) == (want, (1 << rank + 1) - 1), rank
        if rank == 0 and n > 1:
            assert Copy(tna, full_round, 1).parent_result(leaves) == "reject_stale_result"
            probe = Copy(tna, full_round, 1)
            probe.data(0, first=True)
            assert probe.parent_result(leaves) == "reject_stale_result"
    assert copy.bitmaps == Cell(workers, tna.consts["LHC_AWAITING_PARENT"])
    # Awaiting: a repeat sends the partial up again.
    assert copy.data(0) == ("up_retransmit", workers)
    # The parent's result is stored once: the copy is final, its workers' bitmap kept, the result's beside.
    assert copy.parent_result(leaves) == "result_from_parent"
    final = Cell(workers, tna.consts["LHC_COPY_FINAL"])
    assert (copy.bitmaps, copy.parent.lo) == (final, leaves)
    assert copy.parent_result(leaves) == "duplicate"
    # Final: every worker's repeat gets RESULT_RETX with the parent's bitmap, and writes nothing; a late
    # pass of an earlier repeat's partial does not make the copy await again.
    for rank in range(n):
        assert copy.data(rank) == ("retransmit_parent_result", leaves), rank
    tna.register("bitmap_await", copy.bitmaps, hdr__lhc__bitmap=workers)
    assert (copy.bitmaps, copy.parent.lo) == (final, leaves)
    assert copy.parent_result(leaves) == "duplicate"
    # The copy's next round starts afresh (a leaf of one worker: its partial goes up at once).
    assert copy.data(0, first=True) == ("up" if n == 1 else "absorbed", 1)
    state = "LHC_AWAITING_PARENT" if n == 1 else "LHC_COPY_AGGREGATING"
    assert (copy.bitmaps, copy.parent.lo) == (Cell(1, tna.consts[state]), 0)


@pytest.mark.parametrize("members", [1, 2, c.MAX_LEAVES])
def test_a_spine_finishes_by_its_mask_and_answers_repeats_with_it(tna: Tna, members) -> None:
    layout = fabric_layouts(fabric((1,) * members))["spine"]
    rows = entries_of(job_entries(layout, target="tna").tables, FULL_ROUND_TABLE)
    copy = Copy(tna, {dict(e.match)["hdr.lhc.bitmap"]: e.action for e in rows}, has_uplink=0)
    mask = (1 << members) - 1
    for index in range(members):
        want = "result" if index == members - 1 else "absorbed"
        assert copy.data(index, first=index == 0) == (want, (1 << index + 1) - 1), index
    for index in range(members):
        assert copy.data(index) == ("retransmit", mask), index
    assert copy.bitmaps == Cell(mask, tna.consts["LHC_COPY_AGGREGATING"]) and copy.parent.lo == 0
