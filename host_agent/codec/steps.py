"""The compute steps of a worker's rounds whose work differs on the GPU path: quantizing and dequantizing,
the first round's lead (the agreement and the header), the index round's messages, the candidates'
values, the scan, the output. On the GPU path each is one or two Triton kernels (``gpu/encoding.py``,
``gpu/decoding.py``, called through the face ``gpu``) that fuse what the torch code does in several
passes; elsewhere the torch code or the CPU kernels. ``protocol.Rounds`` takes them from here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lhc_ina.constants import Op

from . import gpu
from .agreement import AGREE_WORDS, agreement_words
from .granularity import count_windows
from .hashing import MASK32
from .index import bloom_masks
from .items import count_nonzero_items, gather_items
from .quantize import HEADER_WORDS, check_sum_range, dequantize, int_bound, quantize, scan_quantize

Step = tuple[Op, str, torch.Tensor]  # a message: op, kind, words


@dataclass
class Lead:
    """What an aggregation's first round leads with: the agreement message, which carries this worker's
    item count, and the header (host words). Both reach the device in one copy."""

    items: int
    header: torch.Tensor


class Steps:
    """Mixed into ``protocol.Rounds``, whose state they read (``x``, ``rows``, ``scale``, ``triton``...)."""

    def _lead_words(self, lead: Lead) -> torch.Tensor:
        """The agreement's words, then the header's, on the host."""
        with gpu.on_host():
            agree = agreement_words(self.rank, self.digest, lead.items, torch.device("cpu"))
            return torch.cat([agree, lead.header])

    def _send_lead(self, lead: Lead) -> tuple[Step, torch.Tensor]:
        """The agreement message and the header's words on the device, from one copy."""
        both = gpu.send(self._lead_words(lead), self.x.device)
        return (Op.ADD, "agree", both[:AGREE_WORDS]), both[AGREE_WORDS:]

    def _lead_messages(self, lead: Lead) -> list[Step]:
        """The agreement and the header as messages of their own."""
        agree, header = self._send_lead(lead)
        return [agree, (Op.OR, "header", header)]

    def _encode_triton(self, lead: Lead | None, scan_lead: bool) -> list[Step]:
        """The index round's messages on the GPU path, views of one device buffer: [agreement | header
        | index | sketch], zeroed by one fill. The index and the sketch are written in place by one pass
        over the bucket (``gpu.encode_bucket``) or, where the support was given, from its items.
        Where ``scan_lead``, that pass also finds the lead's figures and one more kernel writes the lead
        from them (``gpu.encode_lead``): nothing is read back, so the host does not wait (nor
        learn whether its own input is finite: the aggregated header says so to every worker). A lead
        made on the host arrives in one copy."""
        spec, sketch = self.index, self.sketch
        assert spec is not None
        first = 0 if lead is None and not scan_lead else AGREE_WORDS + HEADER_WORDS
        end = first + spec.words
        words = torch.zeros(end + (sketch.words if sketch else 0), dtype=torch.int32, device=self.x.device)
        masks = bloom_masks(spec, self.x.device)
        scale, clamp = self.scale if self.is_float else None, self.assumed is not None
        if self.support is None:
            stats = gpu.encode_bucket(self.x, self.block, spec.kind, spec.group, spec.seed & MASK32, masks,
                                  words[first:end], sketch, words[end:], scale, clamp)
            if scan_lead:
                gpu.encode_lead(stats, words[:first], self.rank, self.digest, self.world, self.is_float,
                            words[end:] if sketch is not None else None)
        else:
            gpu.encode_index(spec.kind, self.items, spec.group, spec.words, spec.seed & MASK32, masks,
                         out=words[first:end])
            if sketch is not None and self.finite:  # else zeros: the header says to discard them
                gpu.encode_sketch(sketch, self.items, self.rows, scale, clamp, out=words[end:])
        if lead is not None:
            gpu.send_into(words[:first], self._lead_words(lead))
        messages: list[Step] = [(Op.ADD, "agree", words[:AGREE_WORDS])] if first else []
        messages.append((Op.OR, "index", words[AGREE_WORDS if first else 0:end]))
        if sketch is not None:
            messages.append((Op.ADD, "sketch", words[end:]))
        return messages

    def _counted_lead(self, scale: int | None = None) -> tuple[Lead, torch.Tensor | None]:
        """The lead of a round that counts this worker's items without listing them (a sizing round, a
        dense round) and, at an assumed ``scale``, the bucket's words. A float bucket of single-element
        items gives all three from one pass (``quantize.scan_quantize``; words of zeros where it is not
        finite, as :meth:`_quantize` sends them); otherwise a count and the header (no words: the dense
        round quantizes)."""
        if not (self.is_float and self.block == 1):
            return Lead(count_nonzero_items(self.x, self.block), self._header(self.x)), None
        scan = scan_quantize(self.x, scale, kernels=not self.triton, out=self.dense_words)
        lead = Lead(scan.nonzero, self._header_of(scan.field, scan.finite, True))
        words = scan.words
        if words is not None and not scan.finite:
            words = torch.zeros_like(words)
        return lead, words

    def _quantize(self, rows: torch.Tensor, clamp: bool = False, out: torch.Tensor | None = None
                  ) -> torch.Tensor:
        if not self.is_float:
            return rows
        if not self.finite:  # only beside the header, which tells every worker to discard these words
            return torch.zeros(rows.shape, dtype=torch.int32, device=rows.device)
        assert self.scale is not None
        return quantize(rows, self.scale, clamp, kernels=not self.triton, out=out)

    def _dequantize(self, summed: torch.Tensor, part: torch.Tensor, out: torch.Tensor | None = None
                    ) -> torch.Tensor:
        """``part`` of the integer sums ``summed`` in the output dtype (written into ``out`` where given).
        Whether the sum overflows it is read from all of ``summed``, so that every worker raises alike
        whatever its output range."""
        if not self.is_float:
            return part if out is None else out.copy_(part)
        check_sum_range(summed, self.scale or 0, self.agreed, self.world, self.x.dtype)
        return dequantize(part, self.scale or 0, self.x.dtype, out=out, kernels=not self.triton)

    def _scan_triton(self) -> Lead:
        """This worker's item count and header from one pass over its bucket (one kernel, one
        read-back)."""
        return self._lead_of(gpu.scan_nonzero(self.x, self.block))

    def _lead_of(self, scan) -> Lead:
        """The lead of a scan's figures (``gpu.scan_nonzero``'s ``Scan``)."""
        bound = int_bound(self.world)
        in_bound = -bound <= scan.lo and scan.hi <= bound
        return Lead(scan.items, self._header_of(scan.field, scan.finite, in_bound))

    def _candidate_values(self, cands: torch.Tensor) -> torch.Tensor:
        """The quantized rows of ``cands`` (gathered and quantized by one kernel on the GPU path)."""
        if not self.triton:
            return self._quantize(gather_items(self.x, cands, self.block))
        if not self.finite:
            return torch.zeros((cands.numel(), self.block), dtype=torch.int32, device=self.x.device)
        return gpu.gather_quantize(self.x, cands, self.block, self.scale if self.is_float else None)

    def _fill_triton(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The output, written by one kernel that dequantizes too and counts what the granularity choice
        reads (returned on the device), and the candidates' rows in the range (for the stats: the whole
        range needs no search for them)."""
        whole = self.output_range.lo == 0 and self.output_range.hi == self.x.numel()
        rows = self.values if whole else self.values[self.output_range.candidates(self.cands, self.block)]
        scale = None
        if self.is_float:
            check_sum_range(self.values, self.scale or 0, self.agreed, self.world, self.x.dtype)
            scale = self.scale or 0
        total = self._output()
        counted = gpu.fill_output(total, self.output_range.lo, self.cands, self.values, self.block, scale,
                              count_windows(self.cands.numel()))
        return total, rows, counted
