"""The ``lhc`` torch.distributed backend: ``init_process_group("lhc")`` and every float ``all_reduce``
(SUM, AVG) and ``reduce_scatter`` goes through the lhc agent, every other collective through Gloo (CPU
tensors) or NCCL (CUDA tensors).

    import host_agent.torch_backend                  # registers "lhc" (automatic under LHC_DISTRIBUTED=1)
    dist.init_process_group("lhc")                   # the job from LHC_CONTROLLER, LHC_JOB, LHC_TOKEN

Why one backend for every device, not ``"cpu:gloo,cuda:lhc"``: torch 2.13 takes a backend written in
Python only as a whole ``ProcessGroup`` (``_new_process_group_helper``: a creator that returns a
ProcessGroup subclass replaces the group, and the C++ ``Backend`` a per-device entry needs has no Python
constructor), so this group keeps the Gloo and NCCL groups itself and hands them what it does not do.

What goes through lhc: ``all_reduce`` and ``reduce_scatter`` with SUM or AVG on one float32, float16 or
bfloat16 tensor (DDP's buckets, FSDP's gradients). Everything else (integers, which are counters and
flags here and would turn a wrapping sum into an error; MAX, MIN, products; broadcasts, gathers,
barriers, point to point) goes to Gloo or NCCL unchanged. The codec's collectives (the ``process_group``
codec, without ``LHC_CONTROLLER``) run on a second Gloo or NCCL group, so that the agent's thread never
interleaves its collectives with the caller's on one group.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import PrefixStore, ProcessGroupGloo, Store, _create_work_from_future

from host_agent.agent import Agent, AllreduceResult
from host_agent.agent_backend import Backend
from host_agent.path_join import (
    DEFAULT_JOIN_TIMEOUT_S,
    deadlines_from_env,
    join_or_fall_back,
    strict_from_env,
)
from host_agent.path_policy import PATH_CHOICES, make_policy
from host_agent.paths import DEFAULT_MEET_TIMEOUT_S, DEFAULT_REJOIN_EVERY_S

BACKEND = "lhc"
#: The floats lhc aggregates; other dtypes go to Gloo or NCCL.
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_ROUTED = (dist.ReduceOp.RedOpType.SUM, dist.ReduceOp.RedOpType.AVG)
_JOBS_IN_USE: set[str] = set()  # a job has one group per process: another lhc group uses the codec alone
#: Where a CUDA tensor's other collectives (and the process-group codec's) run: NCCL, or Gloo for ranks that
#: share a GPU (NCCL refuses two ranks on one device; Gloo stages CUDA tensors through the host).
CUDA_COLLECTIVES = ("nccl", "gloo")


@dataclass(frozen=True)
class LhcConfig:
    """Where a group aggregates: through the switch (``controller`` and ``job``) or, without a
    controller, with the same codec over a Gloo or NCCL group. Read from the environment so that a
    script's launch line alone chooses it."""

    controller: str | None = None
    job: str | None = None
    token: str | None = None
    mode: str = "auto"
    ip: str = "127.0.0.1"
    host: str = ""
    cuda_collectives: str = "nccl"
    strict: bool = False
    join_timeout_s: float = DEFAULT_JOIN_TIMEOUT_S
    switch_timeout_s: float = 30.0
    meet_timeout_s: float = DEFAULT_MEET_TIMEOUT_S
    rejoin_every_s: float = DEFAULT_REJOIN_EVERY_S
    path: str = "switch"

    def __post_init__(self) -> None:
        if self.cuda_collectives not in CUDA_COLLECTIVES:
            raise ValueError(f"LHC_CUDA_COLLECTIVES must be one of {CUDA_COLLECTIVES}, not "
                             f"{self.cuda_collectives!r}")
        if self.path not in PATH_CHOICES:
            raise ValueError(f"LHC_PATH must be one of {PATH_CHOICES}, not {self.path!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> LhcConfig:
        """``LHC_CONTROLLER`` (HOST:PORT), ``LHC_JOB``, ``LHC_TOKEN``, ``LHC_MODE`` (default auto),
        ``LHC_IP`` (this worker's data-plane address) or ``LHC_HOST`` (its name in the topology),
        ``LHC_CUDA_COLLECTIVES`` (:data:`CUDA_COLLECTIVES`, default nccl); the fallback's (docs/pytorch.md,
        "When the switch cannot serve"): ``LHC_STRICT``, ``LHC_JOIN_TIMEOUT_S``, ``LHC_SWITCH_TIMEOUT_S`` (a
        stalled packet's deadline), ``LHC_MEET_TIMEOUT_S``, ``LHC_REJOIN_EVERY_S``; ``LHC_PATH``
        (:data:`PATH_CHOICES`, default switch: ``fastest`` sends each bucket over the path measured faster
        for it)."""
        seconds = deadlines_from_env(environ)
        if "timeout_s" in seconds:
            seconds["switch_timeout_s"] = seconds.pop("timeout_s")
        config = cls(environ.get("LHC_CONTROLLER") or None, environ.get("LHC_JOB") or None,
                     environ.get("LHC_TOKEN") or None, environ.get("LHC_MODE", "auto"),
                     environ.get("LHC_IP", "127.0.0.1"), environ.get("LHC_HOST", ""),
                     environ.get("LHC_CUDA_COLLECTIVES", "nccl"), strict_from_env(environ), **seconds,
                     path=environ.get("LHC_PATH", "switch"))
        if config.controller and not config.job:
            raise ValueError("LHC_CONTROLLER is set but LHC_JOB is not: name the controller's job")
        return config


def _gloo_and_nccl(store: Store, rank: int, size: int, timeout: timedelta, prefix: str,
                   cuda_collectives: str) -> dist.ProcessGroup:
    """A process group of Gloo (CPU) and, where CUDA is, NCCL (CUDA), registered nowhere: what
    ``init_process_group("cpu:gloo,cuda:nccl")`` builds, under ``prefix`` in the store; with
    ``cuda_collectives`` "gloo", Gloo for both (``init_process_group("gloo")``)."""
    group = dist.ProcessGroup(store, rank, size)
    types = dist.ProcessGroup.BackendType
    gloo = ProcessGroupGloo(PrefixStore(f"{prefix}/cpu/", store), rank, size, timeout)
    group._register_backend(torch.device("cpu"), types.GLOO, gloo)
    group._set_default_backend(types.GLOO)
    if cuda_collectives == "gloo":
        group._register_backend(torch.device("cuda"), types.GLOO, gloo)
    elif torch.cuda.is_available() and dist.is_nccl_available():
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        nccl = dist.ProcessGroupNCCL(PrefixStore(f"{prefix}/cuda/", store), rank, size, options)
        group._register_backend(torch.device("cuda"), types.NCCL, nccl)
        group._set_default_backend(types.NCCL)
    return group


class LhcProcessGroup(dist.ProcessGroup):
    """The ``lhc`` backend's group (see the module docstring)."""

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta, config: LhcConfig) -> None:
        super().__init__(rank, size)
        self._rank, self._size = rank, size
        self._group_name = ""
        #: calls lhc aggregated, by collective (what a test or a log checks went through lhc)
        self.aggregated: Counter[str] = Counter()
        self.inner = _gloo_and_nccl(store, rank, size, timeout, "inner", config.cuda_collectives)
        self.config = config
        self.job: str | None = None
        if config.controller and config.job not in _JOBS_IN_USE:
            switch_options = {"token": config.token, "ip": config.ip, "host": config.host,
                              "timeout_s": config.switch_timeout_s}
            if config.strict:
                self.agent = Agent.join(config.controller, config.job, mode=config.mode, world_size=size,
                                        install_timeout_s=config.join_timeout_s, **switch_options)
            else:
                paths = join_or_fall_back(config.controller, config.job, self._codec(store, timeout, config),
                                          join_timeout_s=config.join_timeout_s,
                                          meet_timeout_s=config.meet_timeout_s,
                                          rejoin_every_s=config.rejoin_every_s,
                                          policy=make_policy(config.path, size), **switch_options)
                self.agent = Agent(paths, mode=config.mode, timeout_s=2 * config.switch_timeout_s)
            self.job = config.job
            _JOBS_IN_USE.add(self.job)
        else:
            self.agent = Agent(self._codec(store, timeout, config), mode=config.mode)

    def _codec(self, store: Store, timeout: timedelta, config: LhcConfig) -> Backend:
        """The process-group codec on a Gloo or NCCL group of its own (NCCL's where CUDA is and NCCL was not
        declined; else Gloo's, on the CPU)."""
        from host_agent.process_group import ProcessGroupBackend

        codec = _gloo_and_nccl(store, self._rank, self._size, timeout, "codec", config.cuda_collectives)
        cuda = torch.cuda.is_available() and config.cuda_collectives == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        return ProcessGroupBackend(codec, device=device)

    def getBackendName(self) -> str:
        return BACKEND

    # A ProcessGroup keeps its name in its backends, and this one has none: DeviceMesh (FSDP) reads it.
    def _set_group_name(self, name: str) -> None:
        self._group_name = name

    @property
    def group_name(self) -> str:
        return self._group_name

    def shutdown(self) -> None:
        """Leave the job (``destroy_process_group`` calls this)."""
        self.agent.close()
        _JOBS_IN_USE.discard(self.job or "")

    # --- what lhc aggregates ---------------------------------------------------------------------------
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist.Work:
        opts = opts if opts is not None else dist.AllreduceOptions()
        if len(tensors) != 1 or not _routed(tensors, opts.reduceOp):
            return self.inner.allreduce(tensors, opts)
        tensor = tensors[0]
        self.aggregated["all_reduce"] += 1
        return self._aggregate(tensor, opts.reduceOp, lambda total: tensor.copy_(total.view_as(tensor)),
                               [tensor])

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor,  # torch's names
                              opts: Any = None) -> dist.Work:
        """The sum (or mean) of every rank's ``input``, this rank's slice of it into ``output``. Every rank
        sends its whole input, but decodes only its slice (the agent's ``output_range``: all of the
        sketch is still peeled in sketch mode); the slice is that of ``all_reduce``'s total, bit for bit."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if not _routed([input, output], opts.reduceOp):
            return self.inner.reduce_scatter_single(output, input, opts)
        n = output.numel()
        if input.numel() != n * self._size:
            raise ValueError(f"reduce_scatter: input of {input.numel()} elements for {self._size} x {n}")
        self.aggregated["reduce_scatter"] += 1
        shard = (self._rank * n, (self._rank + 1) * n)
        return self._aggregate(input, opts.reduceOp, lambda total: output.copy_(total.view_as(output)),
                               output, shard)

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any = None) -> dist.Work:
        """One output per call (as ``dist.reduce_scatter`` makes it): the inputs laid end to end."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if len(outputs) != 1 or not _routed([outputs[0], *inputs[0]], opts.reduceOp) or len(
                {t.numel() for t in [outputs[0], *inputs[0]]}) != 1:
            return self.inner.reduce_scatter(outputs, inputs, opts)
        return self.reduce_scatter_single(outputs[0], torch.cat([t.reshape(-1) for t in inputs[0]]), opts)

    def _aggregate(self, tensor: torch.Tensor, op: dist.ReduceOp, store: Callable[[torch.Tensor], Any],
                   result: Any, output_range: tuple[int, int] | None = None) -> dist.Work:
        """Sum ``tensor`` over the group on the agent's thread (halves in float32, so that a sum of W halves
        does not overflow where their mean does not), divide for AVG, ``store`` it (only ``output_range``
        of the flat sum, if given); the Work completes then. A NaN or inf on any rank comes back as an
        all-NaN tensor on every rank (the codec's rule)."""
        flat = tensor.reshape(-1)
        average = op.op == dist.ReduceOp.RedOpType.AVG

        def finish(reduced: AllreduceResult) -> Any:
            total = reduced.total.div_(self._size) if average else reduced.total
            store(total.to(tensor.dtype))
            return result

        key = ("lhc-backend", flat.numel(), tensor.dtype)
        summed = flat if flat.dtype == torch.float32 else flat.float()
        done = self.agent.allreduce_torch_future(summed, finish, key=key, output_range=output_range)
        return _create_work_from_future(done)  # the caller's wait() raises an error


