"""A session's encode and decode time, measured only when asked for (benchmarks, the agent's stats)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import torch

from . import gpu


class PhaseClock:
    """Encode and decode time, when asked for (on CUDA it waits for the current stream around each phase).

    A timed block may also name its stage (``clock("decode", "peel")``): ``stages`` then holds the
    seconds of each ``"phase.stage"``, the profile ``lhc-bench codec`` prints beside the totals. Device
    operations counted in a block (``gpu.counting``) count for its phase, timed or not."""

    def __init__(self, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.sync = enabled and device.type == "cuda"
        self.device = device
        self.seconds = {"encode": 0.0, "decode": 0.0}
        self.stages: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str, stage: str | None = None) -> Iterator[None]:
        counter = gpu.active_counter()
        with counter.in_phase(phase) if counter is not None else nullcontext():
            if not self.enabled:
                yield
                return
            yield from self._timed(phase, stage)

    def _timed(self, phase: str, stage: str | None) -> Iterator[None]:
        if self.sync:
            torch.cuda.current_stream(self.device).synchronize()
        start = time.perf_counter()
        yield
        if self.sync:
            torch.cuda.current_stream(self.device).synchronize()
        elapsed = time.perf_counter() - start
        self.seconds[phase] += elapsed
        if stage is not None:
            key = f"{phase}.{stage}"
            self.stages[key] = self.stages.get(key, 0.0) + elapsed
