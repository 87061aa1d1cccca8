"""A long int32 SUM over a Gloo process group, as one allreduce or with its words packed
(``codec.word_packing``), whichever the ranks measured faster: the same sum mod 2^32 either way.

A dense bucket's words use 20 to 26 of their 32 bits, and where the link is slow the bytes are the cost:
a ring allreduce moves every word 2(W - 1)/W times. The packed sum moves the same share in packed form:

1. **reduce-scatter**: the words are cut into W shards (whole blocks); each rank packs every shard but its
   own and sends shard j to rank j in one all-to-all (the packed sizes go first, in an all-to-all of
   their own); rank j adds what it received into its own shard, unpacking as it adds;
2. **all-gather**: each rank packs its summed shard; the sizes go round, then one all-gather of the
   packed shards (padded to the largest), which every rank unpacks into place.

Packing costs CPU (about 3.3 ns per word per rank: 2.5 passes of the ~1.3 ns a timing script measured
for one) and saves bytes (21-32% on VGG19's and BERT-base's gradients), so it wins on a slow link and
loses where bytes are cheap (on loopback it was 2x slower than one allreduce). Hence
``packing="measured"``: before each sum of at least :data:`MIN_MEASURED_WORDS` the ranks agree which way
it goes, in one all-to-all of what each measured (:func:`choose_packing`): the first :data:`TRIAL_SUMS`
alternate the two ways, then the faster per word (each rank's fastest of its last :data:`KEPT` of each
way, summed over the ranks) takes the sums, and every :data:`REFRESH_EVERY`-th goes the other way to
measure it again.

The collectives run one after another on a thread of this object's own, so the agent's thread goes on
(encoding the next bucket) while they do; the agent issues no other collective before the sum's future
completes (``check_settled`` refuses one that would), so every rank issues the same collectives in the
same order. The ranks' ``packing`` settings are compared at the first long sum: ranks that differ would
issue different collectives, so every rank raises the same error instead.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from itertools import pairwise

import torch
import torch.distributed as dist

from host_agent.codec import word_packing
from host_agent.errors import AggregationError

#: How a long sum goes: ``measured`` (agreed per sum from timings), ``always`` packed, ``never`` (one
#: allreduce, the way NCCL's group always takes).
PACKING_CHOICES = ("measured", "always", "never")
#: The environment variable that sets it for every process-group codec of a process (default measured).
PACKING_VARIABLE = "LHC_PACKING"
#: Shorter sums are one allreduce without a vote: packing saves them less than the vote costs.
MIN_MEASURED_WORDS = 1 << 20
#: The first measured sums alternate packed and plain (packed first), to time both.
TRIAL_SUMS = 4
#: After the trials, every this-many-th measured sum goes the way not chosen, to time it again.
REFRESH_EVERY = 32
#: Timings each rank keeps per way; its fastest of them is what it reports.
KEPT = 4
#: How long ``close`` waits for an idle thread to end (it ends at once; a bound, not a pause).
CLOSE_TIMEOUT_S = 10.0
#: A rank's cost per word reaches the vote as an integer: picoseconds.
_PICOSECONDS = 1e12


def packing_from_environment() -> str:
    """``LHC_PACKING``'s choice, checked; ``measured`` where it is unset."""
    packing = os.environ.get(PACKING_VARIABLE, "measured")
    if packing not in PACKING_CHOICES:
        raise ValueError(f"{PACKING_VARIABLE} must be one of {', '.join(PACKING_CHOICES)}, not {packing!r}")
    return packing


def choose_packing(number: int, packed_ps: int, plain_ps: int) -> bool:
    """Whether measured sum ``number`` (counted from 0, the same on every rank) goes packed, given the
    ranks' summed costs per word of each way (0 where one was never timed): a function of agreed numbers
    only, so every rank chooses alike."""
    if number < TRIAL_SUMS or not packed_ps or not plain_ps:
        return number % 2 == 0
    faster_packed = packed_ps < plain_ps
    refresh = (number - TRIAL_SUMS) % REFRESH_EVERY == REFRESH_EVERY - 1
    return faster_packed != refresh


