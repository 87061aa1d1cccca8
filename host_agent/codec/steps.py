"""The compute steps of a worker's rounds whose work differs on the GPU path: quantizing and dequantizing,
the sketch's words, the candidates' values, the scan, the output. On the GPU path each is one or two
Triton kernels (``gpu_encode``, ``gpu_decode``) that fuse what the torch code does in several passes;
elsewhere the torch code or the CPU kernels. ``protocol.Rounds`` takes them from here.
"""

from __future__ import annotations

import torch

from .items import gather_items
from .quantize import check_sum_range, dequantize, int_bound, quantize
from .sketch import encode_sketch


class Steps:
    """Mixed into ``protocol.Rounds``, whose state they read (``x``, ``rows``, ``scale``, ``triton``...)."""

    def _quantize(self, rows: torch.Tensor, clamp: bool = False) -> torch.Tensor:
        if not self.is_float:
            return rows
        if not self.finite:  # only beside the header, which tells every worker to discard these words
            return torch.zeros(rows.shape, dtype=torch.int32, device=rows.device)
        assert self.scale is not None
        return quantize(rows, self.scale, clamp)

    def _dequantize(self, summed: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
        """``part`` of the integer sums ``summed`` in the output dtype. Whether the sum overflows it is
        read from all of ``summed``, so that every worker raises alike whatever its output range."""
        if not self.is_float:
            return part
        check_sum_range(summed, self.scale or 0, self.agreed, self.world, self.x.dtype)
        return dequantize(part, self.scale or 0, self.x.dtype)

    def _scan_triton(self) -> torch.Tensor:
        """This worker's items, rows and header from one scan of its bucket (two kernels)."""
        from .gpu_encode import scan_nonzero

        scan = scan_nonzero(self.x, self.block)
        self.items, self.rows = scan.items, scan.rows
        bound = int_bound(self.world)
        return self._header_of(scan.field, scan.finite, -bound <= scan.lo and scan.hi <= bound)

    def _sketch_words(self, clamp: bool) -> torch.Tensor:
        """This worker's sketch: its rows quantized and added to their cells (one kernel on the GPU path)."""
        assert self.sketch is not None
        if not self.triton:
            return encode_sketch(self.sketch, self.items, self._quantize(self.rows, clamp=clamp))
        if not self.finite:  # only beside the header, which tells every worker to discard these words
            return torch.zeros(self.sketch.words, dtype=torch.int32, device=self.x.device)
        from .gpu_encode import encode_sketch as encode_sketch_triton

        return encode_sketch_triton(self.sketch, self.items, self.rows, self.scale if self.is_float else None,
                                    clamp)

    def _candidate_values(self, cands: torch.Tensor) -> torch.Tensor:
        """The quantized rows of ``cands`` (gathered and quantized by one kernel on the GPU path)."""
        if not self.triton:
            return self._quantize(gather_items(self.x, cands, self.block))
        if not self.finite:
            return torch.zeros((cands.numel(), self.block), dtype=torch.int32, device=self.x.device)
        from .gpu_encode import gather_quantize

        return gather_quantize(self.x, cands, self.block, self.scale if self.is_float else None)

    def _fill_triton(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The output, written by one kernel that dequantizes too, and the candidates' rows in the range
        (for the stats: the whole range needs no search for them)."""
        from .gpu_decode import fill_output

        whole = self.output_range.lo == 0 and self.output_range.hi == self.x.numel()
        rows = self.values if whole else self.values[self.output_range.candidates(self.cands, self.block)]
        scale = None
        if self.is_float:
            check_sum_range(self.values, self.scale or 0, self.agreed, self.world, self.x.dtype)
            scale = self.scale or 0
        total = self._output()
        fill_output(total, self.output_range.lo, self.cands, self.values, self.block, scale)
        return total, rows
