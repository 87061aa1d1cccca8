"""The path layer: each call (bucket) goes through the switch or over the hosts, and every rank agrees which.

The codec is lossless and homomorphic, so the process-group codec (``ProcessGroupBackend``: the same
messages reduced by Gloo or NCCL) returns the same words as the switch: a call gives the same bits on
either path, and a run may move between them at any call boundary as long as every rank moves at the same
call. :class:`PathBackend` is the agent's backend when it has both; it takes every call through the path
its :class:`PathPolicy` chooses from agreed facts only (:class:`CallFacts`), by default the switch while
the switch path is in use (:class:`SwitchWhileHealthy`).

**Falling back.** A switch-path failure (a stall because a switch is dead or hung, a job the controller
failed, a stream that broke) is not the end of the run. The ranks *meet* over the process group: each
adds 1 + the number of its first call not yet completed into its own lane of one ADD, so every rank learns
every rank's progress. On the switch a rank may hold a call's result that another rank lacks (the
multicast of the last round reached some ranks only), but it cannot be further ahead than one call, since
no call completes without every rank's words. The agreed call ``m`` is the smallest first-unfinished call;
a rank that had completed ``m`` takes part in it again on the hosts by sending the very words it logged
(the words of a call depend only on its input, its codec state and the earlier aggregates, which are the
same on every rank), and checks that the hosts' sums equal the switch's; the others redo ``m`` from its
start. From ``m`` on every call goes over the hosts: no call lost, none summed twice. A rank that has
finished all its calls meets at :meth:`PathBackend.close`, so a peer that missed the last result is
served. Every wait has a deadline (``meet_timeout_s``).

**Coming back.** While on the hosts, at each step boundary (a call the caller marked as a step's last, or
every ``vote_every`` calls when it marks none) the ranks vote with one small ADD: each puts the epoch of
a switch path it could use again (the controller shows the job installed under an epoch newer than the
one that failed), 0 otherwise. When every lane holds the same epoch, every rank reopens its stream under
it and the next call goes through the switch again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Hashable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from host_agent.agent_backend import Backend, LinkEstimate
from host_agent.errors import AggregationError
from host_agent.path_policy import HOST, SWITCH, CallFacts, PathPolicy, SwitchWhileHealthy
from lhc_ina.constants import Op

log = logging.getLogger("lhc.paths")

#: How long a rank waits for its peers at a meeting or a vote before it gives up (they may be computing a
#: step before they reach their next call).
DEFAULT_MEET_TIMEOUT_S = 60.0
#: Without step marks from the caller, the ranks vote on a return every this many calls.
DEFAULT_VOTE_EVERY = 4
_CLOSING = "the run ended on a rank that had finished its calls"
_KEPT_CALLS = 2  # a rank is at most one call ahead of another: the current call and the one before


class SwitchPath(Protocol):
    """What the path layer asks of the switch backend beyond :class:`Backend`
    (``host_agent.transport.switch.SwitchBackend``)."""

    #: What its heartbeats tell the controller of the paths (``controller.path_reports``).
    path_report: str

    def leave_path(self) -> None:
        """The ranks went on over the hosts: stop sending, keep the membership."""
        ...

    def return_epoch(self) -> int:
        """The epoch a new stream could use (installed, newer than the failed one), or 0."""
        ...

    def reopen(self, epoch: int) -> None:
        """A fresh stream under ``epoch``, from position 0."""
        ...


@dataclass
class _Logged:
    op: Op
    words: torch.Tensor
    future: Future


class PathBackend(Backend):
    """The agent's backend over two paths; see the module docstring."""

    def __init__(self, host: Backend, switch: Backend | None, *, policy: PathPolicy | None = None,
                 meet_timeout_s: float = DEFAULT_MEET_TIMEOUT_S, vote_every: int = DEFAULT_VOTE_EVERY,
                 why_host: str = "") -> None:
        if switch is not None and switch.world_size != host.world_size:
            raise ValueError(f"the switch's job has {switch.world_size} workers, the process group "
                             f"{host.world_size}")
        if vote_every < 1:
            raise ValueError(f"vote_every must be at least 1, not {vote_every}")
        self.host, self.switch = host, switch
        self.rank, self.world_size = host.rank, host.world_size
        self.policy = policy or SwitchWhileHealthy()
        self.meet_timeout_s, self.vote_every = meet_timeout_s, vote_every
        self.switch_usable = switch is not None
        #: Why the run is on the hosts ("" while the switch path is usable).
        self.why_host = why_host if switch is None else ""
        self.fallbacks = 0
        self.returns = 0
        #: Calls completed on each path (a call redone after a fallback counts on the hosts).
        self.calls = {SWITCH: 0, HOST: 0}
        #: Fallbacks and returns as they happened: {"event", "call", "why"}.
        self.events: list[dict[str, Any]] = []
        self._host_since = 0  # the first call of the current stay on the hosts
        self._voted: set[int] = set()
        self._call = -1  # the call in progress
        self._finished = -1  # the last call completed
        self._path = SWITCH if self.switch_usable else HOST
        self._log: dict[int, list[_Logged]] = {}
        self._step_ends: dict[int, bool] = {}
        self._marked = False  # the caller marks step ends: votes follow them, not a call count
        self._estimates: dict[int, LinkEstimate | None] = {}
        self._facts: CallFacts | None = None  # the call in progress, as its policy saw it
        self._began = 0.0
        self._lock = threading.Lock()

    # --- what the agent sees as one backend -------------------------------------------------------
    @property
    def path(self) -> str:
        """The path of the call in progress (or the next one)."""
        return self._path

    @property
    def current(self) -> Backend:
        return self.switch if self._path == SWITCH and self.switch is not None else self.host

    @property
    def waits_for_agreement(self) -> bool:  # type: ignore[override]
        return self.current.waits_for_agreement

    def reduce(self, op: Op, words: torch.Tensor) -> Future[torch.Tensor]:
        return self.reduce_round([(op, words)])[0]

    def reduce_round(self, messages: list[tuple[Op, torch.Tensor]]) -> list[Future[torch.Tensor]]:
        """The current path's reductions. A switch call's messages are logged (a fallback may replay
        them over the hosts); a call on the hosts is never replayed, so its words are not copied."""
        futures = self.current.reduce_round(messages)
        if self._path == SWITCH:
            with self._lock:
                self._log.setdefault(self._call, []).extend(
                    _Logged(op, words.detach().clone(), future)
                    for (op, words), future in zip(messages, futures, strict=True))
        return futures

    def link_estimate(self) -> LinkEstimate | None:
        """The switch's measurement, fixed per call: a call redone after a fallback sends the same link
        words as its first attempt did, so its sum equals the one its peers already took."""
        if self._call not in self._estimates:
            source = self.switch if self.switch is not None else self.host
            self._estimates[self._call] = source.link_estimate()
        return self._estimates[self._call]

    def counters(self) -> dict[str, int]:
        totals: dict[str, int] = {}
        for backend in (self.host, self.switch):
            for name, value in (backend.counters() if backend is not None else {}).items():
                totals[name] = totals.get(name, 0) + value
        return {**totals, "path_fallbacks": self.fallbacks, "path_returns": self.returns}

    # --- call boundaries (the agent's thread) -----------------------------------------------------
    def begin_call(self, number: int, key: Hashable, elements: int, step_end: bool) -> None:
        """Call ``number`` starts (or starts again after a fallback): vote on a return where one is due,
        then take the policy's path for it."""
        self._step_ends.setdefault(number, step_end)
        self._marked = self._marked or step_end
        if not self.switch_usable and self.switch is not None and self._vote_due(number):
            self._vote(number)
        self._facts = CallFacts(number, key, elements, self.switch_usable)
        self._path = self.policy.choose(self._facts, self._host_sum)
        self._began = time.perf_counter()
        if self._path not in (SWITCH, HOST) or (self._path == SWITCH and not self.switch_usable):
            raise ValueError(f"the path policy chose {self._path!r} for call {number}: not a usable path")
        self._call = number
        with self._lock:
            self._log[number] = []

    def end_call(self, number: int) -> None:
        """Call ``number`` completed on this rank: keep its log (a peer may still need it), drop older."""
        self._finished = number
        self.calls[self._path] += 1
        if self._facts is not None and self._facts.number == number:
            self.policy.observe(self._facts, self._path, time.perf_counter() - self._began)
        if self.switch is not None:  # the controller hears it with the next heartbeat
            self.switch.path_report = (f"path={self._path},switch_calls={self.calls[SWITCH]},"  # type: ignore
                                       f"host_calls={self.calls[HOST]},fallbacks={self.fallbacks},"
                                       f"returns={self.returns}")
        with self._lock:
            for old in [n for n in self._log if n <= number - _KEPT_CALLS]:
                del self._log[old]
        for table in (self._step_ends, self._estimates):
            for old in [n for n in table if n <= number - _KEPT_CALLS]:
                del table[old]

    def recover(self, number: int, error: AggregationError) -> bool:
        """Call ``number`` failed with ``error``: True when it was the switch path's failure and every rank
        has now agreed to go on over the hosts (redo ``number`` there); False when it is not a switch
        path's failure (the agent fails as before)."""
        if self.switch is None or self._path != SWITCH or not self._switch_broke(number):
            return False
        self._meet(number, str(error))
        return True

    def close(self) -> None:
        """Meet once more if on the switch (a peer may lack the last call's result), then release both."""
        try:
            if self.switch_usable and self.switch is not None:
                self._meet(self._finished + 1, _CLOSING)
        except AggregationError as exc:
            log.warning("rank %d: the closing meeting failed: %s", self.rank, exc)
        finally:
            for backend in (self.switch, self.host):
                if backend is not None:
                    backend.close()

    def abandon(self, error: Exception) -> None:
        for backend in (self.switch, self.host):
            if backend is not None:
                backend.abandon(error)

    # --- falling back ---------------------------------------------------------------------------
    def _switch_broke(self, number: int) -> bool:
        """Whether a switch-path reduction of call ``number`` failed or never completed."""
        with self._lock:
            logged = list(self._log.get(number, ()))
        return any(not entry.future.done() or entry.future.exception() is not None for entry in logged)

    def _meet(self, first_unfinished: int, why: str) -> None:
        """Agree with every rank on the first call not completed by all and move to the hosts from it."""
        lanes = torch.zeros(self.world_size, dtype=torch.int32)
        lanes[self.rank] = first_unfinished + 1
        marks = self._wait(self.host.reduce(Op.ADD, lanes), "the fallback meeting").tolist()
        missing = [rank for rank, mark in enumerate(marks) if mark <= 0]
        if missing:
            raise AggregationError(f"the fallback meeting is incomplete: ranks {missing} sent nothing",
                                   tuple(missing))
        agreed = min(marks) - 1
        if max(marks) - 1 - agreed > 1:
            raise AggregationError(f"the ranks are more than one call apart at the fallback meeting: {marks}")
        if why == _CLOSING and agreed == max(marks) - 1:
            return  # every rank completed every call: nothing to serve
        for number in range(agreed, first_unfinished):
            self._replay(number)
        self._path, self.switch_usable, self._host_since = HOST, False, agreed
        self.switch.leave_path()  # type: ignore[union-attr]
        self.fallbacks += 1
        self.events.append({"event": "fallback", "call": agreed, "why": why})
        self.why_host = why
        log.warning("rank %d: the switch path failed (%s); every rank goes on over the process group from "
                    "call %d, with the same bits", self.rank, why, agreed)

    def _replay(self, number: int) -> None:
        """Take part in call ``number``, completed here, on the hosts: send its logged words again and check
        that the hosts' sums are the switch's."""
        with self._lock:
            logged = self._log.get(number)
        if logged is None:
            raise AggregationError(f"rank {self.rank} cannot take part again in call {number}: not logged")
        for index, entry in enumerate(logged):
            summed = self._wait(self.host.reduce(entry.op, entry.words), f"message {index} of call {number}")
            if entry.future.done() and entry.future.exception() is None and not torch.equal(
                    summed.cpu(), entry.future.result().cpu()):
                raise AggregationError(f"call {number}, message {index}: the hosts' sum differs from the "
                                       "switch's (the ranks' calls do not line up)")

    # --- coming back -----------------------------------------------------------------------------
    def _vote_due(self, number: int) -> bool:
        if number <= self._host_since or number in self._voted:
            return False
        return self._step_ends.get(number - 1, False) if self._marked else number % self.vote_every == 0

    def _vote(self, number: int) -> None:
        """Every rank says which epoch it could return under; all the same and nonzero: return now."""
        self._voted.add(number)
        lanes = torch.zeros(self.world_size, dtype=torch.int32)
        lanes[self.rank] = self.switch.return_epoch()  # type: ignore[union-attr]
        epochs = set(self._wait(self.host.reduce(Op.ADD, lanes), "the return vote").tolist())
        if len(epochs) != 1 or 0 in epochs:
            return
        epoch = epochs.pop()
        self.switch.reopen(epoch)  # type: ignore[union-attr]
        self.switch_usable, self.why_host = True, ""
        self.returns += 1
        self.events.append({"event": "return", "call": number, "why": f"epoch {epoch} installed"})
        log.warning("rank %d: the switch path is back (epoch %d); every rank returns to it from call %d",
                    self.rank, epoch, number)

    def _host_sum(self, words: torch.Tensor, what: str) -> torch.Tensor:
        """``words`` summed over every rank through the hosts (what a policy agrees its measurements with)."""
        return self._wait(self.host.reduce(Op.ADD, words), what)

    def _wait(self, future: Future, what: str) -> torch.Tensor:
        try:
            return future.result(timeout=self.meet_timeout_s)
        except FutureTimeout:
            raise AggregationError(f"no answer to {what} after {self.meet_timeout_s:g} s: a rank did not "
                                   "come (it crashed, or its next call is further away than that)") from None
