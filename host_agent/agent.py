"""The worker's API: aggregate a bucket exactly, through the switch, a process group or memory.

    agent = Agent.join(controller="127.0.0.1:9560", job="train")      # rank, slots, epoch from there
    result = agent.allreduce(gradient, key="bucket-0")                # mode "auto" by default
    result.total, result.stats["mode"], result.stats["bytes_sent"]
    future = agent.allreduce_async(other, key="bucket-1")             # concurrent.futures.Future
    shard = agent.allreduce(gradient, output_range=(lo, hi)).total    # decodes elements lo..hi-1 only
    agent.close()

Calls run one at a time, in call order, on the agent's own thread: every worker must make the same calls
in the same order (as DDP's buckets are), and every message they produce then meets its peers' on the
wire. The codec state of each ``key`` (the bucket's size estimate and scale) is kept between calls.

Every round ends with a seal (``host_agent.seal``): a worker out of step with its peers makes the round
fail on every worker instead of adding its words to another call's. Any error that leaves this worker
out of step (anything but an error every worker raises alike from aggregated words) fails the agent: every
later call raises it, and the backend is told, so that the peers see this worker as gone and name it.

A bucket on a GPU stays there: the agent's thread runs its codec on a stream of its own, ordered after
the caller's work and before what the caller queues once the call completes (``host_agent.device_order``);
only the messages' words cross to the host, through pinned buffers (``host_agent/codec/gpu/transfer.py``).

Encoding overlaps the network: while a call waits for a round's results, the agent's thread encodes the
first round of the next queued call (when that call's mode and state cannot change before it starts: it
has another key, and it is not a call on which the workers agree their link estimate). Messages still
enter the backend strictly in call order, so the overlap is invisible on the wire.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

import torch

from host_agent.agent_backend import Backend, LinkEstimate
from host_agent.auto import LINK_AGREE_EVERY, agreed_link, choose_mode, link_words
from host_agent.codec import MODES, CodecState, Message, WorkerSession
from host_agent.codec.output import OutputRange
from host_agent.codec.sketch import resolve_layout
from host_agent.device_order import DeviceOrder, caller_stream, on_stream, running
from host_agent.errors import AggregationError
from host_agent.seal import SealedRound
from lhc_ina.constants import FRAME_BYTES, Op

AGENT_MODES = (*MODES, "auto")
#: How long a call waits for any one result before it gives up (a peer that never makes the call).
DEFAULT_TIMEOUT_S = 60.0


@dataclass
class AllreduceResult:
    """The exact sum (the input's dtype; floats dequantized at the agreed scale) and what it cost."""

    total: torch.Tensor
    stats: dict[str, Any]


@dataclass
class _Call:
    """One queued ``allreduce``: its input and, once prepared, the session with its first round encoded."""

    number: int
    tensor: torch.Tensor
    mode: str
    key: Hashable
    block: int
    output_range: tuple[int, int] | None
    session: WorkerSession | None = None
    chosen: str = ""
    reason: str = ""
    prepared_ahead: bool = False
    step_end: bool = False  # the caller's last call of a training step (where paths may change)
    in_place: bool = False  # the total goes into ``tensor`` itself
    redone: int = 0  # times it started again on another path after a switch-path failure
    order: DeviceOrder | None = None  # a CUDA tensor's stream order (None on the CPU)


class Agent:
    """One worker's aggregation endpoint over any :class:`~host_agent.agent_backend.Backend`."""

    def __init__(self, backend: Backend, *, mode: str = "auto", block: int = 1,
                 timeout_s: float = DEFAULT_TIMEOUT_S, **codec_options: Any) -> None:
        if mode not in AGENT_MODES:
            raise ValueError(f"mode must be one of {AGENT_MODES}, not {mode!r}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, not {timeout_s!r}")
        self.backend = backend
        self.timeout_s = timeout_s
        self.rank = backend.rank
        self.world_size = backend.world_size
        self.mode = mode
        self.block = block
        self.codec_options = codec_options
        self.states: dict[Hashable, CodecState] = {}
        self._words: dict[Hashable, torch.Tensor] = {}  # each dense bucket's words buffer (_dense_words)
        self.last_stats: dict[str, Any] | None = None
        self._calls = 0  # calls made so far; link agreements fall on fixed call numbers
        self._link: LinkEstimate | None = None
        self._failure: AggregationError | None = None
        self._lock = threading.Lock()
        self._queue: deque[_Call] = deque()  # calls made and not yet started, in call order
        self._pending = 0  # calls made and not yet finished
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lhc-agent-{self.rank}")
        self._streams: dict[torch.device, torch.cuda.Stream] = {}  # the codec's stream per GPU

    @classmethod
    def join(cls, controller: str, job: str, *, mode: str = "auto", block: int = 1,
             codec_options: dict[str, Any] | None = None, **switch_options: Any) -> Agent:
        """Join ``job`` on the controller and aggregate through the switch. ``switch_options`` go to
        :meth:`host_agent.transport.switch.SwitchBackend.join` (address, token, timeouts, impairment);
        the agent waits for a result at most twice the transport's ``timeout_s``, so the transport's
        error, which names the silent workers, comes first."""
        from host_agent.transport.switch import SwitchBackend

        backend = SwitchBackend.join(controller, job, **switch_options)
        timeout_s = 2 * backend.stream.timeout_s
        return cls(backend, mode=mode, block=block, timeout_s=timeout_s, **(codec_options or {}))

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self.backend.close()

    def _require_idle(self, what: str) -> None:
        """A checkpoint is only consistent between calls: a pending call may already hold its state."""
        with self._lock:
            if self._pending:
                raise RuntimeError(f"{what} with {self._pending} call(s) pending: wait for their futures")

    def state_dict(self) -> dict[str, Any]:
        """What decides the results of later calls: the codec state per key, the call count (link
        agreements fall on fixed calls) and the agreed link estimate. Identical on every worker."""
        self._require_idle("state_dict()")
        link = None if self._link is None else (self._link.rtt_s, self._link.bytes_per_s)
        states = {key: s.as_dict() for key, s in self.states.items()}
        return {"codec_states": states, "calls": self._calls, "link": link}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._require_idle("load_state_dict()")
        self.states = {key: CodecState.from_dict(fields) for key, fields in state["codec_states"].items()}
        self._calls = state["calls"]
        self._link = None if state["link"] is None else LinkEstimate(*state["link"])

    def allreduce(self, tensor: torch.Tensor, *, mode: str | None = None, key: Hashable | None = None,
                  block: int | None = None, output_range: tuple[int, int] | None = None,
                  step_end: bool = False, in_place: bool = False) -> AllreduceResult:
        """The exact sum of ``tensor`` over all workers (see :meth:`allreduce_async`)."""
        future = self.allreduce_async(tensor, mode=mode, key=key, block=block, output_range=output_range,
                                      step_end=step_end, in_place=in_place)
        return future.result()

    def allreduce_async(self, tensor: torch.Tensor, *, mode: str | None = None, key: Hashable | None = None,
                        block: int | None = None,
                        output_range: tuple[int, int] | None = None,
                        step_end: bool = False, in_place: bool = False) -> Future[AllreduceResult]:
        """Start aggregating ``tensor`` (any shape; int32 exactly, floats at one agreed power-of-two
        scale). ``key`` names the bucket whose codec state carries over (default: its size and dtype).
        ``output_range`` ``(lo, hi)``: decode only the flat elements lo..hi-1 (this worker's shard of a
        reduce_scatter); the total is then that 1-D slice of the whole sum, bit for bit. Workers may pass
        different ranges: the messages do not depend on it (:mod:`host_agent.codec.output`).
        ``step_end``: this is the step's last call (where the ranks may return to the switch together).
        ``in_place``: the total is written into ``tensor`` (contiguous), as ``dist.all_reduce`` does, once
        the call has read all it needs of it: no bucket-sized allocation for the result.
        ``tensor`` must not change until the future is done."""
        mode = mode or self.mode
        if mode not in AGENT_MODES:
            raise ValueError(f"mode must be one of {AGENT_MODES}, not {mode!r}")
        OutputRange.of(output_range, tensor.numel())  # a bad range fails here, not on the agent's thread
        if in_place and (output_range is not None or not tensor.is_contiguous()):
            raise ValueError("in_place needs a contiguous tensor and no output_range (the total is all "
                             "of it)")
        key = (tensor.numel(), tensor.dtype) if key is None else key
        with self._lock:  # queue and submit together: the n-th submission runs the n-th queued call
            call = _Call(self._calls, tensor, mode, key, block or self.block, output_range,
                         step_end=step_end, in_place=in_place, order=DeviceOrder.of(tensor, self._streams))
            self._calls += 1
            self._queue.append(call)
            self._pending += 1
            return self._executor.submit(self._run_next)  # hand-off 2: the agent's thread -> the caller

    def allreduce_torch_future(self, tensor: torch.Tensor, finish: Callable[[AllreduceResult], Any],
                               **options: Any) -> torch.futures.Future:
        """:meth:`allreduce_async` as the torch Future that DDP's hook and a torch.distributed ``Work``
        must return (they take no other kind), holding ``finish(result)``; an error (or one ``finish``
        raises) is the future's exception, raised where the caller waits. For a CUDA tensor the future is
        CUDA-aware (the caller's stream waits for the event its result records) and ``finish`` runs on the
        caller's stream, which already waits for the codec's work."""
        devices = [tensor.device] if tensor.device.type == "cuda" else None
        handed: torch.futures.Future = torch.futures.Future(devices=devices)
        caller = caller_stream(tensor)

        def complete(done: Future[AllreduceResult]) -> None:  # hand-off 3, on the agent's thread
            try:
                result = done.result()
                with on_stream(caller):
                    handed.set_result(finish(result))
            except Exception as exc:
                handed.set_exception(exc)

        self.allreduce_async(tensor, **options).add_done_callback(complete)
        return handed

    # --- the agent's thread -----------------------------------------------------------------------
    def _run_next(self) -> AllreduceResult:
        with self._lock:
            call = self._queue.popleft()  # the executor runs submissions in order: this is ours
        try:
            if self._failure is not None:
                raise self._failure
            while True:
                try:
                    return self._attempt(call)
                except AggregationError as error:
                    if error.collective or not self.backend.recover(call.number, error):
                        raise
                    call.session, call.prepared_ahead = None, False  # redo it on the path agreed
                    call.redone += 1
        except AggregationError as error:
            if not error.collective:
                self._fail(error)
            raise
        except Exception as exc:  # local (a bug, out of memory): the peers cannot know, so leave the job
            error = AggregationError(f"worker {self.rank} failed in call {call.number}: {exc!r}",
                                     (self.rank,))
            self._fail(error)
            raise error from exc
        finally:
            with self._lock:
                self._pending -= 1

    def _attempt(self, call: _Call) -> AllreduceResult:
        """Run ``call`` once on the path the backend takes for it (``host_agent.paths``)."""
        self.backend.begin_call(call.number, call.key, call.tensor.numel(), call.step_end)
        if call.session is None:
            self._prepare(call)
        assert call.session is not None
        with running(call.order):
            result = self._drive(call, call.session)
        self.backend.end_call(call.number, result.stats["codec"]["protocol"])
        if call.order is not None:
            call.order.hand_back(result.total)
        return result

    def _fail(self, error: AggregationError) -> None:
        """This worker is out of step: every later call raises ``error``, and the backend stops taking
        part (on the switch it leaves the job, so the peers' errors name it instead of waiting blind)."""
        if self._failure is None:
            self._failure = error
            self.backend.abandon(error)

    def _prepare(self, call: _Call) -> None:
        """Pick the mode, make the session and encode its first round."""
        state = self.states.get(call.key)
        call.chosen, call.reason = call.mode, f"mode {call.mode} requested"
        if call.mode == "auto":
            if call.number % LINK_AGREE_EVERY == 0:
                self._agree_link()
            layout = resolve_layout(self.codec_options.get("layout", "auto"), call.tensor.device)
            choice = choose_mode(call.tensor.numel(), self.world_size, call.block, state, self._link, layout)
            call.chosen, call.reason = choice.mode, choice.reason
        # Phase times for the stats; on a GPU they would cost a synchronize per phase, so only on request.
        options = {"timing": call.tensor.device.type == "cpu", **self.codec_options}
        session = WorkerSession(call.tensor.reshape(-1), self.rank, self.world_size, mode=call.chosen,
                                block=call.block, state=state, output_range=call.output_range,
                                out=call.tensor.view(-1) if call.in_place else None,
                                dense_words=self._dense_words(call), **options)
        call.session = session
        with running(call.order):
            session.advance()

    def _dense_words(self, call: _Call) -> torch.Tensor | None:
        """A dense float32 CPU bucket's words buffer, kept between its calls: a new one per call is paged
        in and zeroed by the kernel again (28 MB for 7M elements). A compressed bucket holds none."""
        x = call.tensor
        if call.chosen != "dense" or x.dtype != torch.float32 or x.device.type != "cpu":
            return None
        if call.key not in self._words or self._words[call.key].numel() != x.numel():
            self._words[call.key] = torch.empty(x.numel(), dtype=torch.int32)
        return self._words[call.key]

    def _prepare_ahead(self, current: _Call) -> None:
        """Encode the next queued call's first round now, while ``current`` waits for the network, if
        nothing ``current`` or a link agreement could change decides it (see the module docstring)."""
        with self._lock:
            upcoming = self._queue[0] if self._queue else None
        if upcoming is None or upcoming.session is not None or upcoming.key == current.key:
            return
        if upcoming.mode == "auto" and upcoming.number % LINK_AGREE_EVERY == 0:
            return
        try:
            self._prepare(upcoming)
        except Exception:  # the call meets the error again in its own turn, not in this one's
            upcoming.session = None
            return
        upcoming.prepared_ahead = True

    def _drive(self, call: _Call, session: WorkerSession) -> AllreduceResult:
        counters_before = self.backend.counters()
        network_s, words, rounds, messages, packets = 0.0, 0, 0, 0, 0
        while batch := _next_round(session):
            started = time.perf_counter()
            sealed = SealedRound.of(call.number, rounds, batch)
            futures = self._send(session, sealed, first=rounds == 0)
            ahead_started = time.perf_counter()
            self._prepare_ahead(call)
            started += time.perf_counter() - ahead_started  # the next call's encoding is its own
            for index, future in enumerate(futures):
                if future is not None:
                    self._receive(session, sealed, index, future)
            network_s += time.perf_counter() - started
            words += sealed.words
            packets += sealed.packets
            rounds += 1
            messages += len(sealed.wire)
        total, codec_stats, self.states[call.key] = session.result()
        counters = {name: value - counters_before.get(name, 0)
                    for name, value in self.backend.counters().items()}
        stats = {
            "path": self.backend.path,  # switch, host or memory (host_agent.paths)
            "redone": call.redone,
            "mode": call.chosen,
            "mode_reason": call.reason,
            "elements": call.tensor.numel(),
            "output_range": call.output_range or (0, call.tensor.numel()),
            "decoded_elements": codec_stats["decoded_elements"],  # the work the output range saves
            "rounds": rounds,
            "messages": messages,
            "words_sent": words,
            "bytes_sent": packets * FRAME_BYTES,
            "bytes_received": packets * FRAME_BYTES,
            "packets": packets,
            "retransmissions": counters.get("retransmissions", 0),
            "fast_retransmissions": counters.get("fast_retransmissions", 0),
            "timer_retransmissions": counters.get("timer_retransmissions", 0),
            "tail_probes": counters.get("tail_probes", 0),
            "encode_s": codec_stats.get("encode_s") or 0.0,
            "network_s": network_s,
            "decode_s": codec_stats.get("decode_s") or 0.0,
            "codec_kernels": codec_stats["kernels"],  # native/avx2, native/scalar or torch
            "encoded_ahead": call.prepared_ahead,
            "nonfinite_ranks": codec_stats.get("nonfinite_ranks", []),  # the total is all NaN if any
            "codec": codec_stats,
            "transport": counters,
        }
        self.last_stats = stats
        shaped = call.output_range is None  # a range's total is 1-D, as the range is of flat elements
        return AllreduceResult(total.reshape(call.tensor.shape) if shaped else total, stats)

    def _send(self, session: WorkerSession, sealed: SealedRound, first: bool) -> list[Future | None]:
        """Hand a round's wire messages to the backend. A backend that cannot survive messages of different
        lengths (torch.distributed) gets the rest of the first round only once the agreement message,
        which comes first, has proved that the workers match; its slot in the list is then None."""
        if first and self.backend.waits_for_agreement:
            self._receive(session, sealed, 0, self.backend.reduce(*sealed.wire[0]))
            return [None, *self.backend.reduce_round(sealed.wire[1:], sealed.scratch[1:])]
        return self.backend.reduce_round(sealed.wire, sealed.scratch)

    def _receive(self, session: WorkerSession, sealed: SealedRound, index: int, future: Future) -> None:
        """Store one result in the session (an agreement error means the workers' messages no longer line
        up), checking the seal where it rides."""
        what = (f"the {sealed.messages[index].kind} message" if index < len(sealed.messages) else "the seal")
        words = sealed.take(index, self._wait(future, f"{what} of round {sealed.round}"), self.world_size)
        if words is not None:
            session.receive(words)

    def _wait(self, future: Future, what: str) -> torch.Tensor:
        """A result, or an error once ``timeout_s`` passed without one (a peer that never calls)."""
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise AggregationError(
                f"no result for {what} after {self.timeout_s:g} s: a worker did not make this call or is "
                "stalled"
            ) from None

    def _agree_link(self) -> None:
        """Average the workers' link measurements over the network, so that all choose alike."""
        words = link_words(self.backend.link_estimate())
        summed = self._wait(self.backend.reduce(Op.ADD, words), "the link agreement")
        self._link = agreed_link(summed, self.world_size) or self._link


def _next_round(session: WorkerSession) -> list[Message]:
    """The session's next round, all its messages (computing it if due); empty when it is done."""
    first = session.next_message()
    if first is None:
        return []
    batch = [first]
    while session.ready_messages:
        message = session.next_message()
        assert message is not None
        batch.append(message)
    return batch
