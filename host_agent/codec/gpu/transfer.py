"""Moving a message's words between a GPU and the host: through pinned buffers, waiting on nothing but
the stream that made them.

Only the packets' words cross (a bucket stays on its device): a message leaves through a pinned buffer
(one DMA; the host waits for that copy alone, by an event on the current stream, not for the device)
and a result comes back through one (the copy to the device is then asynchronous, ordered on the
current stream before the kernels that read it). A copy from or to pageable memory would be staged by
the driver and hold the host until it is done. PyTorch's pinned allocator caches the buffers and keeps
each one until the copies that use it have completed.
"""

from __future__ import annotations

import torch


def to_host(words: torch.Tensor) -> torch.Tensor:
    """``words`` in host memory (pinned, if they were on a GPU), complete when this returns."""
    if words.device.type != "cuda":
        return words
    host = torch.empty(words.shape, dtype=words.dtype, pin_memory=True)
    host.copy_(words, non_blocking=True)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(words.device))
    done.synchronize()
    return host


def to_device(words: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``words`` on ``device``: from the host through a pinned buffer, without waiting, on the current
    stream."""
    if device.type != "cuda" or words.device == device:
        return words.to(device)
    if words.device.type == "cpu" and not words.is_pinned():
        words = words.pin_memory()
    return words.to(device, non_blocking=True)


def to_device_into(target: torch.Tensor, words: torch.Tensor) -> None:
    """Host ``words`` copied into ``target`` (a view on its device), through a pinned buffer, without
    waiting, on the current stream."""
    if target.device.type == "cuda" and not words.is_pinned():
        words = words.pin_memory()
    target.copy_(words, non_blocking=target.device.type == "cuda")
