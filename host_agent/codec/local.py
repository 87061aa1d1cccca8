"""``aggregate_local``: the whole multi-worker protocol in one process, with an in-memory switch.

It drives one :class:`WorkerSession` per input and reduces each step exactly as the switch does (ADD:
int32 sum mod 2^32; OR: bitwise or). Users run it to see what LHC would save on their own gradients;
tests and benchmarks use it. It also checks that every worker decoded the same total, bit for bit, and
that every worker raised the same AggregationError when one failed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from host_agent.errors import AggregationError
from lhc_ina.constants import MAX_JOB_WORKERS, Op

from .arith import add_int32, or_int32
from .session import WorkerSession, check_input
from .state import CodecState, WorkerResult


@dataclass
class AggregateResult:
    total: torch.Tensor  # the sum of the inputs, in their dtype
    stats: dict  # worker 0's stats, with encode_s / decode_s / stage_s averaged over workers
    state: CodecState  # pass to the next aggregate_local of the same bucket
    workers: list[WorkerResult]


def reduce_words(op: Op, words: Sequence[torch.Tensor]) -> torch.Tensor:
    """What the switch does to one step's words of all workers."""
    return add_int32(list(words)) if op == Op.ADD else or_int32(list(words))


def _check_inputs(inputs: Sequence[torch.Tensor]) -> None:
    if not isinstance(inputs, (list, tuple)) or not inputs:
        raise ValueError("inputs must be a non-empty list of 1-D tensors, one per worker")
    if len(inputs) > MAX_JOB_WORKERS:
        raise ValueError(f"{len(inputs)} workers: at most {MAX_JOB_WORKERS} (MAX_JOB_WORKERS) are supported")
    for x in inputs:
        check_input(x)
    first = inputs[0]
    for rank, x in enumerate(inputs):
        if x.dtype != first.dtype:
            raise TypeError(f"worker {rank} has dtype {x.dtype}, worker 0 has {first.dtype}")
        if x.numel() != first.numel():
            raise ValueError(f"worker {rank} has {x.numel()} elements, worker 0 has {first.numel()}")
        if x.device != first.device:
            raise ValueError(f"worker {rank} is on {x.device}, worker 0 on {first.device}")


def aggregate_local(
    inputs: Sequence[torch.Tensor],
    mode: str = "sketch",
    block: int = 1,
    *,
    state: CodecState | None = None,
    supports: Sequence[torch.Tensor] | None = None,
    outs: Sequence[torch.Tensor] | None = None,
    worker_options: Sequence[dict] | None = None,
    **options,
) -> AggregateResult:
    """Aggregate one bucket over ``len(inputs)`` in-process workers; ``total`` is exactly their sum.

    ``inputs``: equal-length 1-D int32 or float32 tensors (float16/bfloat16 work too), one per worker.
    ``mode``: "sketch", "union" or "dense". ``block``: elements per item. ``state``: the previous
    round's ``result.state`` for this bucket (sizes the index and sketch, and the scale, from it).
    ``supports``: per worker, the element indices of its nonzeros, if known (encoding is then O(nnz)).
    ``outs``: per worker, a preallocated output (may be the input itself). ``worker_options``: per worker,
    options of its own (the local ones: ``timing``, ``kernels``, ``count_launches``; a shared one that
    differs makes the workers disagree, as it should). Other ``options`` go to
    :class:`WorkerSession` (``expected_items``, ``margin``, ``headroom``, ``seed``, ``index``,
    ``cells``, ``timing``, ``check_support``). Raises AggregationError when the workers do (the same
    error on every worker, checked).
    """
    _check_inputs(inputs)
    world = len(inputs)
    if supports is not None and len(supports) != world:
        raise ValueError("supports must hold one tensor per worker")
    if outs is not None and len(outs) != world:
        raise ValueError("outs must hold one tensor per worker")
    if worker_options is not None and len(worker_options) != world:
        raise ValueError("worker_options must hold one dict per worker")
    sessions = [
        WorkerSession(
            x,
            rank,
            world,
            mode=mode,
            block=block,
            state=state,
            support=None if supports is None else supports[rank],
            out=None if outs is None else outs[rank],
            **{**options, **(worker_options[rank] if worker_options is not None else {})},
        )
        for rank, x in enumerate(inputs)
    ]
    _drive(sessions)
    results = [s.result() for s in sessions]
    for rank, r in enumerate(results[1:], start=1):
        same = torch.equal(r.total.isnan(), results[0].total.isnan()) and torch.equal(
            r.total.nan_to_num(), results[0].total.nan_to_num())  # NaN (a non-finite input) != NaN
        if not same or r.state != results[0].state:
            raise RuntimeError(f"worker {rank} decoded a different total than worker 0 (a codec bug)")
    stats = dict(results[0].stats)
    if stats["encode_s"] is not None:  # timed
        stats["encode_s_per_worker"] = [r.stats["encode_s"] for r in results]
        stats["decode_s_per_worker"] = [r.stats["decode_s"] for r in results]
        stats["encode_s"] = sum(stats["encode_s_per_worker"]) / world
        stats["decode_s"] = sum(stats["decode_s_per_worker"]) / world
        stats["stage_s"] = {key: sum(r.stats["stage_s"].get(key, 0.0) for r in results) / world
                            for key in stats["stage_s"]}
    return AggregateResult(results[0].total, stats, results[0].state, results)


def _drive(sessions: list[WorkerSession]) -> None:
    """Run the sessions to completion, one step at a time; every worker must fail alike, or none."""
    while True:
        errors: list[AggregationError | None] = []
        msgs = []
        for s in sessions:
            try:
                msgs.append(s.next_message())
                errors.append(None)
            except AggregationError as exc:
                errors.append(exc)
        if any(errors):
            _raise_agreed(errors)
        if all(m is None for m in msgs):
            return
        steps = {None if m is None else (m.op, m.words.numel()) for m in msgs}
        if len(steps) != 1 or None in steps:
            raise RuntimeError("workers disagree on the protocol step (a codec bug)")
        agg = reduce_words(msgs[0].op, [m.words for m in msgs])  # type: ignore[union-attr]
        errors = []
        for s in sessions:
            try:
                s.receive(agg)
                errors.append(None)
            except AggregationError as exc:
                errors.append(exc)
        if any(errors):
            _raise_agreed(errors)


def _raise_agreed(errors: list[AggregationError | None]) -> None:
    first = errors[0]
    if first is None or any(e is None or str(e) != str(first) or e.ranks != first.ranks for e in errors):
        raise RuntimeError(f"workers failed differently (a codec bug): {[str(e) for e in errors]}")
    raise first
