"""The DDP communication hook: exact, compressed gradient aggregation in one line of a training script.

    from host_agent.torch_hook import LhcHookState, lhc_hook

    model = DistributedDataParallel(model)
    state = LhcHookState.join(controller="10.0.0.1:9560", job="train")   # through the switch, or
    state = LhcHookState.from_process_group()                            # over Gloo/NCCL alone
    model.register_comm_hook(state, lhc_hook)

Each gradient bucket is aggregated by the agent (mode ``auto`` picks dense, sketch or union per bucket)
and divided by the world size, as DDP's allreduce averages. Integer-valued gradients come back exact;
float gradients are the exact sum of the workers' values quantized at one agreed power-of-two scale
(docs/pytorch.md gives the bound). The hook returns at once: the agent's thread aggregates while
autograd computes the next buckets, and completes the future.

Optional top-k with error feedback (``topk_ratio``) keeps the largest entries of each bucket plus what
was left out before; without it nothing is dropped and the hook is exact.
"""

# No ``from __future__ import annotations`` here: DDP checks the hook's annotations as objects.
from collections import defaultdict
from collections.abc import Hashable
from typing import Any

import torch
import torch.distributed as dist

from host_agent.agent import Agent, AllreduceResult
from host_agent.path_join import (
    DEFAULT_JOIN_TIMEOUT_S,
    deadlines_from_env,
    join_or_fall_back,
    strict_from_env,
)
from host_agent.path_policy import make_policy
from host_agent.paths import DEFAULT_MEET_TIMEOUT_S, DEFAULT_REJOIN_EVERY_S

#: Per-step stats summed over a step's buckets.
_SUMMED = ("bytes_sent", "packets", "retransmissions", "fast_retransmissions", "timer_retransmissions",
           "tail_probes", "encode_s", "network_s", "decode_s", "elements")
#: Per-step sums of the transport's counters: the process group's long sums, packed and plain
#: (``host_agent.long_sum``).
_TRANSPORT_SUMMED = ("packed_words", "packed_bytes_sent", "plain_words")
#: Per-step bucket counts: all, with a NaN or inf, by path (host_agent.paths), redone after a fallback.
_COUNTED = ("buckets", "nonfinite_buckets", "buckets_switch", "buckets_host", "buckets_memory",
            "buckets_redone")


