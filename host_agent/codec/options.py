"""A session's options, checked when the session is made (not at its first round), and their digest."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .gpu import KERNEL_CHOICES
from .sketch import DEFAULT_MARGIN, LAYOUTS
from .sketch_spec import TABLES

MODES = ("sketch", "union", "dense")
INDEX_KINDS = ("auto", "bitmap", "bloom")
DEFAULT_HEADROOM = 1
MAX_HEADROOM = 64


def is_int(value: object) -> bool:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Options:
    """How a bucket is aggregated. Every worker must hold the same options (the agreement message checks
    it), except ``timing``, ``check_support``, ``kernels`` and ``count_launches``, which are local.

    ``mode``: sketch, union or dense. ``block``: elements per item. ``expected_items``: the union's size if
    known (else the state's, else a counting round). ``margin``: sketch cells beyond the peeling threshold.
    ``headroom``: binades added to the previous round's exponent when the scale is assumed. ``seed``: the
    bucket's hash seed. ``index``: auto, bitmap or bloom. ``cells``: force the sketch's size.
    ``layout``: the sketch's layout, ``fused`` (fewest bytes; peels as a wave, ~730 parallel rounds at the
    default case), ``plain`` (about 10% more bytes, ~30 rounds: what a GPU peels fast), or ``auto``
    (plain for a CUDA tensor, else fused; the session resolves it before the agreement, so a job whose
    workers resolve it differently fails there).
    ``kernels``: ``auto``, or ``triton`` to run the GPU path on any device (a CPU tensor needs Triton's
    interpreter). ``count_launches``: count the device operations of the GPU path (``stats["gpu_launches"]``).
    ``timing``: measure encode/decode time (synchronizes a CUDA device at every phase, so off by default).
    ``check_support``: verify with one pass over the input that a given support holds every nonzero.
    """

    mode: str = "sketch"
    block: int = 1
    expected_items: int | None = None
    margin: float = DEFAULT_MARGIN
    headroom: int = DEFAULT_HEADROOM
    seed: int = 0
    index: str = "auto"
    cells: int | None = None
    timing: bool = False
    check_support: bool = True
    layout: str = "auto"
    kernels: str = "auto"
    count_launches: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {self.mode!r}")
        if not is_int(self.block) or self.block < 1:
            raise ValueError(f"block must be a positive int, not {self.block!r}")
        if self.expected_items is not None and (not is_int(self.expected_items) or self.expected_items < 0):
            raise ValueError(f"expected_items must be None or an int >= 0, not {self.expected_items!r}")
        if not isinstance(self.margin, (int, float)) or not (math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"margin must be a finite number >= 0, not {self.margin!r}")
        if not is_int(self.headroom) or not 0 <= self.headroom <= MAX_HEADROOM:
            raise ValueError(f"headroom must be an int in 0..{MAX_HEADROOM}, not {self.headroom!r}")
        if not is_int(self.seed) or not 0 <= self.seed < 1 << 64:
            raise ValueError(f"seed must be an int in [0, 2^64), not {self.seed!r}")
        if self.index not in INDEX_KINDS:
            raise ValueError(f"index must be one of {INDEX_KINDS}, not {self.index!r}")
        if self.cells is not None and (not is_int(self.cells) or self.cells < TABLES):
            raise ValueError(f"cells must be None or an int >= {TABLES}, not {self.cells!r}")
        if self.layout not in ("auto", *LAYOUTS):
            raise ValueError(f"layout must be one of {('auto', *LAYOUTS)}, not {self.layout!r}")
        if self.kernels not in KERNEL_CHOICES:
            raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, not {self.kernels!r}")
        for name in ("timing", "check_support", "count_launches"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, not {getattr(self, name)!r}")

    def shared(self) -> tuple:
        """The options every worker must agree on, for the agreement digest."""
        return (
            self.mode, self.block, self.expected_items, float(self.margin), self.headroom, self.seed,
            self.index, self.cells, self.layout,
        )
