"""One worker's side of an aggregation: a state machine a transport can drive, one worker per process.

Protocol (docs/architecture.md §1, docs/codec.md), in rounds; each round is one or two *steps*, and each
step is one message whose words every worker sends with the same op and the same length, the transport
reduces (ADD: int32 sum mod 2^32, OR: bitwise or) and every worker receives back. All lengths and
decisions after a round follow from what that round returned, which is identical on every worker, so no
other agreement is ever needed.

``sketch``
  1. (only without a size estimate or, for floats, without a known scale) OR header; ADD item count.
  2. OR header + index; ADD sketch (both steps in one round: neither depends on the other's result).
  3. (only if the assumed scale did not hold) ADD the candidates' values at the agreed scale, or
     (only if peeling left a residue) ADD the residue's values. Either way the result is exact.
``union``
  1. (only without a size estimate) OR header; ADD item count.
  2. OR header + index.   3. ADD the values of every candidate, in candidate order.
``dense``
  1. (only for floats without a known scale) OR header.   2. ADD the whole quantized bucket (with the
  header in the same round when the scale is assumed; redone at the agreed scale if it did not hold).

The size estimate is ``expected_items`` if given, else the previous round's union (``CodecState``),
else the sum of the workers' item counts (an upper bound on the union); a previous union of zero counts
as unknown. An assumed scale is the previous round's agreed exponent plus ``headroom`` binades. It
*holds* when no worker's max |x| lies above it and the agreed exponent lies at most ``headroom +
SCALE_SLACK`` binades below it; otherwise the values are sent again at the agreed scale. Every mode picks
its scale by that one rule, so a bucket quantizes identically whatever the mode, and the error bound of
:mod:`.quantize` holds with a quantum at most ``2^(headroom + SCALE_SLACK)`` times the agreed scale's.

Driving it::

    session = WorkerSession(x, rank, world_size, mode="sketch", state=state)
    while (msg := session.next_message()) is not None:
        session.receive(reduce(msg.op, msg.words))     # across all workers
    total, stats, state = session.result()

A transport may also send every message of a round before receiving any result of it (``next_message``
then returns the next one at once); it raises RuntimeError when the next message depends on a result
not yet received.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from host_agent.errors import AggregationError
from lhc_ina.constants import FRAME_BYTES, LANE_BYTES, LANES, MAX_WORKERS, PAYLOAD_BYTES, Op

from .hashing import derive_seed
from .index import choose_index, encode_index, expected_false_positives, query_index
from .items import gather_items, item_count, nonzero_items, scatter_items, support_items
from .peeling import peel
from .quantize import (
    FLOAT_DTYPES,
    HEADER_WORDS,
    INT_DTYPES,
    dequantize,
    exponent_field,
    header_words,
    int_in_bound,
    parse_header,
    quantize,
    scale_for,
)
from .sketch import DEFAULT_MARGIN, PEEL_THRESHOLD, SketchSpec, encode_sketch, sketch_cells

MODES = ("sketch", "union", "dense")
DEFAULT_HEADROOM = 1
#: Binades the agreed exponent may fall below the assumed one (beyond the headroom) before the round is
#: redone at the agreed scale: the error bound then holds with a quantum at most 2^SCALE_SLACK times the
#: agreed scale's, whatever the history.
SCALE_SLACK = 1
_MAX_FIELD = 254


@dataclass(frozen=True)
class Message:
    """One step: ``words`` (1-D int32) to be reduced across all workers with ``op``."""

    op: Op
    words: torch.Tensor
    round: int
    kind: str  # what the words are: header, count, index, sketch, values, residue, dense


@dataclass(frozen=True)
class CodecState:
    """What a bucket's next aggregation learns from this one. Identical on every worker, because it is
    derived only from aggregated data; pass it to the next round of the same bucket."""

    iteration: int = 0
    items: int | None = None  # union items of the last round (estimate when the index was a Bloom filter)
    exponent: int | None = None  # agreed float32 exponent field of the last round's max |x|
    elements: int | None = None  # the bucket this state belongs to: its length, dtype and block
    dtype: str | None = None
    block: int | None = None


@dataclass
class WorkerResult:
    total: torch.Tensor
    stats: dict
    state: CodecState

    def __iter__(self) -> Iterator:
        return iter((self.total, self.stats, self.state))


@dataclass
class _Trace:
    steps: list[tuple[int, str, str, int]] = field(default_factory=list)  # (round, op, kind, words)
    encode_s: float = 0.0
    decode_s: float = 0.0


def _check_input(x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"inputs must be torch tensors, not {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES + INT_DTYPES:
        raise TypeError(f"input dtype {x.dtype} is not supported (int32, float32, float16 or bfloat16)")
    if x.dim() != 1:
        raise ValueError(f"inputs must be 1-D tensors, not of shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError("inputs must not be empty")


def _misses_nonzeros(x: torch.Tensor, support: torch.Tensor) -> bool:
    """Whether ``x`` has a nonzero outside ``support`` (two counts: O(n) reads, no allocation of n)."""
    support = support.to(x.device, torch.int64)
    if support.numel() and (int(support.min()) < 0 or int(support.max()) >= x.numel()):
        return False  # out of range: support_items names that error when the round starts
    return int(torch.count_nonzero(x)) != int(torch.count_nonzero(x[support.unique()]))


def _check_state(state: CodecState | None, x: torch.Tensor, block: int) -> None:
    """A state carries what one bucket learnt; another bucket's would mis-size or mis-scale this one."""
    if state is None or state.elements is None:
        return
    mine = (x.numel(), str(x.dtype), block)
    theirs = (state.elements, state.dtype, state.block)
    if mine != theirs:
        raise ValueError(
            f"the CodecState belongs to a bucket of (elements, dtype, block) {theirs}, not {mine}: pass "
            "the state of this bucket, or none to start afresh"
        )


