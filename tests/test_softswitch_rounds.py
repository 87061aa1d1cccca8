"""Round identity in softswitch's pipeline (docs/switch.md, "Round identity"): a packet starts a copy's
round only as that copy's next round, joins only the round in progress, repeats of the finished round are
answered, and everything else is dropped as DROP_STALE_ROUND without touching the switch's state.

The PTF suite (ptf_tests/test_rounds.py) checks the same on the wire and on BMv2; these tests reach what a
wire test cannot: every register cell after a stale packet, and seq wrapping modulo 2^32.
"""

from __future__ import annotations

import numpy as np
import pytest

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.jobs import JobLayout
from lhc_ina.p4info import P4InfoIndex
from lhc_launch.switch_job import data_frame, job_updates, make_job
from softswitch.entity_store import Entities
from softswitch.pipeline import Pipeline
from tests.harness.switch_jobs import position

INDEX = P4InfoIndex.from_file()


@pytest.fixture
def pipeline() -> Pipeline:
    switch = Pipeline(INDEX)
    switch.configured = True
    return switch


def install(pipeline: Pipeline, job: JobLayout) -> None:
    entities = Entities(pipeline, INDEX.p4info)
    for up in job_updates(INDEX, job):
        entities.write(up)


def send(pipeline: Pipeline, job: JobLayout, rank: int, value: int, p: int, **header: int) -> list:
    """Worker ``rank`` sends packet ``p`` (all lanes ``value``); the switch's outputs as (type, bitmap,
    seq, lane 0) per frame."""
    frame = data_frame(job, rank, [value] * c.LANES, **{**position(job, p), **header})
    out = []
    for _, sent in pipeline.inject(frame, job.workers[rank].switch_port):
        lhc, words = wire.unpack_packet(sent[wire.FRAME_LHC : wire.FRAME_END])
        out.append((c.MsgType(lhc.msg_type).name, lhc.bitmap, lhc.seq, int(words[0])))
    return out


def state(pipeline: Pipeline) -> tuple[bytes, ...]:
    return tuple(bytes(a) for a in (pipeline.slot_epoch, pipeline.slot_round, pipeline.slot_bitmap,
                                    pipeline.slot_remaining, pipeline.slot_values))


def test_ghost_round_two_workers_gives_the_exact_sum(pipeline):
    job = make_job(1, 1, 2, slot_count=1)
    install(pipeline, job)
    assert send(pipeline, job, 0, 1, 1) == []
    assert send(pipeline, job, 1, 10, 1) == [("RESULT", 0b11, 1, 11)] * 2
    assert send(pipeline, job, 0, 2, 2) == []
    assert send(pipeline, job, 0, 1, 1) == [("RESULT_RETX", 0b11, 1, 11)]  # late duplicate of A1
    assert send(pipeline, job, 1, 20, 2) == [("RESULT", 0b11, 2, 22)] * 2
    assert send(pipeline, job, 0, 3, 3) == []
    assert send(pipeline, job, 1, 30, 3) == [("RESULT", 0b11, 3, 33)] * 2
    assert pipeline.stats(1) == {"ABSORBED": 3, "RESULT": 3, "RETX": 1}


def test_stale_packets_of_any_age_change_nothing(pipeline):
    job = make_job(1, 1, 2, slot_count=3)
    install(pipeline, job)
    for p in range(40):
        send(pipeline, job, 0, p, p)
        assert send(pipeline, job, 1, 1000, p)[0] == ("RESULT", 0b11, p, p + 1000)
    send(pipeline, job, 0, 7, 40)  # copy (slot 1, copy 1) aggregates round 40; A is in it
    before = state(pipeline)
    for p in range(40):
        if p % 3 == 1 and (p // 3) % 2 == 1:  # packets of that copy: 4, 10, ..., 34
            for rank in (0, 1):
                assert send(pipeline, job, rank, 99, p) == []
    assert state(pipeline) == before
    assert pipeline.stats(1)["DROP_STALE_ROUND"] == 2 * 6
    assert send(pipeline, job, 1, 1000, 40) == [("RESULT", 0b11, 40, 1007)] * 2


def test_a_round_two_ahead_is_stale_and_the_next_round_needs_a_finished_copy(pipeline):
    job = make_job(1, 1, 2, slot_count=2)
    install(pipeline, job)
    send(pipeline, job, 0, 1, 0)
    assert send(pipeline, job, 1, 1, 4) == []  # copy 0's next round, but round 0 is not finished
    assert send(pipeline, job, 1, 1, 8) == []  # two rounds ahead: never valid
    assert pipeline.stats(1) == {"ABSORBED": 1, "DROP_STALE_ROUND": 2}
    assert send(pipeline, job, 1, 2, 0) == [("RESULT", 0b11, 0, 3)] * 2


def test_the_next_round_wraps_modulo_2_32(pipeline):
    job = make_job(1, 1, 1, slot_count=4)
    install(pipeline, job)
    last = (1 << 32) - 8  # copy (slot 0, copy 0) holds this round; its next is seq 0 after the wrap
    assert send(pipeline, job, 0, 5, 0, seq=last) == [("RESULT", 1, last, 5)]
    assert send(pipeline, job, 0, 6, 0) == [("RESULT", 1, 0, 6)]
    assert send(pipeline, job, 0, 7, 0, seq=last) == []
    assert pipeline.stats(1) == {"RESULT": 2, "DROP_STALE_ROUND": 1}


def test_a_new_epoch_starts_any_round_on_a_stale_copy(pipeline):
    job = make_job(1, 1, 1, slot_count=2, epoch=3)
    install(pipeline, job)
    send(pipeline, job, 0, 1, 6)
    renewed = make_job(1, 1, 1, slot_count=2, epoch=4)
    entities = Entities(pipeline, INDEX.p4info)
    entities.write(job_updates(INDEX, renewed, kind=2)[0])
    assert send(pipeline, renewed, 0, 9, 0) == [("RESULT", 1, 0, 9)]


def test_a_repeat_while_aggregating_is_dropped_and_adds_nothing(pipeline):
    job = make_job(1, 1, 3, slot_count=1)
    install(pipeline, job)
    send(pipeline, job, 0, 1, 0)
    assert send(pipeline, job, 0, 1, 0) == []
    assert pipeline.stats(1) == {"ABSORBED": 1, "DROP_DUPLICATE": 1}
    np.testing.assert_array_equal(pipeline.slot_values[0], np.ones(c.LANES, np.uint32))