def _routed(tensors: list[torch.Tensor], op: dist.ReduceOp) -> bool:
    """Whether lhc aggregates this call: SUM or AVG of non-empty floats of one dtype on one device."""
    first = tensors[0]
    return (op.op in _ROUTED and first.numel() > 0 and first.dtype in FLOATS
            and all(t.dtype == first.dtype and t.device == first.device for t in tensors))


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: LhcProcessGroup, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)

    method.__name__ = name
    method.__doc__ = f"``{name}`` of the Gloo (CPU) or NCCL (CUDA) group: lhc does not take part."
    return method


# _allgather_base: an older torch's name for all_gather_single (as _reduce_scatter_base is above)
for _name in ("allreduce_coalesced", "allgather", "allgather_coalesced", "all_gather_single",
              "_allgather_base", "all_gather_single_coalesced", "alltoall", "all_to_all_single", "barrier",
              "broadcast", "gather", "scatter", "reduce", "reduce_scatter_single_coalesced", "send", "recv",
              "recv_anysource", "_start_coalescing", "_end_coalescing"):
    setattr(LhcProcessGroup, _name, _delegate(_name))


def _create(store: Store, rank: int, size: int, timeout: timedelta) -> LhcProcessGroup:
    return LhcProcessGroup(store, rank, size, timeout, LhcConfig.from_env())


def register() -> None:
    """Make ``"lhc"`` a torch.distributed backend name (once per process)."""
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu", "cuda"])


register()