class WorkerSession:
    """The codec protocol for one worker (see the module docstring)."""

    def __init__(
        self,
        x: torch.Tensor,
        rank: int,
        world_size: int,
        *,
        mode: str = "sketch",
        block: int = 1,
        state: CodecState | None = None,
        support: torch.Tensor | None = None,
        expected_items: int | None = None,
        margin: float = DEFAULT_MARGIN,
        headroom: int = DEFAULT_HEADROOM,
        seed: int = 0,
        index: str = "auto",
        cells: int | None = None,
        out: torch.Tensor | None = None,
        timing: bool = False,
    ) -> None:
        _check_input(x)
        if not 1 <= world_size <= MAX_WORKERS:
            raise ValueError(f"world_size must be 1..{MAX_WORKERS}, not {world_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if not isinstance(block, int) or block < 1:
            raise ValueError(f"block must be a positive int, not {block!r}")
        if expected_items is not None and expected_items < 0:
            raise ValueError("expected_items must be >= 0")
        if cells is not None and cells < 3:
            raise ValueError("cells must be >= 3")
        if headroom < 0:
            raise ValueError("headroom must be >= 0")
        if not isinstance(margin, (int, float)) or margin < 0:
            raise ValueError(f"margin must be a number >= 0, not {margin!r}")
        if not isinstance(seed, int) or not 0 <= seed < 1 << 64:
            raise ValueError(f"seed must be an int in 0..2^64-1, not {seed!r}")
        if index not in ("auto", "bitmap", "bloom"):
            raise ValueError(f"index must be 'auto', 'bitmap' or 'bloom', not {index!r}")
        if support is not None and _misses_nonzeros(x, support):
            raise ValueError("support misses nonzero elements of the input: they would be dropped "
                             "(support must list every nonzero element index)")
        if out is not None and (out.shape != x.shape or out.dtype != x.dtype or out.device != x.device):
            raise ValueError("out must have the input's shape, dtype and device")
        _check_state(state, x, block)
        self.x = x
        self.rank = rank
        self.world_size = world_size
        self.mode = mode
        self.block = block
        self.state = state or CodecState()
        self.support = support
        self.expected_items = expected_items
        self.margin = margin
        self.headroom = headroom
        self.seed = seed
        self.index = index
        self.cells = cells
        self.out = out
        self.is_float = x.dtype in FLOAT_DTYPES
        self.n_items = item_count(x.numel(), block)
        self._sync = timing and x.device.type == "cuda"
        self._timing = timing
        self._trace = _Trace()
        self._stats: dict = {}
        self._gen = self._protocol()
        self._started = False
        self._finished = False
        self._round = 0
        self._outbox: deque[Message] = deque()
        self._awaiting: deque[Message] = deque()
        self._results: list[torch.Tensor] = []
        self._result: WorkerResult | None = None

    # --- driving -------------------------------------------------------------------------------
    def next_message(self) -> Message | None:
        """The next message to send, or None when the aggregation is complete."""
        if not self._started:
            self._started = True
            self._advance(None)
        if self._outbox:
            msg = self._outbox.popleft()
            self._awaiting.append(msg)
            return msg
        if self._awaiting:
            raise RuntimeError("the next message depends on the aggregate of a pending one: receive() first")
        return None

    def next_round(self) -> list[Message]:
        """Every message of the next round (none depends on another's aggregate), in the order to send
        them; an empty list when the aggregation is complete. Receive each one's aggregate, in order."""
        messages = []
        while (self._outbox or not self._started) and (msg := self.next_message()) is not None:
            messages.append(msg)
        if not messages and self._awaiting:
            raise RuntimeError("the next round depends on aggregates not yet received: receive() first")
        return messages

    def receive(self, words: torch.Tensor) -> None:
        """The aggregate (across all workers) of the oldest message sent and not yet received."""
        if not self._awaiting:
            raise RuntimeError("receive() without a pending message")
        msg = self._awaiting[0]
        if not isinstance(words, torch.Tensor) or words.dtype != torch.int32 or words.dim() != 1:
            raise TypeError("the aggregate must be a 1-D int32 tensor")
        if words.numel() != msg.words.numel():
            raise ValueError(f"aggregate of {words.numel()} words for a message of {msg.words.numel()}")
        self._awaiting.popleft()
        self._results.append(words.to(self.x.device))
        if not self._awaiting and not self._outbox:
            results, self._results = self._results, []
            self._advance(results)

    @property
    def done(self) -> bool:
        return self._finished

    def result(self) -> WorkerResult:
        """The aggregated total (the input's dtype), the stats and the bucket's next CodecState."""
        if self._result is None:
            raise RuntimeError("the aggregation is not complete")
        return self._result

    def _advance(self, results: list[torch.Tensor] | None) -> None:
        try:
            batch = self._gen.send(results)
        except StopIteration:
            self._finished = True
            return
        self._round += 1
        for msg in batch:
            self._trace.steps.append((self._round, msg.op.name, msg.kind, msg.words.numel()))
        self._outbox.extend(batch)

    @contextmanager
    def _clock(self, what: str) -> Iterator[None]:
        if not self._timing:
            yield
            return
        if self._sync:
            torch.cuda.synchronize(self.x.device)
        start = time.perf_counter()
        yield
        if self._sync:
            torch.cuda.synchronize(self.x.device)
        elapsed = time.perf_counter() - start
        if what == "encode":
            self._trace.encode_s += elapsed
        else:
            self._trace.decode_s += elapsed

    def _msg(self, op: Op, words: torch.Tensor, kind: str) -> Message:
        return Message(op, words.reshape(-1), self._round + 1, kind)

    # --- protocol ------------------------------------------------------------------------------
    def _protocol(self) -> Generator[list[Message], list[torch.Tensor], None]:
        if self.mode == "dense":
            yield from self._dense()
        else:
            yield from self._sparse()

    def _inspect(self, values: torch.Tensor) -> torch.Tensor:
        """This worker's header words for ``values`` (its nonzero rows, or the whole bucket)."""
        if self.is_float:
            fld, finite = exponent_field(values)
            return header_words(fld, self.rank, finite, True, values.device)
        return header_words(None, self.rank, True, int_in_bound(values, self.world_size), values.device)

    def _assumed_field(self) -> int | None:
        if not self.is_float or self.state.exponent is None:
            return None
        return min(self.state.exponent + self.headroom, _MAX_FIELD)

    def _held(self, agreed: int | None, assumed: int | None) -> bool:
        """Whether the assumed scale serves this round: no input above it, and none so far below it that
        the quantum would be coarser than ``SCALE_SLACK`` binades beyond the agreed scale's."""
        if assumed is None or agreed is None:
            return True
        return assumed - self.headroom - SCALE_SLACK <= agreed <= assumed

    def _scale(self, agreed: int | None, assumed: int | None) -> int:
        """The one rule every mode follows once the agreed exponent is known: the assumed scale when it
        held, else the agreed one. Modes therefore quantize a bucket identically, given the same state."""
        return scale_for(assumed if assumed is not None and self._held(agreed, assumed) else agreed,
                         self.world_size)

    def _quantize(self, rows: torch.Tensor, scale: int | None, clamp: bool = False) -> torch.Tensor:
        if not self.is_float:
            return rows
        assert scale is not None
        return quantize(rows, scale, clamp)

    def _sparse(self) -> Generator[list[Message], list[torch.Tensor], None]:
        x, block, world = self.x, self.block, self.world_size
        with self._clock("encode"):
            if self.support is not None:
                items = support_items(self.support.to(x.device), x.numel(), block)
            else:
                items = nonzero_items(x, block)
            rows = gather_items(x, items, block)
            header = self._inspect(rows)
        # A zero union (an all-zero step) says nothing about the next one: measure it again.
        expected = self.expected_items if self.expected_items is not None else (self.state.items or None)
        agreed: int | None = None
        header_sent = False
        scale: int | None = None
        assumed = self._assumed_field()
        need_scale = self.is_float and self.mode == "sketch" and assumed is None
        if expected is None or need_scale:
            msgs = [self._msg(Op.OR, header, "header")]
            if expected is None:
                count = torch.tensor([items.numel()], dtype=torch.int32, device=x.device)
                msgs.append(self._msg(Op.ADD, count, "count"))
            res = yield msgs
            with self._clock("decode"):
                agreed = parse_header(res[0], world)
                if expected is None:
                    expected = int(res[1][0]) & 0xFFFFFFFF
            header_sent = True
            if self.is_float:
                scale = self._scale(agreed, assumed)

        iteration = self.state.iteration
        value_bytes = LANE_BYTES * block
        if self.mode == "sketch":
            value_bytes *= PEEL_THRESHOLD * (1 + self.margin)
        index_seed = derive_seed(self.seed, iteration, 1)
        spec = choose_index(self.n_items, expected, value_bytes, index_seed, self.index)
        sspec = None
        with self._clock("encode"):
            index_words = encode_index(spec, items)
            if not header_sent:
                index_words = torch.cat([header, index_words])
            msgs = [self._msg(Op.OR, index_words, "index")]
            if self.mode == "sketch":
                candidates = expected + expected_false_positives(spec, expected)
                cells = self.cells or sketch_cells(candidates, self.margin, block, LANES)
                sspec = SketchSpec(cells, block, derive_seed(self.seed, iteration, 2))
                if scale is None and self.is_float:
                    scale = scale_for(assumed, world)
                q = self._quantize(rows, scale, clamp=assumed is not None)
                msgs.append(self._msg(Op.ADD, encode_sketch(sspec, items, q), "sketch"))
        res = yield msgs
        with self._clock("decode"):
            index_agg = res[0]
            if not header_sent:
                agreed = parse_header(index_agg[:HEADER_WORDS], world)
                index_agg = index_agg[HEADER_WORDS:]
            cands = query_index(spec, index_agg)
        k = cands.numel()
        stats = {"index": spec.kind, "index_words": spec.words, "bloom_k": spec.k, "candidates": k}
        residue = 0
        peel_rounds = 0
        redo = False
        values: torch.Tensor | None = None
        if sspec is not None and (header_sent or self._held(agreed, assumed)):
            with self._clock("decode"):
                result = peel(sspec, cands, res[1].view(sspec.cells, block))
                values = result.values
                left = result.residue
                residue = left.numel()
                peel_rounds = result.rounds
            if residue:
                with self._clock("encode"):
                    q = self._quantize(gather_items(x, cands[left], block), scale)
                res = yield [self._msg(Op.ADD, q, "residue")]
                with self._clock("decode"):
                    values[left] = res[0].view(residue, block)
        else:
            redo = sspec is not None
            if self.is_float:
                scale = self._scale(agreed, assumed)
            if k:
                with self._clock("encode"):
                    q = self._quantize(gather_items(x, cands, block), scale)
                res = yield [self._msg(Op.ADD, q, "values")]
                values = res[0].view(k, block)
            else:
                values = torch.zeros((0, block), dtype=torch.int32, device=x.device)
        with self._clock("decode"):
            total = self._output()
            rows_out = dequantize(values, scale or 0, x.dtype) if self.is_float else values
            scatter_items(total, cands, rows_out, block)
            union = k if spec.kind == "bitmap" else int((values != 0).any(dim=1).sum())
        stats.update(
            sketch_cells=sspec.cells if sspec else 0,
            residue=residue,
            peel_rounds=peel_rounds,
            fallback=residue > 0,
            scale_redo=redo,
            items=union,
        )
        self._finish(total, stats, union, agreed, scale)

    def _dense(self) -> Generator[list[Message], list[torch.Tensor], None]:
        x, world = self.x, self.world_size
        with self._clock("encode"):
            header = self._inspect(x)
        assumed = self._assumed_field()
        if self.is_float and assumed is None:
            res = yield [self._msg(Op.OR, header, "header")]
            with self._clock("decode"):
                agreed = parse_header(res[0], world)
            scale = self._scale(agreed, assumed)
            with self._clock("encode"):
                q = self._quantize(x, scale)
            res = yield [self._msg(Op.ADD, q, "dense")]
            summed = res[0]
        else:
            scale = scale_for(assumed, world) if self.is_float else None
            with self._clock("encode"):
                q = self._quantize(x, scale, clamp=True)
            res = yield [self._msg(Op.OR, header, "header"), self._msg(Op.ADD, q, "dense")]
            with self._clock("decode"):
                agreed = parse_header(res[0], world)
            summed = res[1]
            if not self._held(agreed, assumed):
                scale = self._scale(agreed, assumed)
                with self._clock("encode"):
                    q = self._quantize(x, scale)
                res = yield [self._msg(Op.ADD, q, "dense")]
                summed = res[0]
        with self._clock("decode"):
            total = self._output()
            total.copy_(dequantize(summed, scale or 0, x.dtype) if self.is_float else summed)
        self._finish(total, {"index": "none", "candidates": x.numel(), "residue": 0}, None, agreed, scale)

    def _output(self) -> torch.Tensor:
        if self.out is None:
            return torch.zeros_like(self.x)
        return self.out.zero_()

    def _finish(
        self, total: torch.Tensor, stats: dict, union: int | None, agreed: int | None, scale: int | None
    ) -> None:
        if self.is_float and self.x.dtype != torch.float32 and bool(torch.isinf(total).any()):
            raise AggregationError(
                f"the sum overflows {self.x.dtype} (finite inputs, an infinite total): aggregate in "
                "float32 (the DDP hook does), or scale the inputs down", tuple(range(self.world_size))
            )
        steps = self._trace.steps
        packets = sum(math.ceil(words / LANES) for _, _, _, words in steps)
        stats = {
            "mode": self.mode,
            "block": self.block,
            "bytes_per_worker": packets * PAYLOAD_BYTES,
            "header_bytes_per_worker": packets * (FRAME_BYTES - PAYLOAD_BYTES),
            "packets": packets,
            "rounds": self._round,
            "steps": [{"round": r, "op": op, "kind": kind, "words": w} for r, op, kind, w in steps],
            **stats,
            "scale": scale if self.is_float else None,
            "encode_s": self._trace.encode_s,
            "decode_s": self._trace.decode_s,
        }
        exponent = agreed if agreed is not None else self.state.exponent
        state = CodecState(self.state.iteration + 1, union, exponent if self.is_float else None,
                           self.x.numel(), str(self.x.dtype), self.block)
        self._result = WorkerResult(total, stats, state)
