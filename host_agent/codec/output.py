"""What a worker decodes: the whole bucket, or only an output range [lo, hi) of its elements (its shard
of a reduce_scatter).

Only the last stage of a session looks at the range. Every worker still sends its whole input and
receives the whole aggregate (the switch multicasts one result to all), so the messages, their lengths,
the agent's round seals and the agreement digest do not depend on the range: workers whose ranges
differ need no agreement on them, and a range never changes a bit on the wire. It saves decoding:

* ``dense``: only the range's words are dequantized.
* ``union``: only the candidates that overlap the range are dequantized and scattered. The candidate
  list is sorted by item, so they are one contiguous run of it, found by two binary searches.
* ``sketch``: peeling still recovers every candidate: any cell sums candidates from anywhere in the
  bucket, so a candidate in the range is pure only once the others in its cells were peeled, and those
  were freed by others still, with no bound on where in the bucket that chain leads. Then, as in union,
  only the range's candidates are dequantized and scattered.

Each element of the range is computed by the same operations as in a whole decode (dequantizing is
elementwise), so it equals the same slice of the whole total bit for bit; everything a session decides
from the aggregate (the bucket's next state, the overflow error) still reads all of it, so that every
worker decides alike whatever its range.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import gpu
from .items import fill_items
from .options import is_int


@dataclass(frozen=True)
class OutputRange:
    """Elements [lo, hi) of a bucket, the part of the total a worker decodes."""

    lo: int
    hi: int

    @classmethod
    def of(cls, output_range: tuple[int, int] | None, length: int) -> OutputRange:
        """The range ``(lo, hi)`` of a bucket of ``length`` elements (None: all of it); raises
        ValueError unless ``0 <= lo <= hi <= length``."""
        if output_range is None:
            return cls(0, length)
        if not isinstance(output_range, tuple) or len(output_range) != 2 or not all(
                is_int(end) for end in output_range):
            raise ValueError(f"output_range must be a tuple (lo, hi) of two ints, not {output_range!r}")
        lo, hi = output_range
        if not 0 <= lo <= hi <= length:
            raise ValueError(f"output_range {output_range} is not 0 <= lo <= hi <= {length} (the bucket)")
        return cls(lo, hi)

    @property
    def size(self) -> int:
        return self.hi - self.lo

    def words(self, dense: torch.Tensor) -> torch.Tensor:
        """The range's part of a dense bucket's words."""
        return dense[self.lo : self.hi]

    def candidates(self, cands: torch.Tensor, block: int) -> slice:
        """The run of the sorted candidate items ``cands`` that overlaps the range (its ends read back
        through a pinned buffer where ``cands`` is on a GPU: one small copy, no pageable read)."""
        items = torch.tensor([self.lo // block, -(-self.hi // block)], dtype=cands.dtype, device=cands.device)
        first, end = gpu.read_back(torch.searchsorted(cands, items)).tolist()
        return slice(first, end)

    def fill(self, out: torch.Tensor, items: torch.Tensor, rows: torch.Tensor, block: int) -> None:
        """Write ``out`` (the range's elements) whole: the (K, block) ``rows`` of sorted ``items``, each
        overlapping the range, zero elsewhere; what lies outside the range is cut."""
        first = self.lo // block
        head = self.lo - first * block  # elements of the first item before the range
        items = items - first if first else items
        if head == 0:
            fill_items(out, items, rows, block)
            return
        padded = out.new_empty(head + out.numel())
        fill_items(padded, items, rows, block)
        out.copy_(padded[head:])
