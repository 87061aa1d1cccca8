"""WorkerSession as a transport drives it: agreement between workers, one failure type, the split between
storing results (I/O thread) and computing on them (worker thread), and options checked up front."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from host_agent.codec import AggregationError, WorkerSession, aggregate_local, reduce_words
from host_agent.codec.agreement import AGREE_WORDS
from lhc_ina.constants import Op


def sparse(seed: int, n: int = 3000, density: float = 0.05, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.where(torch.rand(n, generator=g) < density, torch.randn(n, generator=g), 0.0)
    return x.to(dtype)


def first_round_errors(sessions: list[WorkerSession]) -> list[AggregationError]:
    """Reduce the first message of every session (the agreement) and collect what each one raises."""
    msgs = [s.next_message() for s in sessions]
    assert all(m is not None and m.kind == "agree" and m.op == Op.ADD for m in msgs)
    assert {m.words.numel() for m in msgs} == {AGREE_WORDS}  # the same length whatever the parameters
    agg = reduce_words(Op.ADD, [m.words for m in msgs])
    errors = []
    for s in sessions:
        with pytest.raises(AggregationError) as failure:
            s.receive(agg)
        errors.append(failure.value)
    return errors


def assert_same_error(errors: list[AggregationError], ranks: tuple[int, ...], match: str) -> None:
    assert all(str(e) == str(errors[0]) and e.ranks == ranks for e in errors), [str(e) for e in errors]
    assert match in str(errors[0])


def test_workers_that_each_think_the_world_is_two_fail_together():
    # four contributors each built with world_size=2: the sum would wrap (each holds int_bound(2))
    x = torch.full((10,), (2**31 - 1) // 2, dtype=torch.int32)
    sessions = [WorkerSession(x, rank % 2, 2, mode="dense") for rank in range(4)]
    errors = first_round_errors(sessions)
    assert_same_error(errors, (), "claimed by more than one")
    for s in sessions:
        assert s.failed and not s.done and str(s.error) == str(errors[0])
        with pytest.raises(AggregationError):
            s.next_message()  # not None: a failed session never looks finished
        with pytest.raises(AggregationError):
            s.result()


def test_a_missing_worker_is_named():
    sessions = [WorkerSession(sparse(r), r, 4) for r in range(4)]
    msgs = [s.next_message() for s in sessions]
    agg = reduce_words(Op.ADD, [m.words for m in msgs[:3]])  # rank 3's contribution never arrived
    for s in sessions:
        with pytest.raises(AggregationError, match=r"3 of 4 workers") as failure:
            s.receive(agg)
        assert failure.value.ranks == (3,)


DIFFERENCES = {
    "seed": {"seed": 7},
    "margin": {"margin": 0.5},
    "mode": {"mode": "union"},
    "block": {"block": 4},
    "headroom": {"headroom": 3},
    "index": {"index": "bloom"},
    "cells": {"cells": 99},
    "expected_items": {"expected_items": 123},
    "length": {"n": 2999},
    "dtype": {"dtype": torch.float16},
    "world_size": {"world": 9},
}


@settings(max_examples=40, deadline=None)
@given(
    world=st.integers(2, 8),
    difference=st.sampled_from(sorted(DIFFERENCES)),
    data=st.data(),
)
def test_any_difference_between_workers_fails_on_every_worker_naming_the_odd_ones(world, difference, data):
    # at most half of them, rank 0 not among them: the reference group is the largest, ties to rank 0
    odd = data.draw(st.sets(st.integers(1, world - 1), min_size=1, max_size=world // 2))
    sessions = []
    for rank in range(world):
        change = dict(DIFFERENCES[difference]) if rank in odd else {}
        n, dtype, size = change.pop("n", 3000), change.pop("dtype", torch.float32), change.pop("world", world)
        sessions.append(WorkerSession(sparse(rank, n, dtype=dtype), rank, size, **change))
    errors = first_round_errors(sessions)
    assert_same_error(errors, tuple(sorted(odd)), "disagree on the codec parameters")


def test_states_of_different_histories_are_a_disagreement():
    xs = [sparse(r) for r in range(3)]
    state = aggregate_local(xs).state
    sessions = [WorkerSession(x, r, 3, state=state if r else None) for r, x in enumerate(xs)]
    errors = first_round_errors(sessions)
    assert_same_error(errors, (0,), "disagree")


def test_agreeing_workers_pass_the_check_in_every_mode():
    for mode in ("sketch", "union", "dense"):
        xs = [sparse(r) for r in range(5)]
        result = aggregate_local(xs, mode=mode)
        assert result.stats["steps"][0] == {"round": 1, "op": "ADD", "kind": "agree", "words": AGREE_WORDS}


def test_receive_only_stores_and_advance_computes_in_a_worker_thread(monkeypatch):
    import host_agent.codec.protocol as protocol

    calls: list[str] = []
    for module, name in ((protocol, "peel"), (protocol, "query_index"), (protocol, "nonzero_rows"),
                         (protocol, "encode_sketch")):
        real = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda *a, _real=real, _name=name: calls.append(_name) or _real(*a)
        )
    xs = [sparse(r, 20_000, 0.02) for r in range(4)]
    state = aggregate_local(xs).state
    calls.clear()
    sessions = [WorkerSession(x, r, 4, state=state) for r, x in enumerate(xs)]
    worker = ThreadPoolExecutor(1, thread_name_prefix="codec-compute")
    io_thread = threading.current_thread()
    compute_threads: set[str] = set()

    def advance(session: WorkerSession) -> None:
        compute_threads.add(threading.current_thread().name)
        assert session.advance()

    for s in sessions:
        assert s.can_advance
        worker.submit(advance, s).result()  # encoding: the worker thread
    assert set(calls) == {"nonzero_rows", "encode_sketch"}
    calls.clear()
    assert [s.ready_messages for s in sessions] == [3] * 4  # agree, index, sketch
    batches = [[s.next_message() for _ in range(3)] for s in sessions]
    for step in range(3):
        agg = reduce_words(batches[0][step].op, [b[step].words for b in batches])
        for s in sessions:
            s.receive(agg)  # the I/O thread: stores only
    assert calls == [], "receive() must not decode"
    assert threading.current_thread() is io_thread
    for s in sessions:
        assert s.can_advance and not s.done
        worker.submit(advance, s).result()  # decoding: the worker thread
        assert s.done and not s.can_advance and s.next_message() is None
    assert "peel" in calls and "query_index" in calls
    assert compute_threads and all(name.startswith("codec-compute") for name in compute_threads)
    total = sum(x.double() for x in xs)
    assert torch.allclose(sessions[0].result().total.double(), total, atol=1e-5)
    worker.shutdown()


def test_next_message_advances_by_itself_for_simple_drivers():
    xs = [sparse(r) for r in range(3)]
    sessions = [WorkerSession(x, r, 3, mode="union") for r, x in enumerate(xs)]
    while (msgs := [s.next_message() for s in sessions])[0] is not None:
        agg = reduce_words(msgs[0].op, [m.words for m in msgs])
        for s in sessions:
            s.receive(agg)
    assert all(s.done and not s.advance() for s in sessions)


def test_a_local_failure_fails_the_session_with_the_one_error_type(monkeypatch):
    import host_agent.codec.protocol as protocol

    def broken(*args):
        raise MemoryError("no room for the sketch")

    monkeypatch.setattr(protocol, "encode_sketch", broken)
    s = WorkerSession((sparse(0) * 100).to(torch.int32), 1, 2, expected_items=100)  # sketch in round 1
    with pytest.raises(AggregationError, match=r"worker 1 failed.*no room") as failure:
        s.next_message()
    assert failure.value.ranks == (1,) and s.failed and isinstance(failure.value.__cause__, MemoryError)
    with pytest.raises(AggregationError):
        s.next_message()


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("mode", "magic"),
        ("index", "tree"),
        ("margin", -0.1),
        ("margin", float("nan")),
        ("margin", "0.03"),
        ("seed", -1),
        ("seed", 2**64),
        ("seed", 1.5),
        ("headroom", -1),
        ("cells", 2),
        ("expected_items", -3),
        ("block", 0),
        ("timing", "yes"),
    ],
)
def test_options_are_checked_when_the_session_is_made(option, value):
    with pytest.raises(ValueError, match=option):
        WorkerSession(torch.ones(8), 0, 1, **{option: value})


@pytest.mark.parametrize(("rank", "world"), [(2, 2), (-1, 2), (0, 0), (0, 1025), (True, 2)])
def test_ranks_and_world_sizes_are_checked(rank, world):
    with pytest.raises(ValueError):
        WorkerSession(torch.ones(8), rank, world)


def test_timing_is_opt_in():
    xs = [sparse(r) for r in range(2)]
    plain = aggregate_local(xs)
    assert plain.stats["encode_s"] is None and plain.stats["decode_s"] is None
    assert plain.stats["stage_s"] is None
    timed = aggregate_local(xs, timing=True)
    assert timed.stats["encode_s"] > 0 and len(timed.stats["decode_s_per_worker"]) == 2


@pytest.mark.parametrize(("mode", "stages"), [
    ("sketch", {"index", "peel", "output", "granularity"}),
    ("union", {"index", "output", "granularity"}),
    ("dense", {"output"}),
])
def test_timed_decode_names_its_stages_within_its_total(mode, stages):
    timed = aggregate_local([sparse(r) for r in range(3)], mode=mode, timing=True)
    stage_s = timed.stats["stage_s"]
    assert set(stage_s) == {f"decode.{stage}" for stage in stages}
    assert all(seconds > 0 for seconds in stage_s.values())
    assert sum(stage_s.values()) <= timed.stats["decode_s"] * (1 + 1e-9)


@pytest.mark.parametrize("mode", ["sketch", "union", "dense"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_a_sum_beyond_the_dtype_raises_instead_of_returning_inf(mode, dtype):
    big = 60000.0 if dtype == torch.float16 else 3e38
    xs = [torch.zeros(100, dtype=dtype) for _ in range(2)]
    for x in xs:
        x[5] = big
    with pytest.raises(AggregationError, match=f"overflows {dtype}"):
        aggregate_local(xs, mode=mode)
    for x in xs:
        x[5] = big / 2  # the largest sum that fits
    assert torch.isfinite(aggregate_local(xs, mode=mode).total).all()


def test_a_support_that_misses_a_nonzero_is_an_agreed_error():
    xs = [sparse(r) for r in range(3)]
    supports = [torch.nonzero(x).squeeze(1) for x in xs]
    supports[1] = supports[1][1:]  # drops one nonzero of worker 1
    with pytest.raises(AggregationError, match=r"support of worker\(s\) \[1\]") as failure:
        aggregate_local(xs, supports=supports)
    assert failure.value.ranks == (1,)
    # the stated contract when the check is off: elements outside the support count as zero
    dropped = int(torch.nonzero(xs[1])[0])
    result = aggregate_local(xs, supports=supports, check_support=False, mode="union")
    expected = sum(xs) - torch.where(torch.arange(3000) == dropped, xs[1], 0.0)
    assert torch.allclose(result.total, expected, atol=1e-6)


def test_support_of_the_wrong_kind_is_rejected_when_the_session_is_made():
    with pytest.raises(TypeError, match="support"):
        WorkerSession(torch.ones(8), 0, 1, support=torch.tensor([0.5]))
    with pytest.raises(ValueError, match="outside"):
        WorkerSession(torch.ones(8), 0, 1, support=torch.tensor([8]))


@pytest.mark.parametrize("mode", ["sketch", "union", "dense"])
def test_without_the_support_check_elements_outside_the_support_count_as_zero(mode):
    """Worker 0 holds 1e30 outside its support where worker 1's support holds 2: the sum is 2 in every
    mode (before, union read the 1e30 as a candidate's value at a scale that never saw it: -14)."""
    x0, x1 = torch.zeros(100), torch.zeros(100)
    x0[5], x0[7], x1[5] = 1e30, 1.0, 2.0
    supports = [torch.tensor([7]), torch.tensor([5])]
    result = aggregate_local([x0, x1], mode=mode, supports=supports, check_support=False)
    expected = torch.zeros(100)
    expected[5], expected[7] = 2.0, 1.0
    assert torch.equal(result.total, expected), result.total[[5, 7]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_only_words_that_are_no_view_of_the_bucket_or_its_output_are_scratch(dtype):
    """A backend may reduce scratch words in place: a float bucket's quantized words are the codec's own,
    an int32 bucket is sent as it is (its words are the caller's) and the output given may be the bucket."""
    x = torch.arange(1, 200, dtype=dtype)
    session = WorkerSession(x, 0, 1, mode="dense", out=x)
    messages = []
    while (message := session.next_message()) is not None:
        messages.append(message)
        session.receive(message.words.clone())
    dense = [m for m in messages if m.kind == "dense"]
    assert dense and all(m.scratch == (dtype == torch.float32) for m in dense)
    assert all(m.scratch for m in messages if m.kind != "dense")  # the agreement and header are made here
