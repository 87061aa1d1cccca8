"""The rows of ``lhc-bench aggregate`` over the hosts' process group (TCP on loopback, or the emulated
links), in the same processes: ``gloo``, the same dense float32 buckets allreduced by torch.distributed's
Gloo backend, what data-parallel training runs without a switch; and ``hosts``, the lhc codec's dense mode
over that process group (``host_agent.process_group``), the path ``path="fastest"`` gives a dense bucket,
exact like the switch's rows.

Timed like the switch rows (one untimed call, then per repeat a one-element line-up and the timed call;
the fastest counts). Checked against the sum computed here in float64 and rounded once to float32: a
float allreduce adds in an order of its choosing and rounds after every addition, so it is not bit-exact;
``exact`` says whether it happened to be, and the check is ``max_error <= tolerance``, a bound on the
rounding of any summation order.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

#: float32's unit roundoff
UNIT_ROUNDOFF = 2.0**-24


def worst(errors: list[float]) -> float:
    """The largest error, NaN if any is (Python's max would hide a NaN behind an earlier number)."""
    return math.nan if any(math.isnan(e) for e in errors) else max(errors)


def float_sum_check(total: torch.Tensor, inputs: list[torch.Tensor]) -> dict:
    """``total`` against the float64 sum of ``inputs`` rounded to float32. Adding W float32 terms in any
    order is off the exact sum by at most (W - 1) u sum|x| to first order (u the unit roundoff), and the
    reference by u sum|x|: ``tolerance`` is W u max(sum|x|) with 1% to spare for the higher orders and
    the float64 sum's own rounding."""
    exact_sum = torch.zeros(total.shape, dtype=torch.float64)  # one input at a time: W copies of a 4M
    magnitude = torch.zeros(total.shape, dtype=torch.float64)  # bucket in float64 would be 256 MB
    for x in inputs:
        exact_sum += x
        magnitude += x.abs()
    reference = exact_sum.to(torch.float32)
    return {
        "exact": torch.equal(total, reference),
        "max_error": (total.to(torch.float64) - reference).abs().max().item(),
        "tolerance": len(inputs) * UNIT_ROUNDOFF * magnitude.max().item() * 1.01,
    }


def process_group_rows(mine: torch.Tensor, everyone: list[torch.Tensor], rank: int, init_method: str,
                       repeats: int, exact_sum: Callable[[list[torch.Tensor], int | None], torch.Tensor]
                       ) -> list[dict]:
    """Allreduce ``mine`` in a Gloo process group of ``len(everyone)`` processes, then aggregate it
    with the lhc codec over the same group; two JSON rows. ``exact_sum(inputs, scale)``: the sum of the
    inputs quantized at ``scale``, which the ``hosts`` row must equal bit for bit."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=len(everyone))
    try:
        gloo = _gloo_row(mine, everyone, rank, repeats)
        return [gloo, _hosts_row(mine, everyone, rank, repeats, exact_sum)]
    finally:
        dist.destroy_process_group()


def _gloo_row(mine: torch.Tensor, everyone: list[torch.Tensor], rank: int, repeats: int) -> dict:
    dist.all_reduce(mine.clone())  # connections and buffers, untimed
    line_up = torch.zeros(1)
    times, exact, errors, tolerance = [], True, [], 0.0
    for _ in range(repeats):
        total = mine.clone()  # all_reduce sums in place
        dist.all_reduce(line_up)
        started = time.perf_counter()
        dist.all_reduce(total)
        times.append(time.perf_counter() - started)
        check = float_sum_check(total, everyone)
        exact &= check["exact"]
        errors.append(check["max_error"])
        tolerance = check["tolerance"]  # the same inputs every time
    return {
        "mode": "gloo", "chosen": "gloo", "rank": rank, "seconds": min(times),
        "reference": "float64 sum rounded to float32", "exact": exact, "max_error": worst(errors),
        "tolerance": tolerance,
        # Gloo's bytes, retransmissions and phases are inside its TCP transport: not measured here
        "bytes_per_worker": None, "packets": None, "retransmissions": None, "rtt_s": None, "rto_s": None,
        "encode_s": None, "network_s": None, "decode_s": None,
    }


def _hosts_row(mine: torch.Tensor, everyone: list[torch.Tensor], rank: int, repeats: int,
               exact_sum: Callable[[list[torch.Tensor], int | None], torch.Tensor]) -> dict:
    from host_agent.agent import Agent
    from host_agent.process_group import ProcessGroupBackend

    line_up = torch.zeros(1)
    times, exact, errors = [], True, []
    with Agent(ProcessGroupBackend(), mode="dense") as agent:
        result = agent.allreduce(mine, key="hosts")  # the bucket's scale, the group's buffers: untimed
        for _ in range(repeats):
            dist.all_reduce(line_up)
            started = time.perf_counter()
            result = agent.allreduce(mine, key="hosts")
            times.append(time.perf_counter() - started)
            reference = exact_sum(everyone, result.stats["codec"]["scale"])
            exact &= torch.equal(result.total, reference)
            errors.append((result.total - reference).abs().max().item())
    stats = result.stats
    return {
        "mode": "hosts", "chosen": stats["mode"], "rank": rank, "seconds": min(times),
        "reference": "quantized integer sum", "exact": exact, "max_error": worst(errors), "tolerance": 0.0,
        "bytes_per_worker": None, "packets": None, "retransmissions": None, "rtt_s": None, "rto_s": None,
        "encode_s": stats["encode_s"], "network_s": stats["network_s"], "decode_s": stats["decode_s"],
    }