class LongSum:
    """Sums long int32 messages over ``group`` (Gloo, CPU tensors) in place, packed or as one allreduce
    (``packing``, one of :data:`PACKING_CHOICES`)."""

    def __init__(self, group: dist.ProcessGroup, packing: str = "measured") -> None:
        if packing not in PACKING_CHOICES:
            raise ValueError(f"packing must be one of {', '.join(PACKING_CHOICES)}, not {packing!r}")
        self.group = group
        self.rank = group.rank()
        self.world_size = group.size()
        self.packing = packing
        # A daemon thread: a sum stranded by a peer that died must not hold the process at exit until Gloo's
        # timeout (an executor's threads are joined at exit). Such a process ends at once instead, though
        # not always cleanly: with the thread inside Gloo's wait, its exit may abort (rc 134, measured).
        self._work: queue.SimpleQueue[tuple[Future[torch.Tensor], torch.Tensor] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="lhc-long-sum", daemon=True)
        self._thread.start()
        self._agreed = False
        self._buffers: dict[str, torch.Tensor] = {}
        self._pending: Future[torch.Tensor] | None = None
        self._measured = 0
        self._timings: dict[bool, deque[float]] = {True: deque(maxlen=KEPT), False: deque(maxlen=KEPT)}
        #: for the stats (``Backend.counters``): words summed packed and plain, packed bytes this rank sent
        self.counters = {"packed_words": 0, "packed_bytes_sent": 0, "plain_words": 0}

    def start(self, words: torch.Tensor) -> Future[torch.Tensor]:
        """Sum ``words`` (1-D contiguous int32 on the CPU, this call's own) across the group, in place;
        the future holds ``words`` once every rank's are added in."""
        self._pending = Future()
        self._work.put((self._pending, words))
        return self._pending

    def check_settled(self) -> None:
        """Before another collective is issued on the group: the last sum's collectives are all done. The
        agent waits for a round's futures before it issues more, so a sum still in flight means a caller
        that gave up on it (a deadline passed); another collective now could pair with one of the sum's on
        a peer, so it is refused instead."""
        if self._pending is not None and not self._pending.done():
            raise AggregationError(f"rank {self.rank}: a long sum over the process group is still in flight; "
                                   "no other collective may start before it ends", (self.rank,))

    def close(self) -> None:
        """Stop the thread; wait for it unless a sum is stranded in flight (then it is left to the exit)."""
        self._work.put(None)
        if self._pending is None or self._pending.done():
            self._thread.join(timeout=CLOSE_TIMEOUT_S)

    def _serve(self) -> None:
        while (job := self._work.get()) is not None:
            future, words = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self._sum(words))
                except Exception as exc:  # surfaced to the caller through the future
                    future.set_exception(exc)

    def _sum(self, words: torch.Tensor) -> torch.Tensor:
        if not self._agreed:
            self._agree_packing()
        packed = self._choose(words.numel())
        started = time.perf_counter()
        if packed:
            self._packed_sum(words)
        else:
            self._wait(self.group.allreduce([words], dist.AllreduceOptions()))
        if self.packing == "measured" and words.numel() >= MIN_MEASURED_WORDS:
            self._timings[packed].append((time.perf_counter() - started) / words.numel())
        self.counters["packed_words" if packed else "plain_words"] += words.numel()
        return words

    def _agree_packing(self) -> None:
        """At the first long sum, every rank's ``packing`` compared (one all-to-all of a word): ranks that
        differ would go on to issue different collectives, so every rank raises the same error instead."""
        modes = self._exchange([PACKING_CHOICES.index(self.packing)] * self.world_size)
        if len(set(modes)) > 1:
            named = ", ".join(f"rank {rank} {PACKING_CHOICES[mode]}" for rank, mode in enumerate(modes))
            raise AggregationError(f"the ranks' {PACKING_VARIABLE} differ ({named}): set it alike on every "
                                   "rank", tuple(range(self.world_size)))
        self._agreed = True

    def _choose(self, n: int) -> bool:
        """Whether this sum goes packed: agreed with every rank where it is measured."""
        if self.packing != "measured":
            return self.packing == "always"
        if n < MIN_MEASURED_WORDS:
            return False
        mine = [round(min(self._timings[way], default=0.0) * _PICOSECONDS) for way in (True, False)]
        votes = self._exchange(mine * self.world_size, per_rank=2)
        number, self._measured = self._measured, self._measured + 1
        return choose_packing(number, sum(votes[0::2]), sum(votes[1::2]))

    def _packed_sum(self, words: torch.Tensor) -> None:
        bounds = shard_bounds(words.numel(), self.world_size)
        shards = [words[lo:hi] for lo, hi in pairwise(bounds)]
        mine = shards[self.rank]

        # 1. reduce-scatter: shard j, packed, to rank j (ours stays); add what comes in into ours
        capacities = [word_packing.capacity(shard.numel()) for shard in shards]
        send = self._buffer("send", sum(capacities))
        sizes, offset = [], 0
        for rank, shard in enumerate(shards):
            size = 0 if rank == self.rank else word_packing.pack(shard, send[offset:]).numel()
            sizes.append(size)
            offset += size
        incoming = self._exchange(sizes)
        received = self._buffer("received", sum(incoming))
        self._wait(self.group.alltoall_base(received, send[:offset], incoming, sizes, dist.AllToAllOptions()))
        start = 0
        for rank, size in enumerate(incoming):
            if rank != self.rank:
                word_packing.unpack(received[start:start + size], mine.numel(), mine, add=True)
            start += size

        # 2. all-gather: our summed shard, packed, to every rank; each unpacked into place
        own = self._buffer("own", max(capacities))
        own_size = word_packing.pack(mine, own).numel()
        summed_sizes = self._exchange([own_size] * self.world_size)
        widest = max(summed_sizes)
        own[own_size:widest] = 0  # the padding on the wire: zeros, not what the buffer held
        gathered = self._buffer("gathered", widest * self.world_size).view(self.world_size, widest)
        self._wait(self.group.allgather([list(gathered)], [own[:widest]]))
        for rank, shard in enumerate(shards):
            if rank != self.rank:
                word_packing.unpack(gathered[rank, :summed_sizes[rank]], shard.numel(), shard)
        self.counters["packed_bytes_sent"] += offset + widest * (self.world_size - 1)

    def _exchange(self, sent: list[int], per_rank: int = 1) -> list[int]:
        """``sent[j * per_rank:(j + 1) * per_rank]`` to rank j; what every rank sent here, in rank order."""
        out = torch.empty(self.world_size * per_rank, dtype=torch.int64)
        self._wait(self.group.alltoall_base(out, torch.tensor(sent, dtype=torch.int64), [], [],
                                            dist.AllToAllOptions()))
        return out.tolist()

    def _buffer(self, name: str, size: int) -> torch.Tensor:
        """``size`` bytes kept between sums: a new buffer per call is paged in and zeroed again."""
        if name not in self._buffers or self._buffers[name].numel() < size:
            self._buffers[name] = torch.empty(size, dtype=torch.uint8)
        return self._buffers[name][:size]

    @staticmethod
    def _wait(work: dist.Work) -> None:
        work.wait()


def shard_bounds(n: int, parts: int) -> list[int]:
    """Cuts of ``n`` words into ``parts`` shards of whole blocks, as equal as blocks allow: parts + 1
    bounds from 0 to n."""
    blocks = -(-n // word_packing.BLOCK_WORDS)
    return [min(n, (blocks * i // parts) * word_packing.BLOCK_WORDS) for i in range(parts + 1)]
