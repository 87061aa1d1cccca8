"""The worker's API: aggregate a bucket exactly, through the switch, a process group or memory.

    agent = Agent.join(controller="127.0.0.1:9560", job="train")      # rank, slots, epoch from there
    result = agent.allreduce(gradient, key="bucket-0")                # mode "auto" by default
    result.total, result.stats["mode"], result.stats["bytes_sent"]
    future = agent.allreduce_async(other, key="bucket-1")             # concurrent.futures.Future
    agent.close()

Calls run one at a time, in call order, on the agent's own thread: every worker must make the same calls
in the same order (as DDP's buckets are), and every message they produce then meets its peers' on the
wire. The codec state of each ``key`` (the bucket's size estimate and scale) is kept between calls.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from host_agent.agreement import agreement_words, check_agreement, digest
from host_agent.auto import LINK_AGREE_EVERY, agreed_link, choose_mode, link_words
from host_agent.backend import Backend, LinkEstimate
from host_agent.codec import MODES, CodecState, WorkerSession
from host_agent.errors import AggregationError
from lhc_ina.constants import FRAME_BYTES, LANES, Op

AGENT_MODES = (*MODES, "auto")


@dataclass
class AllreduceResult:
    """The exact sum (the input's dtype; floats dequantized at the agreed scale) and what it cost."""

    total: torch.Tensor
    stats: dict[str, Any]


class Agent:
    """One worker's aggregation endpoint over any :class:`~host_agent.backend.Backend`."""

    def __init__(self, backend: Backend, *, mode: str = "auto", block: int = 1, **codec_options: Any) -> None:
        if mode not in AGENT_MODES:
            raise ValueError(f"mode must be one of {AGENT_MODES}, not {mode!r}")
        self.backend = backend
        self.rank = backend.rank
        self.world_size = backend.world_size
        self.mode = mode
        self.block = block
        self.codec_options = codec_options
        self.states: dict[Hashable, CodecState] = {}
        self.last_stats: dict[str, Any] | None = None
        self._calls = 0
        self._link: LinkEstimate | None = None
        self._failure: AggregationError | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lhc-agent-{self.rank}")

    @classmethod
    def join(cls, controller: str, job: str, *, mode: str = "auto", block: int = 1,
             codec_options: dict[str, Any] | None = None, **switch_options: Any) -> Agent:
        """Join ``job`` on the controller and aggregate through the switch. ``switch_options`` go to
        :meth:`host_agent.transport.switch.SwitchBackend.join` (address, token, timeouts, impairment)."""
        from host_agent.transport.switch import SwitchBackend

        backend = SwitchBackend.join(controller, job, **switch_options)
        return cls(backend, mode=mode, block=block, **(codec_options or {}))

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.backend.close()

    def state_dict(self) -> dict[str, Any]:
        """What decides the results of later calls: the codec state per key, the call count (link
        agreements fall on fixed calls) and the agreed link estimate. Identical on every worker."""
        link = None if self._link is None else (self._link.rtt_s, self._link.bytes_per_s)
        states = {key: dataclasses.astuple(s) for key, s in self.states.items()}
        return {"codec_states": states, "calls": self._calls, "link": link}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.states = {key: CodecState(*fields) for key, fields in state["codec_states"].items()}
        self._calls = state["calls"]
        self._link = None if state["link"] is None else LinkEstimate(*state["link"])

    def allreduce(self, tensor: torch.Tensor, *, mode: str | None = None, key: Hashable | None = None,
                  block: int | None = None) -> AllreduceResult:
        """The exact sum of ``tensor`` over all workers (see :meth:`allreduce_async`)."""
        return self.allreduce_async(tensor, mode=mode, key=key, block=block).result()

    def allreduce_async(self, tensor: torch.Tensor, *, mode: str | None = None, key: Hashable | None = None,
                        block: int | None = None) -> Future[AllreduceResult]:
        """Start aggregating ``tensor`` (any shape; int32 exactly, floats at one agreed power-of-two
        scale). ``key`` names the bucket whose codec state carries over (default: its size and dtype)."""
        mode = mode or self.mode
        if mode not in AGENT_MODES:
            raise ValueError(f"mode must be one of {AGENT_MODES}, not {mode!r}")
        key = (tensor.numel(), tensor.dtype) if key is None else key
        return self._executor.submit(self._allreduce, tensor, mode, key, block or self.block)

    # --- the agent's thread -----------------------------------------------------------------------
    def _allreduce(self, tensor: torch.Tensor, mode: str, key: Hashable, block: int) -> AllreduceResult:
        if self._failure is not None:
            raise self._failure
        call, self._calls = self._calls, self._calls + 1
        state = self.states.get(key)
        reason = f"mode {mode} requested"
        if mode == "auto":
            if call % LINK_AGREE_EVERY == 0:
                self._agree_link()
            choice = choose_mode(tensor.numel(), self.world_size, block, state, self._link)
            mode, reason = choice.mode, choice.reason
        counters_before = self.backend.counters()
        # Phase times for the stats; on a GPU they would cost a synchronize per phase, so only on request.
        options = {"timing": tensor.device.type == "cpu", **self.codec_options}
        session = WorkerSession(tensor.reshape(-1), self.rank, self.world_size, mode=mode, block=block,
                                state=state, **options)
        parameters = {"elements": tensor.numel(), "dtype": str(tensor.dtype), "mode": mode, "block": block,
                      "world_size": self.world_size, **self.codec_options}
        value = digest(**parameters)
        network_s, words, rounds, messages, packets = 0.0, 0, 0, 0, 0
        while batch := session.next_round():
            started = time.perf_counter()
            check = self.backend.reduce(Op.ADD, agreement_words(self.rank, value)) if rounds == 0 else None
            futures = [self.backend.reduce(message.op, message.words) for message in batch]
            if check is not None:
                self._check(check, value, parameters)
            results = [future.result() for future in futures]
            network_s += time.perf_counter() - started
            words += sum(message.words.numel() for message in batch)
            packets += sum(-(-message.words.numel() // LANES) for message in batch)
            rounds += 1
            messages += len(batch)
            for words_back in results:
                session.receive(words_back)
        total, codec_stats, self.states[key] = session.result()
        counters = {name: value - counters_before.get(name, 0)
                    for name, value in self.backend.counters().items()}
        stats = {
            "mode": mode,
            "mode_reason": reason,
            "elements": tensor.numel(),
            "rounds": rounds,
            "messages": messages,
            "words_sent": words,
            "bytes_sent": packets * FRAME_BYTES,
            "bytes_received": packets * FRAME_BYTES,
            "packets": packets,
            "retransmissions": counters.get("retransmissions", 0),
            "encode_s": codec_stats.get("encode_s", 0.0),
            "network_s": network_s,
            "decode_s": codec_stats.get("decode_s", 0.0),
            "codec": codec_stats,
            "transport": counters,
        }
        self.last_stats = stats
        return AllreduceResult(total.reshape(tensor.shape), stats)

    def _check(self, check: Future[torch.Tensor], value: int, parameters: dict[str, Any]) -> None:
        """The call's agreement packet: on a mismatch this agent is unusable (its peers' streams no longer
        line up with its own), so every later call raises the same error."""
        try:
            check_agreement(check.result(), self.rank, self.world_size, value, repr(parameters))
        except AggregationError as error:
            self._failure = error
            raise

    def _agree_link(self) -> None:
        """Average the workers' link measurements over the network, so that all choose alike."""
        words = link_words(self.rank, self.backend.link_estimate())
        summed = self.backend.reduce(Op.ADD, words).result()
        self._link = agreed_link(summed, self.world_size) or self._link
