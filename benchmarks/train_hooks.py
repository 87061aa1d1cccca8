"""One way's communication hook on one rank: attached to the DDP model, measured (gradient density per
bucket, elements and bytes per step), saved and restored with a checkpoint, closed at the end.

Plain DDP runs without a hook (as users run it); the others go through ``measured_hook``, which counts a
bucket before handing it to the way's hook.
"""

# No ``from __future__ import annotations``: DDP checks the hook's annotations as objects.
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel

from benchmarks.train_ways import POWERSGD_RANK, POWERSGD_START_ITER, Way

BYTES_PER_ELEMENT = 4


def ring_bytes(elements: float, world: int) -> float:
    """What one worker sends in a ring allreduce of ``elements`` float32 values (payload only)."""
    return 2 * (world - 1) / world * BYTES_PER_ELEMENT * elements


class Measured:
    """The state of ``measured_hook``: the way's own hook and state, and what the buckets held."""

    def __init__(self, hook: Callable, state: Any) -> None:
        self.hook, self.state = hook, state
        self.measuring = False
        #: hand every bucket back as it is, untouched and uncounted (``WayHook.passing_through``)
        self.passing = False
        #: bucket index -> (non-zero entries, entries) of this rank's gradient, where measured
        self.density: dict[int, tuple[int, int]] = {}
        self.elements = 0


def measured_hook(state: Measured, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Count the bucket (its non-zeros on the measured step), then aggregate it the way's way."""
    buffer = bucket.buffer()
    if state.passing:
        done: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        done.set_result(buffer)
        return done
    state.elements += buffer.numel()
    if state.measuring:
        state.density[bucket.index()] = (int(torch.count_nonzero(buffer)), buffer.numel())
    return state.hook(state.state, bucket)


class WayHook:
    """The hook of ``way`` on this rank (nothing for plain DDP)."""

    def __init__(self, way: Way, world: int, *, controller: str | None = None, job: str | None = None,
                 ip: str = "127.0.0.1", host: str = "") -> None:
        self.way, self.world = way, world
        self.measured: Measured | None = None
        self._compressed_before = 0
        if way.hook == "powersgd":
            state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=POWERSGD_RANK,
                                           start_powerSGD_iter=POWERSGD_START_ITER)
            self.measured = Measured(powersgd.powerSGD_hook, state)
        elif way.hook == "lhc":
            from host_agent.torch_hook import LhcHookState, lhc_hook

            if not (controller and job):
                raise SystemExit(f"way {way.name} aggregates through the switch: give --controller and --job")
            state = LhcHookState.join(controller, job, mode=way.mode, topk_ratio=way.topk_ratio, ip=ip,
                                      host=host, path=way.path)
            self.measured = Measured(lhc_hook, state)

    def attach(self, model: DistributedDataParallel) -> None:
        if self.measured is not None:
            model.register_comm_hook(self.measured, measured_hook)

    def passing_through(self, on: bool) -> None:
        """While ``on``, the hook aggregates nothing and leaves its state alone."""
        if self.measured is not None:
            self.measured.passing = on

    def measure(self, on: bool) -> None:
        """Count the non-zeros of the buckets of the coming step (``on``) or not."""
        if self.measured is not None:
            self.measured.measuring = on

    def pop_step(self, parameters: int) -> dict[str, float]:
        """Bytes this worker sent in the step just done: the switch's whole frames as the agent counted
        them, or for the process group's ways the ring allreduce's payload of what was reduced."""
        if self.measured is None:
            return {"bytes": ring_bytes(parameters, self.world), "bytes_basis": "ring allreduce payload"}
        elements, self.measured.elements = self.measured.elements, 0
        state = self.measured.state
        if self.way.hook == "powersgd":
            compressed = state.total_numel_after_compression - self._compressed_before
            self._compressed_before = state.total_numel_after_compression
            # before its first compressed step the hook allreduces every bucket whole
            return {"bytes": ring_bytes(compressed or elements, self.world),
                    "bytes_basis": "ring allreduce payload"}
        stats = state.pop_step_stats()
        return {"bytes": stats["bytes_sent"], "bytes_basis": "frames sent (agent)",
                "modes": sorted(set(state.modes.values())), "paths": sorted(set(state.paths.values())),
                "network_s": stats["network_s"], "encode_s": stats["encode_s"], "decode_s": stats["decode_s"],
                "buckets_by_path": [int(stats["buckets_switch"]), int(stats["buckets_host"])],
                "long_sum_words": {"packed": int(stats["packed_words"]), "plain": int(stats["plain_words"]),
                                   "packed_bytes_sent": int(stats["packed_bytes_sent"])}}

    def density(self) -> dict[int, tuple[int, int]]:
        return dict(self.measured.density) if self.measured is not None else {}

    def settled_paths(self) -> dict[str, str]:
        """Each bucket's path and why, where a policy settled it by timing (``path="fastest"``)."""
        if self.measured is None or self.way.hook == "powersgd":
            return {}
        policy = getattr(self.measured.state.agent.backend, "policy", None)
        return {f"{key[0]}: {key[1]} elements": f"{path} ({policy.reasons[key]})"
                for key, path in getattr(policy, "settled", {}).items()}

    # --- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self.measured is None:
            return {}
        state = self.measured.state
        if self.way.hook == "powersgd":
            return {"powersgd": state.__getstate__(), "compressed_before": self._compressed_before}
        return {"lhc": state.state_dict()}

    def restore(self, saved: dict[str, Any]) -> None:
        """A fresh hook state of the same kind, loaded from ``saved`` (as after a restart), in place of
        the registered hook's; the lhc way keeps its agent, which stays joined to the job."""
        if self.measured is None:
            return
        if self.way.hook == "powersgd":
            state = powersgd.PowerSGDState.__new__(powersgd.PowerSGDState)
            state.__setstate__(saved["powersgd"])
            self._compressed_before = saved["compressed_before"]
        else:
            from host_agent.torch_hook import LhcHookState

            state = LhcHookState(self.measured.state.agent, topk_ratio=self.way.topk_ratio)
            state.load_state_dict(saved["lhc"])
        self.measured.state = state  # the registered hook's

    def close(self) -> None:
        if self.measured is not None and self.way.hook == "lhc":
            self.measured.state.close()
