"""Stream order for a bucket on a GPU: the agent's codec runs on a stream of its own, after the work the
caller had queued when it made the call, and the caller's stream waits for the codec's work before what
it queues once the call completes. Nothing waits for the whole device.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch


@dataclass
class DeviceOrder:
    """Where a CUDA call's codec runs, and how the caller's stream and the codec's are ordered."""

    caller: torch.cuda.Stream
    ready: torch.cuda.Event  # recorded on the caller's stream when the call was made
    codec: torch.cuda.Stream
    started: bool = field(default=False)

    @classmethod
    def of(cls, tensor: torch.Tensor, streams: dict[torch.device, torch.cuda.Stream]) -> DeviceOrder | None:
        if tensor.device.type != "cuda":
            return None
        caller = torch.cuda.current_stream(tensor.device)
        ready = torch.cuda.Event()
        ready.record(caller)
        codec = streams.setdefault(tensor.device, torch.cuda.Stream(tensor.device))
        return cls(caller, ready, codec)

    @contextmanager
    def running(self) -> Iterator[None]:
        """The codec's work, on its stream, after what the caller had queued."""
        with torch.cuda.stream(self.codec):
            if not self.started:
                self.codec.wait_event(self.ready)
                self.started = True
            yield

    def hand_back(self, total: torch.Tensor) -> None:
        """The caller's stream waits for the codec's work; ``total`` is in use there now."""
        done = torch.cuda.Event()
        done.record(self.codec)
        self.caller.wait_event(done)
        total.record_stream(self.caller)


def caller_stream(tensor: torch.Tensor) -> torch.cuda.Stream | None:
    """The stream the caller queues its work on, for a CUDA tensor (None on the CPU)."""
    return torch.cuda.current_stream(tensor.device) if tensor.device.type == "cuda" else None


def on_stream(stream: torch.cuda.Stream | None):
    """Queue the work of this block on ``stream`` (the caller's, which waits for the codec's work once a
    call completes); on the CPU, nothing."""
    return nullcontext() if stream is None else torch.cuda.stream(stream)


def running(order: DeviceOrder | None):
    """The context a call's codec work runs in: its device order's, or none on the CPU."""
    return nullcontext() if order is None else order.running()
