"""The codec's GPU kernels (Triton), behind this one face: the algorithm (``host_agent/codec/*.py``) calls
what is here and never a module beside it.

- Which path a session takes is decided once, when it is made (:func:`choose_path`), and holds for all
  its rounds (:func:`on_path`): ``"triton"`` for a CUDA tensor where Triton imports, ``"torch"`` (the
  torch reference, ``peeling.peel_parallel`` and friends) for a CUDA tensor without Triton or with
  ``LHC_CODEC_GPU=torch``, and the CPU's own choice (compiled kernels, else torch) for a CPU tensor. A
  session may ask for the Triton path on a CPU tensor (``kernels="triton"``): that runs the same kernels
  in Triton's interpreter (``TRITON_INTERPRET=1`` set before Triton is imported; :mod:`.device`).
- The copies between the kernels (:func:`read_back`, :func:`send`, :func:`send_into`, :func:`to_device`,
  :func:`to_host`) and the count of what the path enqueues (:class:`LaunchCounter`, :func:`counting`).
- The kernels (:data:`KERNELS`), each the twin of the reference step its docstring names, imported with
  Triton on first use, so that an install without the extra ``gpu`` never imports Triton.

Beside it: ``encoding.py`` (scan, index, sketch, values, the lead), ``decoding.py`` (candidates, output,
group counts), ``peeling.py`` (the peel, no barriers), ``device_functions.py`` (the Triton functions they
share), ``device.py`` (launches, copies, tile sizes), ``launches.py`` (counting) and ``transfer.py``
(pinned copies). They read the algorithm's agreed shapes and word positions (``sketch_spec``,
``agreement``, ``quantize``) and never the session or the protocol (tests/test_layout.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

from .device import interpreting, on_host, read_back, send, send_into, set_sizes, triton_available
from .launches import LaunchCounter, active_counter, counting
from .transfer import to_device, to_host

GPU_VARIABLE = "LHC_CODEC_GPU"
_choice = os.environ.get(GPU_VARIABLE, "triton")
if _choice not in ("triton", "torch"):
    raise ValueError(f"{GPU_VARIABLE} must be 'triton' or 'torch', not {_choice!r}")
KERNEL_CHOICES = ("auto", "triton")

#: The kernels the algorithm calls, by the module beside this one that holds each.
KERNELS = {
    "scan_nonzero": "encoding", "encode_bucket": "encoding", "encode_lead": "encoding",
    "encode_index": "encoding", "encode_sketch": "encoding", "gather_quantize": "encoding",
    "bloom_hits": "encoding", "set_bit_items": "decoding", "fill_output": "decoding",
    "group_counts": "decoding", "read_counts": "decoding", "peel": "peeling",
}


def __getattr__(name: str) -> Callable:
    """A kernel of :data:`KERNELS`, its module imported (with Triton) on first use."""
    if name not in KERNELS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from . import decoding, encoding, peeling

    modules = {"encoding": encoding, "decoding": decoding, "peeling": peeling}
    return getattr(modules[KERNELS[name]], name)


def choose_path(device: torch.device, kernels: str) -> str:
    """``"triton"``, or ``""`` for the device's other path (see the module docstring); a request the
    machine cannot honour is a ValueError naming what is missing."""
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, not {kernels!r}")
    if kernels == "triton":
        if not triton_available():
            raise ValueError("kernels='triton' needs Triton (pip install triton, or the extra 'gpu')")
        if device.type == "cpu" and not interpreting():
            raise ValueError("kernels='triton' on a CPU tensor needs TRITON_INTERPRET=1 set before Triton "
                             "is imported (the interpreter runs the GPU kernels on the CPU)")
        return "triton"
    if device.type == "cuda" and _choice == "triton" and triton_available():
        return "triton"
    return ""


_path: ContextVar[str] = ContextVar("lhc_codec_path", default="")


def on_path() -> bool:
    """Whether the running session takes the Triton path."""
    return _path.get() == "triton"


@contextmanager
def path(name: str) -> Iterator[None]:
    token = _path.set(name)
    try:
        yield
    finally:
        _path.reset(token)


__all__ = [
    "GPU_VARIABLE",
    "KERNELS",
    "KERNEL_CHOICES",
    "LaunchCounter",
    "active_counter",
    "choose_path",
    "counting",
    "interpreting",
    "on_host",
    "on_path",
    "path",
    "read_back",
    "send",
    "send_into",
    "set_sizes",
    "to_device",
    "to_host",
    "triton_available",
]
