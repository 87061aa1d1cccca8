"""Adopting lhc by the launch line alone, as SHARP is switched on for NCCL:

    LHC_DISTRIBUTED=1 LHC_CONTROLLER=10.0.0.1:9560 LHC_JOB=train torchrun --nproc-per-node 8 train.py

torch calls :func:`load` at ``import torch`` (the ``torch.backends`` entry point of this package: torch's
own mechanism for out-of-tree backends, off with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0``). Without
``LHC_DISTRIBUTED=1`` it returns at once and imports nothing, so every other torch program is unaffected.
With it, ``init_process_group`` given Gloo, NCCL, both or no backend at all builds the ``lhc`` backend
instead (``host_agent.torch_backend``), which keeps Gloo and NCCL for everything lhc does not aggregate:
an unchanged DDP or FSDP script then sends its gradients through lhc.
"""

from __future__ import annotations

import functools
import os
from typing import Any

ENABLE = "LHC_DISTRIBUTED"
#: Backends the lhc backend stands in for (it delegates to them): torch's defaults for CPU and CUDA.
REPLACED = frozenset({"gloo", "nccl", "cpu:gloo,cuda:nccl", "cuda:nccl,cpu:gloo", "undefined"})


def enabled(environ: os._Environ[str] | dict[str, str] = os.environ) -> bool:
    return environ.get(ENABLE, "0") not in ("", "0")


def load() -> None:
    """The entry point: under ``LHC_DISTRIBUTED=1``, make ``init_process_group`` pick lhc."""
    if not enabled():
        return
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "lhc_original", None) is not None:
        return

    @functools.wraps(original)
    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        if backend is None or str(backend).lower() in REPLACED:
            from host_agent import torch_backend  # imported here: torch is not fully imported at load()

            backend = torch_backend.BACKEND
        return original(backend, *args, **kwargs)

    init_process_group.lhc_original = original  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group
    dist.distributed_c10d.init_process_group = init_process_group
