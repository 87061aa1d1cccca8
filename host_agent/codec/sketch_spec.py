"""The agreed shape of one round's sketch (:class:`SketchSpec`) and its layout, in a module of its own:
the sketch's torch reference (``sketch.py``, ``peeling.py``) and its kernels (``cpu/``, ``gpu/``) all read
it, and the kernels import it from here rather than from the reference that calls them. What the layouts
are and why: ``sketch.py``'s docstring."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .hashing import derive_seed

TABLES = 3
FUSE_ARITY = 4
#: Below this many cells the plain layout is used: a chain of fewer than ~21 start segments peels
#: worse than its fitted threshold (measured: 1-2% failures at 2,000-5,000 candidates, none in 300 trials
#: each from 10,000; docs/codec.md). From here the fused rule needs 3-7% fewer cells than the plain one.
FUSE_MIN_CELLS = 1 << 14
_START_TAG = 15  # derive_seed purpose of the start-segment hash (tables use 0..arity-1)


def fuse_starts(cells: int) -> int:
    """Start segments of a fused sketch of ``cells`` cells: ~sqrt(cells) / 6, so a segment holds ~6
    sqrt(cells) cells (fewer segments peel worse near the chain's ends, more take torch more rounds)."""
    return max(1, math.isqrt(cells) // 6)


@dataclass(frozen=True)
class SketchSpec:
    """The agreed shape of one round's sketch (identical on every worker); the layout follows from it."""

    cells: int
    block: int
    seed: int
    layout: str = "fused"

    @property
    def fused(self) -> bool:
        return self.layout == "fused" and self.cells >= FUSE_MIN_CELLS

    @property
    def arity(self) -> int:
        return FUSE_ARITY if self.fused else TABLES

    @property
    def starts(self) -> int:
        return fuse_starts(self.cells) if self.fused else 1

    @property
    def segment_cells(self) -> int:
        """Cells per segment; the last ``cells % segments`` cells are never used (always zero)."""
        return self.cells // (self.starts + self.arity - 1)

    @property
    def words(self) -> int:
        return self.cells * self.block

    def seeds(self) -> tuple[int, tuple[int, ...]]:
        """(start-segment seed, per-cell seeds): hashes fresh per bucket and round (the spec's seed)."""
        return derive_seed(self.seed, _START_TAG), tuple(derive_seed(self.seed, t) for t in range(self.arity))

    def geometry(self) -> tuple:
        """The layout as the C kernels take it."""
        start_seed, seeds = self.seeds()
        return (self.arity, self.starts, self.segment_cells, self.block, start_seed, seeds)
