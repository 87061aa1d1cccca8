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
