"""The compiled CPU kernels (``_native.c``), or None where the package was installed without a C compiler.

Callers use them for CPU tensors when present and fall back to their torch code otherwise; both give the
same results (tested), the kernels only faster.
"""

from __future__ import annotations

from types import ModuleType

native: ModuleType | None
try:
    from . import _native as native
except ImportError:  # built without a C compiler
    native = None


def native_available() -> bool:
    """Whether setup.py built the kernels."""
    return native is not None


def require_native() -> ModuleType:
    """The kernels, for callers that asked for them by name; a RuntimeError that says how to build them."""
    if native is None:
        raise RuntimeError(
            "the codec's compiled kernels are not built: reinstall (pip install -e .) where a C compiler"
            " and the Python headers are present"
        )
    return native
