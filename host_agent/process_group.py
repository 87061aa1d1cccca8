"""The ``process_group`` backend: the same codec over torch.distributed, for clusters with no P4 switch.

ADD words go through ``all_reduce(SUM)`` on int32, which wraps mod 2^32 on Gloo and NCCL alike (the
codec relies on that, as it does on the switch's modular ADD). OR words need an exact bitwise OR:

- Gloo has ``ReduceOp.BOR``: one all_reduce, no extra bytes;
- elsewhere (NCCL) the cheaper of two exact schemes, by bytes: an all_gather of every worker's words and a
  local OR (W times the bytes), or *bit lanes*: each bit widened to a lane of ``ceil(log2(W + 1))`` bits
  so that a SUM cannot carry between lanes, then every nonzero lane read back as a 1 (``32 / (32 //
  lane)`` times the bytes: 2x at W = 2, 3.2x at W = 4, 4x at W = 8).

A round's messages go as **one collective** where they can (:meth:`ProcessGroupBackend.reduce_round`):
every collective waits for the slowest rank to reach it, which on shared cores costs more than its bytes.
The ADD messages are laid end to end in one int32 SUM, and short OR messages (a header, up to
``PACKED_OR_MAX_WORDS`` words) ride in it as bit lanes; a long OR message (an index) keeps a collective of
its own, and so does a long ADD whose words are the codec's scratch (``Message.scratch``), reduced in
place. A dense bucket's round is then a short SUM (its header and seal) and the bucket's own sum, in
place, as DDP's allreduce; on Gloo that sum may move its words packed (``host_agent.long_sum``: the same
sum in 68-79% of the bytes on VGG19's and BERT-base's gradients, where the ranks measured that faster),
on NCCL it is one allreduce.

A short SUM (an agreement, a header and seal, a policy's or a vote's few words) goes as one all-to-all
instead of a ring allreduce (:meth:`ProcessGroupBackend._sum_by_exchange`): what such a collective costs
is its latency, and the ring's 2(W - 1) hops one after another are one hop when every rank sends its words
to every other at once and adds what it gets (the same sum mod 2^32).

Collectives run on a process group of their own, so the agent's calls never interleave with DDP's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import Future

import torch
import torch.distributed as dist

from host_agent.agent_backend import Backend
from host_agent.codec.arith import add_int32
from host_agent.codec.gpu import to_host
from host_agent.long_sum import LongSum, packing_from_environment
from lhc_ina.constants import Op

#: OR messages up to this many words join a round's one SUM as bit lanes (at most 32x their bytes, W = 1024:
#: small beside the collective they save); longer ones keep a collective of their own.
PACKED_OR_MAX_WORDS = 1024
#: A scratch ADD message longer than this (a dense bucket, a large sketch) has a collective of its own, in
#: place: packing it would copy it, which on shared cores costs more than the collective it saves.
PACKED_ADD_MAX_WORDS = 1 << 16
#: A SUM whose words times the world size are at most this many goes as an all-to-all (64 KiB sent per
#: rank at most): one hop instead of a ring's 2(W - 1), where latency, not bytes, is its cost.
EXCHANGE_SUM_MAX_WORDS = 1 << 14


def bit_lane_width(world_size: int) -> int:
    """Bits per lane so that W ones summed never carry into the next lane."""
    return max(1, math.ceil(math.log2(world_size + 1)))


def or_scheme(world_size: int, has_bor: bool) -> str:
    """How OR words are reduced: ``bor``, ``all_gather`` or ``bit_lanes`` (fewest bytes wins)."""
    if has_bor:
        return "bor"
    lane = bit_lane_width(world_size)
    return "all_gather" if world_size <= 32 / (32 // lane) else "bit_lanes"


def spread_bits(words: torch.Tensor, lane: int) -> torch.Tensor:
    """Each bit of the int32 ``words`` into its own ``lane``-bit field of int32 carrier words."""
    per_word = 32 // lane
    bits = (words.to(torch.int64).unsqueeze(1) >> torch.arange(32)) & 1  # (n, 32)
    bits = torch.nn.functional.pad(bits.reshape(-1), (0, (-bits.numel()) % per_word)).reshape(-1, per_word)
    shifts = torch.arange(per_word) * lane
    return (bits << shifts).sum(1).to(torch.int64).to(torch.int32)


def gather_bits(summed: torch.Tensor, lane: int, n_words: int) -> torch.Tensor:
    """Inverse of :func:`spread_bits` after a SUM: a bit is set where any worker's lane was 1."""
    per_word = 32 // lane
    shifts = torch.arange(per_word) * lane
    lanes = (summed.to(torch.int64).unsqueeze(1) >> shifts) & ((1 << lane) - 1)
    bits = (lanes != 0).to(torch.int64).reshape(-1)[: n_words * 32].reshape(n_words, 32)
    value = (bits << torch.arange(32)).sum(1)
    return (value - ((value >> 31) << 32)).to(torch.int32)  # back to two's complement int32


