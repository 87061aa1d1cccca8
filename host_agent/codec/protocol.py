"""One worker's rounds of the protocol, as a small state machine.

Each state is a method that takes the reduced words of the round just completed (by message kind) and
returns the next :class:`Round` (its messages and the state that will read their results) or the
:class:`Outcome`. The methods below read in protocol order:

* sparse modes (``sketch``, ``union``): ``_sparse_start`` -> [``_after_sizing``] -> ``_index_round`` ->
  ``_after_index`` -> [``_after_residue`` | ``_after_values``] -> ``_finish_sparse``
* ``dense`` (and a sparse mode whose index and sketch would cost more than the bucket itself):
  ``_dense_start`` -> ``_dense_round`` -> [``_after_dense_header`` -> ``_dense_round``] -> ``_after_dense``
  (-> ``_dense_round`` once more if an assumed scale did not hold)

Every decision is taken from aggregated words, identical on every worker, or from options the agreement
message proved identical; so all workers walk the same states and send the same lengths. The states'
reading of the header and the scale rule are ``header_steps.py``'s, the compute steps whose work differs
on the GPU path ``steps.py``'s; both are mixed into :class:`Rounds`.

A NaN or inf in any worker's input ends the aggregation in the state that reads the header (every worker
learns it there, from the header's NONFINITE word) with an all-NaN total on every worker: the non-finite
values are never quantized (a worker that knows its own input is not finite sends zeros in the words it
must send beside the header), and which elements held them is not exchanged (that would cost a round),
so the whole bucket reads as not finite, which is all a mixed-precision loss scaler looks for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from lhc_ina.constants import LANE_BYTES, LANES, Op

from .granularity import choose_group
from .hashing import derive_seed
from .header_steps import HeaderSteps
from .index import IndexSpec, choose_index, encode_index, expected_false_positives, query_index
from .items import gather_items, item_count, nonzero_rows, support_items
from .options import Options
from .output import OutputRange
from .peeling import peel
from .phase_clock import PhaseClock
from .quantize import FLOAT_DTYPES, HEADER_WORDS, SCALE_SLACK, scale_for, scale_holds
from .sketch import cells_per_candidate, encode_sketch, sketch_cells
from .sketch_spec import SketchSpec
from .state import BucketShape, CodecState
from .steps import Lead, Steps

Results = dict[str, torch.Tensor]  # a completed round's reduced words, by message kind
#: The kinds whose aggregate is read only on the host, from :attr:`Rounds.received` (the agreement, checked
#: as it arrives; the header's OR): a driver does not copy them to the device.
HOST_KINDS = frozenset({"agree", "header"})


def _packets(words: int) -> int:
    """Packets a message of ``words`` words takes (an empty message takes none)."""
    return -(-words // LANES)


@dataclass
class Round:
    """The messages of one round, (op, kind, words) each, and the state that reads their results."""

    messages: list[tuple[Op, str, torch.Tensor]]
    then: Callable[[Results], Round | Outcome]


@dataclass
class Outcome:
    total: torch.Tensor
    stats: dict
    state: CodecState


class Rounds(HeaderSteps, Steps):
    """The protocol state of one worker for one aggregation (see the module docstring)."""

    def __init__(
        self,
        x: torch.Tensor,
        rank: int,
        world_size: int,
        options: Options,
        state: CodecState,
        digest: int,
        shape: BucketShape,
        support: torch.Tensor | None,
        out: torch.Tensor | None,
        output_range: OutputRange,
        clock: PhaseClock,
        triton: bool = False,
        dense_words: torch.Tensor | None = None,
    ) -> None:
        self.x, self.rank, self.world, self.opts, self.state = x, rank, world_size, options, state
        self.shape, self.output_range = shape, output_range
        self.digest, self.support, self.out, self.clock = digest, support, out, clock
        self.triton = triton  # the GPU path: its kernels fuse the scan's statistics, quantizing, the output
        self.dense_words = dense_words  # where a dense round may write its words (the caller's, reused)
        self.block = options.block
        self.is_float = x.dtype in FLOAT_DTYPES
        self.n_items = item_count(x.numel(), self.block)
        self.lag = options.headroom + SCALE_SLACK
        self.item_sum: int | None = None  # the workers' summed item counts, from the agreement message
        self.assumed: int | None = None  # exponent field a scale was assumed from (not yet agreed)
        self.agreed: int | None = None  # the agreed exponent field (None: every input is zero)
        self.scale: int | None = None
        self.header_in_index = False
        self.finite = True  # whether this worker's own input is finite (its header says so to all)
        self.nonfinite: tuple[int, ...] = ()  # the workers whose input is not, once the header is back
        self.items = self.rows = self.cands = self.values = self.left = torch.empty(0)
        self.listed = False  # items and rows hold this worker's items (:meth:`_list_items`)
        self.index: IndexSpec | None = None
        self.sketch: SketchSpec | None = None
        self.peeled = False  # whether peeling recovered every candidate (it cannot stop at the range)
        self.stats: dict = {"protocol": options.mode, "scale_redo": False, "decoded_elements": 0}
        #: the last round's aggregates as the session received them (the states get them on the device)
        self.received: Results = {}

    # --- helpers ---------------------------------------------------------------------------------
    def _output(self) -> torch.Tensor:
        """Where the total goes (not zeroed: every caller writes all of it)."""
        return self.x.new_empty(self.output_range.size) if self.out is None else self.out

    def _nonfinite_outcome(self) -> Outcome:
        """All-NaN on every worker; the bucket's state keeps its estimates (this round measured nothing)."""
        with self.clock("decode"):
            total = self._output().fill_(float("nan"))
        self.stats.update(nonfinite_ranks=list(self.nonfinite), index="none", candidates=0, residue=0,
                          scale=None, items=None)
        state = CodecState(self.state.iteration + 1, self.state.items, self.state.exponent, self.shape,
                           self.state.group)
        return Outcome(total, self.stats, state)

    def start(self) -> Round:
        return self._dense_start() if self.opts.mode == "dense" else self._sparse_start()

    # --- sketch and union --------------------------------------------------------------------------
    def _sparse_start(self) -> Round:
        expected = self.opts.expected_items
        if expected is None:
            expected = self.state.items or None  # an all-zero last round tells nothing about this one
        self.assumed = self._assumed_field()
        sizing = expected is None or (self.is_float and self.opts.mode == "sketch" and self.assumed is None)
        scan = self.triton and self.support is None  # one pass counts the items, finds the header's figures
        if scan and not sizing:  # the same pass encodes the index and the sketch
            return self._index_round(expected, None, scan_lead=True)
        with self.clock("encode"):
            if scan:
                lead = self._scan_triton()
            else:
                if self.support is None and sizing:  # counted now, listed only if a sparse round comes
                    lead, _ = self._counted_lead()
                else:
                    self._list_items()
                    complete = True
                    if self.support is not None and self.opts.check_support:
                        complete = int(torch.count_nonzero(self.x)) == int(torch.count_nonzero(self.rows))
                    lead = Lead(self.items.numel(), self._header(self.rows, complete))
        if sizing:
            return Round(self._lead_messages(lead), self._after_sizing)
        return self._index_round(expected, lead)

    def _list_items(self) -> None:
        """This worker's items and their rows: its support's, or its nonzero ones (one scan). A sizing
        round only counts them (a dense bucket, whose sizing ends in a dense round, never lists its
        millions of items); the index round lists them then."""
        if self.support is not None:
            self.items = support_items(self.support.to(self.x.device), self.block)
            self.rows = gather_items(self.x, self.items, self.block)
        else:
            self.items, self.rows = nonzero_rows(self.x, self.block)
        self.listed = True

    def _after_sizing(self, res: Results) -> Round | Outcome:
        """The sizing round: the item counts bound the union, the header fixes the scale."""
        if self._parse_header("header"):
            return self._nonfinite_outcome()
        if self.is_float:
            self._settle_scale()
        expected = self.opts.expected_items if self.opts.expected_items is not None else self.item_sum
        assert expected is not None
        if self.item_sum == 0:  # no worker holds a nonzero: the sum is zero, nothing more to send
            with self.clock("decode"):
                total = self._output().zero_()
            self.stats.update(index="none", candidates=0, **self._sparse_stats())
            return self._outcome(total, None)
        return self._index_round(expected, None)

    def _index_round(self, expected: int, lead: Lead | None, scan_lead: bool = False) -> Round:
        """Index (with the header when not yet sent: ``lead``, or made by the encoding pass itself where
        ``scan_lead``) and, in sketch mode, the sketch, sized for ``expected`` items; the dense bucket
        instead where that would cost no more."""
        opts, block = self.opts, self.block
        iteration = self.state.iteration
        sketch = opts.mode == "sketch"
        layout = opts.layout
        per_candidate = cells_per_candidate(expected, opts.margin, layout) if sketch else 1
        value_bytes = LANE_BYTES * block * per_candidate
        index_seed = derive_seed(opts.seed, iteration, 1)
        spec = choose_index(self.n_items, expected, value_bytes, index_seed, opts.index, self.state.group)
        candidates = expected + expected_false_positives(spec, expected)
        cells = 0
        if sketch:
            cells = opts.cells or sketch_cells(candidates, opts.margin, block, LANES, layout)
        payload = cells * block if sketch else candidates * block
        header_words = 0 if lead is None and not scan_lead else HEADER_WORDS
        # Compared in whole packets, as they go on the wire: for a tiny bucket the index and the values
        # alone may fill two packets where the whole bucket fills one.
        sparse_packets = _packets(header_words + spec.words) + _packets(payload)
        if sparse_packets >= _packets(header_words) + _packets(self.x.numel()):
            if scan_lead:
                with self.clock("encode"):
                    lead = self._scan_triton()
            return self._dense_round(lead)
        self.index, self.header_in_index = spec, header_words > 0
        if sketch:
            self.sketch = SketchSpec(cells, block, derive_seed(opts.seed, iteration, 2), layout)
            if self.is_float and self.scale is None:
                self.scale = scale_for(self.assumed, self.world)
        with self.clock("encode"):
            messages = self._encode_triton(lead, scan_lead) if self.triton else self._encode(lead)
        return Round(messages, self._after_index)

    def _encode(self, lead: Lead | None) -> list[tuple[Op, str, torch.Tensor]]:
        """The index round's messages: (agreement,) header and index, (sketch)."""
        assert self.index is not None
        if not self.listed:
            self._list_items()
        index_words = encode_index(self.index, self.items)
        messages = []
        if lead is not None:
            agree, header = self._send_lead(lead)
            index_words = torch.cat([header, index_words])
            messages.append(agree)
        messages.append((Op.OR, "index", index_words))
        if self.sketch is not None:
            rows = self._quantize(self.rows, clamp=self.assumed is not None)
            messages.append((Op.ADD, "sketch", encode_sketch(self.sketch, self.items, rows)))
        return messages

    def _after_index(self, res: Results) -> Round | Outcome:
        words = res["index"]
        if self.header_in_index:
            if self._parse_header("index"):
                return self._nonfinite_outcome()
            words = words[HEADER_WORDS:]
        with self.clock("decode", "index"):
            self.cands = query_index(self.index, words)
        spec = self.index
        assert spec is not None
        k = self.cands.numel()
        self.stats.update(index=spec.kind, index_words=spec.words, bloom_k=spec.k, candidates=k)
        if self.sketch is not None and scale_holds(self.agreed, self.assumed, self.lag):
            with self.clock("decode", "peel"):
                peeled = peel(self.sketch, self.cands, res["sketch"].view(self.sketch.cells, self.block))
            self.values, self.left, self.peeled = peeled.values, peeled.residue, True
            self.stats.update(peel_rounds=peeled.rounds, residue=self.left.numel())
            if not self.left.numel():
                return self._finish_sparse()
            with self.clock("encode"):
                q = self._candidate_values(self.cands[self.left])
            return Round([(Op.ADD, "residue", q)], self._after_residue)
        # union mode, or a sketch quantized at a scale that did not hold: every candidate's value, at
        # the scale of the one rule (the agreed scale after a redo)
        if self.sketch is not None:
            self.stats["scale_redo"] = True
        if self.is_float:
            self._settle_scale()
        if not self.cands.numel():
            self.values = torch.zeros((0, self.block), dtype=torch.int32, device=self.x.device)
            return self._finish_sparse()
        with self.clock("encode"):
            q = self._candidate_values(self.cands)
        return Round([(Op.ADD, "values", q)], self._after_values)

    def _after_residue(self, res: Results) -> Outcome:
        self.values[self.left] = res["residue"].view(self.left.numel(), self.block)
        return self._finish_sparse()

    def _after_values(self, res: Results) -> Outcome:
        self.values = res["values"].view(self.cands.numel(), self.block)
        return self._finish_sparse()

    def _finish_sparse(self) -> Outcome:
        with self.clock("decode", "output"):
            counted = None  # the GPU path's output kernel counts what the granularity choice reads
            if self.triton:
                total, rows, counted = self._fill_triton()
            else:
                run = self.output_range.candidates(self.cands, self.block)
                rows = self._dequantize(self.values, self.values[run])
                total = self._output()
                self.output_range.fill(total, self.cands[run], rows, self.block)
        with self.clock("decode", "granularity"):
            per_candidate = self.sketch.cells / max(1, len(self.cands)) if self.sketch else 1
            cost = LANE_BYTES * self.block * per_candidate
            group, union = choose_group(self.n_items, self.cands, self.values, cost, counted)
        decoded = self.values if self.peeled else rows
        self.stats.update(self._sparse_stats(), decoded_elements=decoded.numel(), next_group=group)
        return self._outcome(total, union or None, group)  # an empty union tells nothing about the next round

    def _sparse_stats(self) -> dict:
        residue = self.stats.get("residue", 0)
        return {
            "residue": residue,
            "peel_rounds": self.stats.get("peel_rounds", 0),
            "fallback": residue > 0,
            "sketch_cells": self.sketch.cells if self.sketch else 0,
        }

    # --- dense ---------------------------------------------------------------------------------------
    def _dense_start(self) -> Round:
        """The lead counts the bucket's nonzero items, as a sparse mode's does: mode ``auto`` reads the
        next call's density from their sum (a dense call that told nothing would make the next one
        measure again, in sketch mode)."""
        self.assumed = self._assumed_field()
        words = None
        with self.clock("encode"):
            if self.triton:
                lead = self._scan_triton()
            else:  # one pass for the lead and, at an assumed scale, the words
                scale = None if self.assumed is None else scale_for(self.assumed, self.world)
                lead, words = self._counted_lead(scale)
        return self._dense_round(lead, words)

    def _after_dense_header(self, res: Results) -> Round | Outcome:
        if self._parse_header("header"):
            return self._nonfinite_outcome()
        if self.is_float:
            self._settle_scale()
        return self._dense_round(None)

    def _dense_round(self, lead: Lead | None, words: torch.Tensor | None = None) -> Round:
        """The whole bucket, quantized at the agreed scale, or at the assumed one with the header beside;
        floats with neither send the header alone first. ``words``: the bucket already quantized at the
        assumed scale (by the lead's pass)."""
        self.stats.update(protocol="dense", index="none", candidates=self.x.numel(), residue=0)
        if self.is_float and self.scale is None:
            if self.assumed is None:
                assert lead is not None
                return Round(self._lead_messages(lead), self._after_dense_header)
            self.scale = scale_for(self.assumed, self.world)
        if words is not None:
            q = words
        else:
            with self.clock("encode"):
                q = self._quantize(self.x, clamp=self.assumed is not None, out=self.dense_words)
        messages = [*([] if lead is None else self._lead_messages(lead)), (Op.ADD, "dense", q)]
        return Round(messages, self._after_dense)

    def _after_dense(self, res: Results) -> Round | Outcome:
        if "header" in self.received:
            if self._parse_header("header"):
                return self._nonfinite_outcome()
            if not scale_holds(self.agreed, self.assumed, self.lag):
                self.stats["scale_redo"] = True
                self.assumed, self.scale = None, scale_for(self.agreed, self.world)
                return self._dense_round(None)
        with self.clock("decode", "output"):
            total = self._dequantize(res["dense"], self.output_range.words(res["dense"]), out=self._output())
        self.stats["decoded_elements"] = total.numel()
        # every worker counted its items (dense too): their sum is the next call's density estimate
        return self._outcome(total, min(self.item_sum, self.n_items) if self.item_sum else None)

    def _outcome(self, total: torch.Tensor, items: int | None, group: int = 1) -> Outcome:
        exponent = self.agreed if self.agreed is not None else self.state.exponent
        state = CodecState(
            self.state.iteration + 1, items, exponent if self.is_float else None, self.shape, group
        )
        self.stats.update(scale=self.scale if self.is_float else None, items=items)
        return Outcome(total, self.stats, state)