class LhcHookState:
    """What ``lhc_hook`` needs across steps: the agent, per-bucket residuals (top-k) and stats."""

    def __init__(self, agent: Agent, *, topk_ratio: float | None = None, log_every: int = 0) -> None:
        if topk_ratio is not None and not 0 < topk_ratio <= 1:
            raise ValueError(f"topk_ratio must be in (0, 1], not {topk_ratio}")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() != agent.world_size:
            raise ValueError(
                f"the lhc job has {agent.world_size} workers but the process group {dist.get_world_size()}: "
                "DDP divides the sum by its world size, so every rank of this run must be a worker of one "
                "job of that size (another run joined under the same job name?)"
            )
        self.agent = agent
        self.world_size = agent.world_size
        self.topk_ratio = topk_ratio
        self.log_every = log_every
        self.residuals: dict[Hashable, torch.Tensor] = {}
        self.modes: dict[Hashable, str] = {}
        self.paths: dict[Hashable, str] = {}  # each bucket's path at its last step
        self.steps = 0
        self._step: dict[str, float] = defaultdict(float)

    @classmethod
    def join(cls, controller: str, job: str, *, mode: str = "auto", topk_ratio: float | None = None,
             log_every: int = 0, strict: bool | None = None, path: str = "switch",
             **options: Any) -> "LhcHookState":
        """Aggregate through the switch: join ``job`` on the controller at ``controller``. Under
        torch.distributed, the process-group codec stands by: a job the switch cannot serve at the join,
        or a switch path that fails mid-run, moves every rank to it with the same bits
        (``host_agent.paths``), unless ``strict`` (default: ``LHC_STRICT``) asks to fail instead.
        ``options``: ``join_timeout_s``, ``meet_timeout_s``, ``rejoin_every_s`` and
        :meth:`SwitchBackend.join`'s (``timeout_s`` is the stall deadline); they default to the
        environment's (``LHC_*_TIMEOUT_S``, ``LHC_REJOIN_EVERY_S``).
        ``path`` ``"fastest"`` sends each bucket over the path measured faster for it, switch or hosts
        (``host_agent.path_policy``; the same bits either way, the stats say which)."""
        options = {**deadlines_from_env(), **options}
        join_timeout_s = options.pop("join_timeout_s", DEFAULT_JOIN_TIMEOUT_S)
        meet_timeout_s = options.pop("meet_timeout_s", DEFAULT_MEET_TIMEOUT_S)
        rejoin_every_s = options.pop("rejoin_every_s", DEFAULT_REJOIN_EVERY_S)
        strict = strict_from_env() if strict is None else strict
        distributed = dist.is_available() and dist.is_initialized()
        if path != "switch" and (strict or not distributed):
            raise ValueError(f"path={path!r} needs the hosts' process group as a second path: initialize "
                             "torch.distributed first, and leave strict off")
        if strict or not distributed:
            if distributed:
                options.setdefault("world_size", dist.get_world_size())
            agent = Agent.join(controller, job, mode=mode, install_timeout_s=join_timeout_s, **options)
            return cls(agent, topk_ratio=topk_ratio, log_every=log_every)
        from host_agent.process_group import ProcessGroupBackend

        paths = join_or_fall_back(controller, job, ProcessGroupBackend(), join_timeout_s=join_timeout_s,
                                  meet_timeout_s=meet_timeout_s, rejoin_every_s=rejoin_every_s,
                                  policy=make_policy(path, dist.get_world_size()), **options)
        agent = Agent(paths, mode=mode, timeout_s=2 * options.get("timeout_s", 30.0))
        return cls(agent, topk_ratio=topk_ratio, log_every=log_every)

    @classmethod
    def from_process_group(cls, group: dist.ProcessGroup | None = None, *, mode: str = "auto",
                           topk_ratio: float | None = None, log_every: int = 0) -> "LhcHookState":
        """Aggregate over torch.distributed (Gloo or NCCL) with the same codec: no switch needed."""
        from host_agent.process_group import ProcessGroupBackend

        return cls(Agent(ProcessGroupBackend(group), mode=mode), topk_ratio=topk_ratio, log_every=log_every)

    def close(self) -> None:
        self.agent.close()

    # --- stats ---------------------------------------------------------------------------------------
    def record(self, key: Hashable, stats: dict[str, Any]) -> None:
        for name in _SUMMED:
            self._step[name] += stats.get(name, 0)
        for name in _TRANSPORT_SUMMED:
            self._step[name] += stats["transport"].get(name, 0)
        self._step["buckets"] += 1
        self._step["nonfinite_buckets"] += bool(stats["nonfinite_ranks"])
        self._step[f"buckets_{stats['path']}"] += 1  # which path each bucket took
        self._step["buckets_redone"] += bool(stats["redone"])
        self.modes[key] = stats["mode"]
        self.paths[key] = stats["path"]

    def pop_step_stats(self) -> dict[str, float]:
        """What the buckets aggregated since the last call cost, summed; resets the tally."""
        stats = dict(self._step)
        for name in (*_SUMMED, *_TRANSPORT_SUMMED, *_COUNTED):
            stats.setdefault(name, 0.0)
        backend = self.agent.backend  # a PathBackend counts its fallbacks and returns (run totals)
        stats["path_fallbacks"] = getattr(backend, "fallbacks", 0)
        stats["path_returns"] = getattr(backend, "returns", 0)
        dense = 4 * stats["elements"]
        stats["compression_ratio"] = dense / stats["bytes_sent"] if stats["bytes_sent"] else 0.0
        self._step.clear()
        self.steps += 1
        if self.log_every and self.steps % self.log_every == 0:
            print(f"lhc hook step {self.steps}: {stats['bytes_sent'] / 1e6:.3f} MB on the wire, "
                  f"compression {stats['compression_ratio']:.1f}x, modes {sorted(set(self.modes.values()))}, "
                  f"buckets via switch {stats['buckets_switch']:.0f} host {stats['buckets_host']:.0f}, "
                  f"fallbacks {stats['path_fallbacks']} returns {stats['path_returns']}", flush=True)
        return stats

    # --- checkpoints ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that decides the next steps' results: codec states, residuals, the agent's call
        count and agreed link estimate (mode ``auto`` reads them)."""
        return {
            "agent": self.agent.state_dict(),
            "residuals": {key: tensor.clone() for key, tensor in self.residuals.items()},
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.agent.load_state_dict(state["agent"])
        self.residuals = {key: tensor.clone() for key, tensor in state["residuals"].items()}
        self.steps = state["steps"]


def _sparsify(state: LhcHookState, key: Hashable, gradient: torch.Tensor) -> torch.Tensor:
    """Top-k with error feedback: keep the k largest of gradient + residual, carry the rest over."""
    corrected = gradient + state.residuals.get(key, torch.zeros_like(gradient))
    k = max(1, int(state.topk_ratio * corrected.numel()))
    keep = corrected.abs().topk(k, sorted=False).indices
    sparse = torch.zeros_like(corrected)
    sparse[keep] = corrected[keep]
    state.residuals[key] = corrected - sparse
    return sparse


def lhc_hook(state: LhcHookState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's exact sum over all workers, divided by the world size."""
    buffer = bucket.buffer()
    if buffer.dtype == torch.float64:
        raise TypeError(
            "lhc_hook: a float64 gradient bucket: lhc sums integers quantized at one scale (31 bits), which "
            "cannot carry float64's precision, and it will not narrow your gradients silently; train in "
            "float32 (or bf16/fp16), or leave this model on DDP's own allreduce"
        )
    key = (bucket.index(), buffer.numel(), buffer.dtype)  # DDP may rebuild buckets after step 1
    # Half-precision buckets are summed in float32: a sum of W halves may overflow where their mean does not.
    gradient = buffer if buffer.dtype == torch.float32 else buffer.float()
    if state.topk_ratio is not None:
        gradient = _sparsify(state, key, gradient)

    def finish(reduced: AllreduceResult) -> torch.Tensor:
        state.record(key, reduced.stats)
        return reduced.total.div_(state.world_size).to(buffer.dtype)

    # The training step raises an error where it waits for gradients.
    # in place: the sum overwrites the bucket (or its float32 copy), as DDP's own allreduce does
    return state.agent.allreduce_torch_future(gradient, finish, key=key, step_end=bucket.is_last(),
                                              in_place=True)