class ProcessGroupBackend(Backend):
    """Reduce codec messages with torch.distributed collectives over a dedicated process group."""

    path = "host"
    waits_for_agreement = True  # collectives of different lengths across ranks hang or fail

    def __init__(self, group: dist.ProcessGroup | None = None, *, device: torch.device | None = None,
                 packing: str | None = None) -> None:
        """``group``: a process group of its own (default: a new one on the default backend). ``device``:
        where its collectives run (default: CUDA for NCCL, else the CPU); the ``lhc`` torch.distributed
        backend passes both for the Gloo or NCCL group it keeps for the codec, which is registered
        nowhere (so only the group's own methods are called here, never ``dist.*`` with ``group=``).
        ``packing``: how a long scratch SUM goes on the CPU (``host_agent.long_sum``: ``measured``,
        ``always`` packed or ``never``; default ``LHC_PACKING``, else measured); on CUDA it is one
        allreduce."""
        if group is None:
            if not dist.is_initialized():
                raise RuntimeError("torch.distributed is not initialized: call init_process_group first")
            group = dist.new_group(backend=dist.get_backend())
        if device is None:
            nccl = dist.get_backend(group) == "nccl"
            device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
        self.group = group
        self.rank = group.rank()
        self.world_size = group.size()
        self.device = device
        self.scheme = or_scheme(self.world_size, has_bor=device.type == "cpu")  # Gloo; NCCL has no BOR
        packing = packing or packing_from_environment()
        on_gloo = device.type == "cpu" and self.world_size > 1
        self._long_sums = LongSum(group, packing) if on_gloo else None

    def reduce(self, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        self._check_settled()
        words = self._host_words(words)
        if op == Op.ADD:
            return self._all_reduce(words.clone(), dist.ReduceOp.SUM, lambda t: t)
        if self.scheme == "bor":
            return self._all_reduce(words.clone(), dist.ReduceOp.BOR, lambda t: t)
        if self.scheme == "bit_lanes":
            lane = bit_lane_width(self.world_size)
            n = words.numel()
            return self._all_reduce(spread_bits(words.cpu(), lane).to(self.device), dist.ReduceOp.SUM,
                                    lambda t: gather_bits(t.cpu(), lane, n).to(self.device))
        gathered = [torch.empty_like(words) for _ in range(self.world_size)]
        work = self.group.allgather([gathered], [words])
        return self._complete(work, lambda: _or_all(gathered))

    def reduce_round(self, messages: list[tuple[Op, torch.Tensor]],
                     scratch: Sequence[bool] = ()) -> list[Future[torch.Tensor]]:
        """The round's messages summed in one collective, in the round's order (ORs as bit lanes), but
        for two kinds that each keep a collective of their own, after it: a long ADD whose words are
        ``scratch``, reduced in place (a dense bucket's words, as DDP reduces its bucket: no copy), and a
        long OR. Every rank packs alike: the lengths and ops of a round's messages are agreed (the
        agreement message came first), and so is which are scratch (the codec's own words, by mode and
        dtype). The long scratch ADDs go last, after every other collective of the round is issued: their
        packed sums issue theirs from another thread."""
        self._check_settled()
        scratch = list(scratch) + [False] * (len(messages) - len(scratch))
        alone = [op == Op.ADD and spare and words.numel() > PACKED_ADD_MAX_WORDS and self._as_is(words)
                 for (op, words), spare in zip(messages, scratch, strict=True)]
        packed = [i for i, (op, words) in enumerate(messages)
                  if not alone[i] and (op == Op.ADD or words.numel() <= PACKED_OR_MAX_WORDS)]
        futures: list[Future[torch.Tensor] | None] = [None] * len(messages)
        if len(packed) > 1:
            for i, future in zip(packed, self._reduce_packed([messages[i] for i in packed]), strict=True):
                futures[i] = future
        for i, (op, words) in enumerate(messages):
            if futures[i] is None and not alone[i]:
                futures[i] = self.reduce(op, words)
        for i, (_, words) in enumerate(messages):
            if alone[i]:
                futures[i] = self._long_sum(words)
        return futures  # type: ignore[return-value]

    def counters(self) -> dict[str, int]:
        """Long sums' words, packed and plain, and the packed bytes this rank sent."""
        return dict(self._long_sums.counters) if self._long_sums is not None else {}

    def close(self) -> None:
        if self._long_sums is not None:
            self._long_sums.close()

    def _long_sum(self, words: torch.Tensor) -> Future[torch.Tensor]:
        """A long scratch ADD summed in place: by :class:`LongSum` on Gloo, one allreduce otherwise."""
        if self._long_sums is not None:
            return self._long_sums.start(words)
        return self._all_reduce(words, dist.ReduceOp.SUM, lambda t: t)

    def _check_settled(self) -> None:
        """Refuse to issue a collective while a long sum's are still in flight (``LongSum.check_settled``)."""
        if self._long_sums is not None:
            self._long_sums.check_settled()

    def _reduce_packed(self, messages: list[tuple[Op, torch.Tensor]]) -> list[Future[torch.Tensor]]:
        """``messages`` laid end to end in one int32 SUM (ORs as bit lanes): one future each."""
        lane = bit_lane_width(self.world_size)
        parts = [self._host_words(words) for _, words in messages]
        pieces = [words if op == Op.ADD else spread_bits(words.cpu(), lane).to(self.device)
                  for (op, _), words in zip(messages, parts, strict=True)]
        summed = self._all_reduce(torch.cat(pieces), dist.ReduceOp.SUM, lambda t: t)  # Gloo sums in place
        futures, start = [], 0
        for (op, _), words, piece in zip(messages, parts, pieces, strict=True):
            lo, hi, n = start, start + piece.numel(), words.numel()
            start = hi
            if op == Op.ADD:
                futures.append(_then(summed, lambda t, lo=lo, hi=hi: t[lo:hi]))
            else:
                futures.append(_then(summed, lambda t, lo=lo, hi=hi, n=n:
                                     gather_bits(t[lo:hi].cpu(), lane, n).to(self.device)))
        return futures

    def _as_is(self, words: torch.Tensor) -> bool:
        """Whether ``words`` reach the collective as they are (int32, contiguous, on its device)."""
        return words.dtype == torch.int32 and words.is_contiguous() and words.device == self.device

    def _host_words(self, words: torch.Tensor) -> torch.Tensor:
        """``words`` as int32 on the group's device (a GPU bucket's words cross to the host for Gloo)."""
        if words.device.type == "cuda" and self.device.type == "cpu":
            words = to_host(words.detach())
        return words.to(self.device, torch.int32).contiguous()

    def _all_reduce(self, tensor: torch.Tensor, op: dist.ReduceOp, finish) -> Future[torch.Tensor]:
        short = tensor.numel() * self.world_size <= EXCHANGE_SUM_MAX_WORDS
        if op == dist.ReduceOp.SUM and self.world_size > 1 and short:
            return self._sum_by_exchange(tensor, finish)
        options = dist.AllreduceOptions()
        options.reduceOp = op
        work = self.group.allreduce([tensor], options)
        return self._complete(work, lambda: finish(tensor))

    def _sum_by_exchange(self, tensor: torch.Tensor, finish) -> Future[torch.Tensor]:
        """A short int32 SUM in place as one all-to-all: every rank's words to every rank, added here."""
        sent = tensor.repeat(self.world_size)
        got = torch.empty_like(sent)
        work = self.group.alltoall_base(got, sent, [], [], dist.AllToAllOptions())

        def summed() -> torch.Tensor:
            tensor.copy_(add_int32(list(got.view(self.world_size, -1))))
            return finish(tensor)

        return self._complete(work, summed)

    @staticmethod
    def _complete(work: dist.Work, value) -> Future[torch.Tensor]:
        result: Future[torch.Tensor] = Future()

        def done(collective: torch.futures.Future) -> None:
            try:
                collective.value()  # raises what the collective raised
                result.set_result(value())
            except Exception as exc:  # surfaced to the caller of reduce()
                result.set_exception(exc)

        work.get_future().add_done_callback(done)
        return result


def _then(future: Future[torch.Tensor], part) -> Future[torch.Tensor]:
    """A future of ``part(result)`` once ``future`` completes (its exception if it fails)."""
    result: Future[torch.Tensor] = Future()

    def done(whole: Future[torch.Tensor]) -> None:
        try:
            result.set_result(part(whole.result()))
        except Exception as exc:
            result.set_exception(exc)

    future.add_done_callback(done)
    return result


def _or_all(tensors: list[torch.Tensor]) -> torch.Tensor:
    out = tensors[0].clone()
    for tensor in tensors[1:]:
        out |= tensor
    return out
