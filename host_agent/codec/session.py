"""One worker's side of an aggregation, driven by a transport: ``WorkerSession``.

Protocol (docs/architecture.md §1), in rounds; each round is one or more *steps*, and each step is one
message whose words every worker sends with the same op and the same length, the transport reduces
(ADD: int32 sum mod 2^32, OR: bitwise or) and every worker receives back. All lengths and decisions
after a round follow from what that round returned, which is identical on every worker.

Every aggregation's first round starts with the *agreement* message (ADD, ``AGREE_WORDS`` words whatever
the parameters, see :mod:`.agreement`): from its sum every worker sees whether each rank took part exactly
once and whether all workers hold the same parameters, and otherwise raises the same AggregationError.
Later messages' lengths depend on those parameters: a transport whose reductions cannot survive
mismatched lengths (torch.distributed) may wait for the agreement's result before sending the rest of
the first round; one that can (the switch) need not.

``sketch``
  1. (only without a size estimate or, for floats, without a known scale) agree; OR header.
  2. (agree;) OR header + index; ADD sketch (one round: no step depends on another's result).
  3. (only if the assumed scale did not hold) ADD the candidates' values at the agreed scale, or
     (only if peeling left a residue) ADD the residue's values. Either way the result is exact.
``union``
  1. (only without a size estimate) agree; OR header.   2. (agree;) OR header + index.
  3. ADD the values of every candidate, in candidate order.
``dense``
  1. agree; OR header, and, when the scale is assumed or the input is int32, ADD the whole quantized
  bucket in the same round.   2. (floats without a known scale, or an assumed scale that did not hold)
  ADD the bucket at the agreed scale.

A sparse mode whose index and sketch (or values), sized from the estimate, would cost at least as much as
the bucket sends it densely instead (``stats["protocol"] == "dense"``). The size estimate is
``expected_items`` if given, else the previous round's union (``CodecState``; an all-zero round leaves it
unknown), else the sum of the workers' item counts. An assumed scale is the previous round's agreed
exponent plus ``headroom`` binades; it stands if no value saturated and it is at most ``headroom +
SCALE_SLACK`` binades coarser than the agreed scale, otherwise the round is redone at the agreed scale.

Driving it (a simple driver)::

    session = WorkerSession(x, rank, world_size, mode="sketch", state=state)
    while (msg := session.next_message()) is not None:
        session.receive(reduce(msg.op, msg.words))     # across all workers
    total, stats, state = session.result()

Threading contract (a transport with an I/O thread): ``receive()`` only stores the reduced words (and
checks the 50-word agreement message), so the I/O thread may call it; when ``can_advance`` is true
(before the first round, and once every message of a round was received) ``advance()`` runs the compute
those results allow: encoding, index queries, peeling, decoding (about 120 ms for a 64 MiB bucket on a
CPU), which a transport runs in a worker thread; after it, ``next_message()`` hands out the next round's
messages (``ready_messages`` of them), which the I/O thread sends. ``next_message()`` calls ``advance()``
itself when it is due, for simple drivers. The three are never to be called concurrently on one
session; ``advance()`` only runs while no message is in flight, so handing the session to the worker
thread and back needs no lock.

A transport may send every message of a round before receiving any result of it (``next_message`` then
returns the next one at once); it raises RuntimeError when the next message depends on a result not yet
received. Every failure the workers agree on (disagreeing workers, integers beyond the bound, an
incomplete support, a sum beyond the output dtype) raises AggregationError, on every worker after the same
round; the session is then ``failed`` and every later call raises the same error. A non-finite input is no
failure: every worker's total is then all NaN (``stats["nonfinite_ranks"]`` names the workers).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import torch

from host_agent.errors import AggregationError
from lhc_ina.constants import FRAME_BYTES, LANES, MAX_JOB_WORKERS, PAYLOAD_BYTES

from . import gpu
from .agreement import parameter_digest
from .cpu import kernels_in_use
from .gpu import to_device
from .items import check_support_indices
from .options import DEFAULT_HEADROOM, Options, is_int
from .output import OutputRange
from .phase_clock import PhaseClock
from .protocol import HOST_KINDS, Outcome, Results, Round, Rounds
from .quantize import FLOAT_DTYPES, INT_DTYPES
from .sketch import DEFAULT_MARGIN, resolve_layout
from .state import BucketShape, CodecState, Message, WorkerResult

_T = TypeVar("_T")
PROTOCOL_VERSION = 4  # part of the agreement digest: workers running different codecs disagree


def check_input(x: torch.Tensor) -> None:
    """Raise unless ``x`` is a non-empty 1-D tensor of a supported dtype."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"inputs must be torch tensors, not {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES + INT_DTYPES:
        raise TypeError(f"input dtype {x.dtype} is not supported (int32, float32, float16 or bfloat16)")
    if x.dim() != 1:
        raise ValueError(f"inputs must be 1-D tensors, not of shape {tuple(x.shape)}")
    if x.numel() == 0:
        raise ValueError("inputs must not be empty")


class WorkerSession:
    """The codec protocol for one worker (see the module docstring).

    ``support``: the element indices of every nonzero of ``x``, if known (encoding then skips the scan);
    it must hold every nonzero: ``check_support`` (default on) verifies that with one pass over ``x``
    (a count of nonzeros) and makes every worker raise AggregationError otherwise; with it off, elements
    outside the support are treated as zero. ``output_range``: ``(lo, hi)`` to decode only elements
    lo..hi-1 (a reduce_scatter's shard): the total is then that slice of the whole one, bit for bit, and
    the messages are those of a whole decode, so workers need not agree on their ranges (:mod:`.output`).
    ``out``: a preallocated output of the range's length (may be ``x`` itself for the whole bucket).
    ``dense_words``: an int32 tensor of ``x``'s length that a dense round of a float32 CPU bucket writes its
    words into instead of a new one (the agent keeps one per bucket between calls); it is overwritten.
    ``state``: the previous aggregation's ``result().state`` for this bucket; one made for another bucket
    shape is ignored (``stats["state_reset"]`` says why). The other options are :class:`Options`.
    """

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
        output_range: tuple[int, int] | None = None,
        out: torch.Tensor | None = None,
        timing: bool = False,
        check_support: bool = True,
        layout: str = "auto",
        kernels: str = "auto",
        count_launches: bool = False,
        dense_words: torch.Tensor | None = None,
    ) -> None:
        check_input(x)
        if not is_int(world_size) or not 1 <= world_size <= MAX_JOB_WORKERS:
            raise ValueError(f"world_size must be an int in 1..{MAX_JOB_WORKERS}, not {world_size!r}")
        if not is_int(rank) or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank!r} is outside 0..{world_size - 1}")
        options = Options(
            mode, block, expected_items, margin, headroom, seed, index, cells, timing, check_support, layout,
            kernels, count_launches,
        )
        # resolved before the digest: workers that resolve it apart disagree at the agreement message
        options = dataclasses.replace(options, layout=resolve_layout(options.layout, x.device))
        self._path = gpu.choose_path(x.device, options.kernels)
        output = OutputRange.of(output_range, x.numel())
        if out is not None and (out.shape != (output.size,) or out.dtype != x.dtype
                                or out.device != x.device):
            raise ValueError("out must have the output range's length (the whole input's), dtype and device")
        if dense_words is not None and (dense_words.shape != (x.numel(),) or dense_words.dtype != torch.int32
                                        or dense_words.device != x.device):
            raise ValueError("dense_words must be an int32 tensor of the input's length, on its device")
        if support is not None:
            check_support_indices(support, x.numel())
            if not check_support:
                # "Outside the support counts as zero" must hold in every round and mode: later rounds
                # read candidates' values, which may lie outside this worker's support.
                at = support.to(x.device, torch.int64)
                x = torch.zeros_like(x).index_put_((at,), x[at])
        if state is not None and not isinstance(state, CodecState):
            raise TypeError(f"state must be a CodecState or None, not {type(state).__name__}")
        shape = BucketShape(x.numel(), str(x.dtype).removeprefix("torch."), block)
        state = state or CodecState()
        reset = state.mismatch(shape)
        if reset:
            state = CodecState()
        self.x, self.rank, self.world_size, self.options, self.state = x, rank, world_size, options, state
        digest = parameter_digest(("lhc-codec", PROTOCOL_VERSION, world_size, shape, options.shared(), state))
        self._clock = PhaseClock(timing, x.device)
        self._launches = gpu.LaunchCounter(x.device) if count_launches else None
        self._rounds = Rounds(x, rank, world_size, options, state, digest, shape, support, out, output,
                              self._clock, triton=self._path == "triton", dense_words=dense_words)
        if reset:
            self._rounds.stats["state_reset"] = reset
        self._next: Round | None = None  # the round whose results are being collected
        self._started = False
        self._round = 0
        self._outbox: deque[Message] = deque()
        self._awaiting: deque[Message] = deque()
        self._results: Results = {}
        self._steps: list[tuple[int, str, str, int]] = []  # (round, op, kind, words) of every message
        self._result: WorkerResult | None = None
        self._error: AggregationError | None = None

    # --- driving -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """Whether the result is ready."""
        return self._result is not None

    @property
    def failed(self) -> bool:
        return self._error is not None

    @property
    def error(self) -> AggregationError | None:
        """The error the aggregation failed with, if it did."""
        return self._error

    @property
    def can_advance(self) -> bool:
        """Whether ``advance()`` has compute to run now: before the first round, or once every message
        of the current round was received."""
        if self._error is not None or self._result is not None:
            return False
        return not self._started or (not self._awaiting and not self._outbox)

    @property
    def ready_messages(self) -> int:
        """How many messages ``next_message()`` hands out now without computing or waiting: all of a
        round's, once ``advance()`` has made it."""
        return len(self._outbox)

    def next_message(self) -> Message | None:
        """The next message to send, or None when the aggregation is complete."""
        self._raise_if_failed()
        if not self._outbox and self.can_advance:
            self.advance()
        if self._outbox:
            msg = self._outbox.popleft()
            self._awaiting.append(msg)
            return msg
        if self._awaiting:
            raise RuntimeError("the next message depends on the aggregate of a pending one: receive() first")
        return None

    def receive(self, words: torch.Tensor) -> None:
        """Store the aggregate (across all workers) of the oldest message sent and not yet received.

        Cheap (no decoding), so a transport's I/O thread may call it; only the agreement message is
        checked here, so that workers that disagree fail before anything else is waited for.
        """
        self._raise_if_failed()
        if not self._awaiting:
            raise RuntimeError("receive() without a pending message")
        msg = self._awaiting[0]
        if not isinstance(words, torch.Tensor) or words.dtype != torch.int32 or words.dim() != 1:
            raise TypeError("the aggregate must be a 1-D int32 tensor")
        if words.numel() != msg.words.numel():
            raise ValueError(f"aggregate of {words.numel()} words for a message of {msg.words.numel()}")
        self._awaiting.popleft()
        if msg.kind == "agree":
            self._guarded(self._rounds.agreement, words)
        self._results[msg.kind] = words

    def advance(self) -> bool:
        """Run the compute the received results allow (see the threading contract in the module
        docstring); returns False if there was none to run."""
        self._raise_if_failed()
        if not self.can_advance:
            return False
        with gpu.path(self._path):
            if not self._started:
                self._started = True
                with gpu.counting(self._launches, "encode"):
                    step = self._guarded(self._rounds.start)
            else:
                assert self._next is not None
                # what is read on the host (the agreement, the header) stays where it is
                with gpu.counting(self._launches, "transfer"):
                    results = {kind: to_device(words, self.x.device) for kind, words in self._results.items()
                               if kind not in HOST_KINDS}
                self._rounds.received, self._results = self._results, {}
                with gpu.counting(self._launches, "decode"):
                    step = self._guarded(self._next.then, results)
        if isinstance(step, Outcome):
            self._next = None
            self._finish(step)
        else:
            self._queue(step)
        return True

    def result(self) -> WorkerResult:
        """The aggregated total (the input's dtype), the stats and the bucket's next CodecState."""
        self._raise_if_failed()
        if self._result is None:
            raise RuntimeError("the aggregation is not complete")
        return self._result

    # --- internals -------------------------------------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _guarded(self, fn: Callable[..., _T], *args: object) -> _T:
        """Call ``fn``; any failure puts the session in the failed state as an AggregationError."""
        try:
            return fn(*args)
        except AggregationError as exc:
            self._error = exc
            raise
        except Exception as exc:  # a local failure (a bug, out of memory): the other workers cannot know
            self._error = AggregationError(f"worker {self.rank} failed: {exc!r}", (self.rank,))
            raise self._error from exc

    def _queue(self, step: Round) -> None:
        self._round += 1
        self._next = step
        kept = [t.untyped_storage().data_ptr() for t in (self._rounds.x, self._rounds.out) if t is not None]
        for op, kind, words in step.messages:
            scratch = words.untyped_storage().data_ptr() not in kept  # an int32 bucket is its own words
            msg = Message(op, words.reshape(-1), self._round, kind, scratch)
            self._steps.append((self._round, op.name, kind, msg.words.numel()))
            self._outbox.append(msg)

    def _finish(self, outcome: Outcome) -> None:
        packets = sum(math.ceil(words / LANES) for _, _, _, words in self._steps)
        seconds = self._clock.seconds if self._clock.enabled else {"encode": None, "decode": None}
        stats = {
            "mode": self.options.mode,
            "block": self.options.block,
            "bytes_per_worker": packets * PAYLOAD_BYTES,
            "header_bytes_per_worker": packets * (FRAME_BYTES - PAYLOAD_BYTES),
            "packets": packets,
            "rounds": self._round,
            "steps": [{"round": r, "op": op, "kind": kind, "words": w} for r, op, kind, w in self._steps],
            **outcome.stats,
            "encode_s": seconds["encode"],
            "decode_s": seconds["decode"],
            "stage_s": dict(self._clock.stages) if self._clock.enabled else None,
            "kernels": "triton" if self._path == "triton" else kernels_in_use(self.x.device.type),
            "layout": self.options.layout,
            "gpu_launches": None if self._launches is None else dict(self._launches.counts),
        }
        self._result = WorkerResult(outcome.total, stats, outcome.state)
