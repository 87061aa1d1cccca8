"""The device as the GPU kernels meet it: whether Triton is there and runs interpreted, every launch and
copy between host and device counted (:mod:`.launches`), the tile sizes.

Every kernel launch goes through :func:`launch`, which notes it for :mod:`.launches`; every copy through
:func:`read_back`, :func:`send` or :func:`send_into` (pinned buffers, :mod:`.transfer`). Under Triton's
interpreter (``TRITON_INTERPRET=1`` set before Triton is imported) the same kernels run on CPU tensors,
which is how the tests hold them to the CPU kernels bit for bit and how a CPU machine counts the launches
a GPU would make.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch

from . import launches
from .transfer import to_device, to_device_into, to_host


def interpreting() -> bool:
    """Whether Triton runs its interpreter (kernels on CPU tensors, for tests and counting)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_module() -> ModuleType | None:
    """Triton, or None where it does not import (it is the optional extra ``gpu``)."""
    try:
        import triton
    except ImportError:
        return None
    return triton


def interpreter_scalars() -> None:
    """Triton's interpreter (3.6) holds a scalar as a one-element array and takes ``int()`` of it, which
    NumPy 2.4 refuses ("only 0-dimensional arrays can be converted"), so a loop bound that is a kernel
    argument fails there. Its conversion is redone for the interpreter only; compiled kernels never run
    this code."""
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "lhc_scalars", False):
        return

    def patch(tensor, scope) -> None:
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch.lhc_scalars = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch


def triton_available() -> bool:
    return triton_module() is not None


def launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    """Launch a Triton kernel on the current stream, counted as one device launch."""
    launches.note(1)
    with launches.paused():
        kernel[grid](*args, **meta)


def read_back(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` copied to the host through a pinned buffer, waiting for that copy alone: one device
    operation (counted so wherever it runs; on a CPU tensor, which the interpreter uses, the copy is free
    and torch would not show it). A pageable copy would be staged by the driver."""
    launches.note(1)
    launches.note_wait()
    with launches.paused():
        return to_host(tensor)


def send(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor copied to ``device`` from a pinned buffer, without waiting: one device operation,
    counted so wherever it runs. (``tensor.to(device)`` from pageable memory would wait for the stream,
    every kernel queued before it, to copy synchronously.)"""
    launches.note(1)
    with launches.paused():
        return to_device(tensor, device)


def send_into(target: torch.Tensor, tensor: torch.Tensor) -> None:
    """:func:`send` into ``target``, a view of a larger buffer on the device: one device operation."""
    launches.note(1)
    with launches.paused():
        to_device_into(target, tensor)


@contextmanager
def on_host() -> Iterator[None]:
    """Torch operations here run on host tensors (under the interpreter they look like the device's)."""
    with launches.paused():
        yield


def sizes() -> dict[str, int]:
    """Tile sizes: GPU-sized, or large under the interpreter (each of its steps is a numpy call, so
    fewer, larger tiles run far faster there; the results do not depend on them)."""
    return dict(_INTERPRETED if interpreting() else _COMPILED)


_COMPILED = {"scan": 2048, "items": 1024, "words": 128, "peel": 512, "fill": 1024, "warps": 8,
             "programs": 0}
_INTERPRETED = {"scan": 1 << 16, "items": 1 << 15, "words": 1 << 11, "peel": 1 << 14, "fill": 1 << 15,
                "warps": 4, "programs": 0}


def set_sizes(**overrides: int) -> dict[str, int]:
    """Override tile sizes (tests use small tiles to run many programs); returns the previous ones."""
    table = _INTERPRETED if interpreting() else _COMPILED
    previous = dict(table)
    unknown = set(overrides) - set(table)
    if unknown:
        raise ValueError(f"unknown tile sizes {sorted(unknown)}")
    table.update(overrides)
    return previous


def next_pow2(value: int) -> int:
    return 1 << max(0, value - 1).bit_length()


def work_programs(device: torch.device) -> int:
    """Programs of a kernel that serves a shared work queue (the peel): ``sizes()["programs"]`` if set,
    else one per SM (one under the interpreter, which runs programs one after another; tests set more)."""
    if sizes()["programs"]:
        return sizes()["programs"]
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
