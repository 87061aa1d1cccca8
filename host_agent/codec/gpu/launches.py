"""Counting what the GPU path enqueues on the device, per session and phase, on any machine.

Why count rather than time: a GPU is not always at hand, and where the torch reference took thousands of
small launches per bucket (each a host round trip of a few microseconds), the GPU path is meant to take a
bounded number whatever the data. The count is made where the path runs, GPU or not: each Triton launch
is noted by :func:`note` (``gpu.launch``), and every torch operation on the session's device is seen by a
dispatch mode, which counts it as the kernels it launches there (a view or an allocation: none; a copy
between host and device, or reading a value back: one; an operation known to launch several kernels on
CUDA, such as ``nonzero``: that many). So torch operations between Triton kernels count too, and a
change that adds one shows up in the count. On a CUDA device the benchmark checks the count against the
profiler's list of what really ran (``lhc-bench codec --device cuda``).

Counting costs a few microseconds of host time per torch operation, so a session counts only when asked
(``count_launches=True``); its stats then hold ``gpu_launches`` = {"encode", "decode", "transfer"}, and
beside them the host waits among those operations (read-backs: the host stops until the device reaches
them), ``encode_waits``, ``decode_waits`` and ``transfer_waits``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

PHASES = ("encode", "decode", "transfer")
#: Operations that launch no kernel: allocations, metadata and views (views are found by their schema).
_FREE = frozenset({
    "empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "detach", "alias",
    "lift_fresh", "lift_fresh_copy", "set_", "resize_", "is_pinned", "_pin_memory", "record_stream",
    "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "size", "stride",
})
#: Operations that launch more than one kernel on CUDA (CUB's select, scan and sort run in passes); the
#: GPU path keeps them off its default case, and counts them at this weight where they run.
_WEIGHTS = {
    "nonzero": 3, "masked_select": 4, "cumsum": 2, "sort": 4, "argsort": 4, "unique_consecutive": 5,
    "_unique2": 6, "unique_dim": 6, "index_put_": 3, "index_put": 3, "repeat_interleave": 3,
    "count_nonzero": 2, "searchsorted": 1, "aminmax": 1,
}


class LaunchCounter:
    """Device operations of one session, by phase (:data:`PHASES`)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = resolve_device(device)
        self.counts = dict.fromkeys((*PHASES, *(f"{phase}_waits" for phase in PHASES)), 0)
        self.phase = "encode"
        self.paused = 0  # > 0 inside a Triton launch (the interpreter runs torch operations of its own)

    def add(self, launches: int = 1) -> None:
        if not self.paused:
            self.counts[self.phase] += launches

    def wait(self) -> None:
        """The host waits for the device (a read-back), in the current phase."""
        if not self.paused:
            self.counts[f"{self.phase}_waits"] += 1

    @contextmanager
    def in_phase(self, phase: str) -> Iterator[None]:
        previous, self.phase = self.phase, phase
        try:
            yield
        finally:
            self.phase = previous


def resolve_device(device: torch.device | str) -> torch.device:
    """``device`` as a tensor on it reports it: a tensor's CUDA device always names its index, and
    ``torch.device("cuda") != torch.device("cuda", 0)``, so a counter for plain ``cuda`` would match no
    tensor and count only the Triton launches and copies noted by hand; plain ``cuda`` is the current one."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


_active: ContextVar[LaunchCounter | None] = ContextVar("lhc_launch_counter", default=None)


def active_counter() -> LaunchCounter | None:
    return _active.get()


def note(launches: int = 1) -> None:
    """A Triton kernel (or several) was launched on the device."""
    counter = _active.get()
    if counter is not None:
        counter.add(launches)


def note_wait() -> None:
    """The host waited for the device (a read-back)."""
    counter = _active.get()
    if counter is not None:
        counter.wait()


@contextmanager
def paused() -> Iterator[None]:
    """Torch operations inside this block are not the path's own (the Triton interpreter's copies)."""
    counter = _active.get()
    if counter is None:
        yield
        return
    counter.paused += 1
    try:
        yield
    finally:
        counter.paused -= 1


def op_launches(func: torch._ops.OpOverload) -> int:
    """Kernels one torch operation launches on a CUDA device (see the module docstring)."""
    name = func.overloadpacket.__name__
    if getattr(func, "is_view", False) or name in _FREE:
        return 0
    return _WEIGHTS.get(name, 1)


class _CountTorchOps(TorchDispatchMode):
    """Counts every torch operation that touches a tensor on the counter's device."""

    def __init__(self, counter: LaunchCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.counter.paused:
            launches = op_launches(func)
            if launches and self._touches_device(args, kwargs, out):
                self.counter.add(launches)
        return out

    def _touches_device(self, args, kwargs, out) -> bool:
        leaves, _ = tree_flatten((args, kwargs, out))
        device = self.counter.device
        return any(isinstance(leaf, torch.Tensor) and leaf.device == device for leaf in leaves)


@contextmanager
def counting(counter: LaunchCounter | None, phase: str) -> Iterator[None]:
    """Count the device operations of this block into ``counter`` (nothing when None), in ``phase``
    unless a :class:`~host_agent.codec.phase_clock.PhaseClock` phase says otherwise."""
    if counter is None:
        yield
        return
    token = _active.set(counter)
    try:
        with counter.in_phase(phase), _CountTorchOps(counter):
            yield
    finally:
        _active.reset(token)
