"""The codec's compiled CPU kernels (``_kernels.c`` and its ``kernels_*.c`` beside this file) behind this
one face, their loader: :data:`native` is the extension, or None where the package was installed without a
C compiler. The algorithm (``host_agent/codec/*.py``) asks here and nowhere else.

Callers use the kernels for CPU tensors when present and fall back to their torch code otherwise; both
give the same results (tested), the kernels only faster. Each C function names its torch twin.

The peeling and the nonzero scan split a large bucket between two threads (their results never depend on
it). ``LHC_CODEC_THREADS`` sets how many they may use (1 turns threading off); by default as many as this
process may run on, at most two.

``LHC_CODEC_KERNELS=torch`` runs the torch code even where the kernels are built: what an install without
a compiler runs, to compare the two (``lhc-bench codec --kernels native,torch``).

The kernels' hashes and Bloom query run eight lanes at a time with AVX2 where the CPU has it, scalar loops
otherwise (the same bits). ``LHC_CODEC_SIMD=scalar`` runs the scalar loops on any CPU; :func:`kernel_simd`
says which run.
"""

from __future__ import annotations

import os
from types import ModuleType

KERNELS_VARIABLE = "LHC_CODEC_KERNELS"
_choice = os.environ.get(KERNELS_VARIABLE, "native")
if _choice not in ("native", "torch"):
    raise ValueError(f"{KERNELS_VARIABLE} must be 'native' or 'torch', not {_choice!r}")

SIMD_VARIABLE = "LHC_CODEC_SIMD"
_simd = os.environ.get(SIMD_VARIABLE, "auto")
if _simd not in ("auto", "scalar"):
    raise ValueError(f"{SIMD_VARIABLE} must be 'auto' or 'scalar', not {_simd!r}")

native: ModuleType | None = None
if _choice == "native":
    try:
        from . import _kernels as native
    except ImportError:  # built without a C compiler
        native = None
if native is not None:
    native.simd(_simd == "auto")


def native_available() -> bool:
    """Whether setup.py built the kernels."""
    return native is not None


def kernel_simd() -> str | None:
    """Which loops the kernels' hashes and Bloom query run, ``"avx2"`` or ``"scalar"``; None without the
    kernels (the torch code runs)."""
    return None if native is None else native.simd()


def kernels_in_use(device_type: str = "cpu") -> str:
    """What runs the codec's loops for tensors on ``device_type``: ``"native/avx2"``, ``"native/scalar"``
    (the compiled kernels, and their loops), or ``"torch"`` (no kernels built, ``LHC_CODEC_KERNELS=torch``,
    or a GPU tensor)."""
    if native is None or device_type != "cpu":
        return "torch"
    return f"native/{native.simd()}"


def require_native() -> ModuleType:
    """The kernels, for callers that asked for them by name; a RuntimeError that says how to build them."""
    if native is None:
        raise RuntimeError(
            "the codec's compiled kernels are not built: reinstall (pip install -e .) where a C compiler"
            " and the Python headers are present"
        )
    return native


MAX_KERNEL_THREADS = 2  # the kernels split work in two halves


def kernel_threads() -> int:
    """Threads the kernels may use: ``LHC_CODEC_THREADS`` if set, else the CPUs this process may use."""
    text = os.environ.get("LHC_CODEC_THREADS")
    if text is not None:
        try:
            return max(1, min(MAX_KERNEL_THREADS, int(text)))
        except ValueError:
            raise ValueError(f"LHC_CODEC_THREADS must be an integer, not {text!r}") from None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_KERNEL_THREADS, cpus))
