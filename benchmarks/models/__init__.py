"""The paper's four model families, defined here with random initial weights and synthetic data made
locally from a seed (nothing is downloaded): ``lhc-bench train`` and the emulation train them every way.

Each module offers ``build(size, seed) -> Workload`` for ``size`` ``tiny`` (a few thousand parameters, for
tests) or ``full`` (the paper's configuration, for benchmarks); BERT also ``small`` (BERT-mini's layers).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from benchmarks.models import bert, lstm, ncf, vgg
from benchmarks.models.workload import SIZES, Workload

#: name -> build(size, seed)
MODELS: dict[str, Callable[[str, int], Workload]] = {
    "ncf": ncf.build,
    "lstm": lstm.build,
    "vgg19": vgg.build,
    "bert": bert.build,
}


def check(name: str, size: str) -> None:
    """Raise a ValueError naming the problem unless model ``name`` exists at ``size``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    configs = sys.modules[MODELS[name].__module__].CONFIGS
    if size not in configs:
        raise ValueError(f"{name} has no size {size!r}; it has {', '.join(configs)} (of {', '.join(SIZES)})")


def build(name: str, size: str, seed: int = 0) -> Workload:
    """Model ``name`` at ``size``, its weights and data a function of ``seed`` alone."""
    check(name, size)
    return MODELS[name](size, seed)
