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

**Coming back.** While on the hosts, at each step boundary the ranks vote with one small ADD: each puts
the job id and the epoch of a switch path it could use again (its controller shows the job, the one it is
a member of, installed under an epoch newer than the one that failed), zeros otherwise. When every lane
holds the same job and epoch, every rank opens its stream under it and the next call goes through the
switch again. A step boundary is the call after one the caller marked as a step's last; a caller that
marks none (the ``lhc`` torch.distributed backend, which DDP hands buckets, not steps) gets one at each
call whose bucket key already came since the last boundary: with DDP, each step's first bucket.

**Joining again.** A run that could not join (the job unknown, refused, the controller unreachable), or
whose job is gone (failed, deleted, created again under its name, lost by a controller), holds no usable
membership, so no epoch can come for it. Every ``rejoin_every_s`` seconds (agreed in the vote: any rank's
clock that says so) the ranks try once more at the vote: each drops a membership its controller no
longer serves and joins afresh where it holds none (``rejoin``, a short deadline); one ADD tells whether
all are members of the same job; if so each asks its controller once, and a second vote as above decides
whether they return now. A membership whose job is not yet installed (a worker still missing, a switch
down) is kept, so the next vote may find it installed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
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
#: How often a run without a usable membership tries to join its job again (``LHC_REJOIN_EVERY_S``).
DEFAULT_REJOIN_EVERY_S = 10.0
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

    job_id: int  # the job this membership belongs to (a job created again under its name has another)

    def return_epoch(self) -> int:
        """The epoch a new stream could use (installed, newer than the failed one), or 0."""
        ...

    def gone(self) -> str:
        """Why this membership can never serve again (its job failed or is unknown), or ""."""
        ...

    def refresh(self) -> None:
        """Ask the controller now, so that :meth:`return_epoch` reads its present answer."""
        ...

    def reopen(self, epoch: int) -> None:
        """A fresh stream under ``epoch``, from position 0."""
        ...

    def close(self) -> None:
        """Leave the job."""
        ...


@dataclass
class _Logged:
    op: Op
    words: torch.Tensor
    future: Future


class PathBackend(Backend):
    """The agent's backend over two paths; see the module docstring."""

    def __init__(self, host: Backend, switch: Backend | None, *, policy: PathPolicy | None = None,
                 meet_timeout_s: float = DEFAULT_MEET_TIMEOUT_S, why_host: str = "",
                 rejoin: Callable[[], Backend | None] | None = None,
                 rejoin_every_s: float = DEFAULT_REJOIN_EVERY_S) -> None:
        """``switch``: the switch path (a :class:`SwitchPath`), or None. ``why_host``: the run starts on the
        hosts for this reason (``switch`` then a membership not yet installed, or None). ``rejoin``: a fresh
        membership of the job, or None where the controller refused it (see "Joining again")."""
        if switch is not None and switch.world_size != host.world_size:
            raise ValueError(f"the switch's job has {switch.world_size} workers, the process group "
                             f"{host.world_size}")
        if rejoin_every_s < 0:
            raise ValueError(f"rejoin_every_s must not be negative, not {rejoin_every_s}")
        self.host, self.switch = host, switch
        self.rank, self.world_size = host.rank, host.world_size
        self.policy = policy or SwitchWhileHealthy()
        self.meet_timeout_s = meet_timeout_s
        self.rejoin, self.rejoin_every_s = rejoin, rejoin_every_s
        self.switch_usable = switch is not None and not why_host
        #: Why the run is on the hosts ("" while the switch path is usable).
        self.why_host = why_host
        #: A join that fell back counts as a fallback before call 0.
        self.fallbacks = 0 if self.switch_usable else 1
        self.returns = 0
        #: Calls completed on each path (a call redone after a fallback counts on the hosts).
        self.calls = {SWITCH: 0, HOST: 0}
        #: Fallbacks and returns as they happened: {"event", "call", "why"}.
        self.events: list[dict[str, Any]] = [] if self.switch_usable else [
            {"event": "fallback", "call": 0, "why": why_host}]
        self._host_since = 0  # the first call of the current stay on the hosts
        self._rejoined_at = time.monotonic()  # the last attempt to join again (or the fallback)
        self._voted: set[int] = set()
        self._call = -1  # the call in progress
        self._finished = -1  # the last call completed
        self._path = SWITCH if self.switch_usable else HOST
        self._log: dict[int, list[_Logged]] = {}
        self._step_ends: dict[int, bool] = {}
        self._marked = False  # the caller marks step ends: boundaries follow them, not bucket keys
        self._step_keys: dict[Hashable, int] = {}  # without marks: each key since the last boundary -> call
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

    def reduce_round(self, messages: list[tuple[Op, torch.Tensor]],
                     scratch: Sequence[bool] = ()) -> list[Future[torch.Tensor]]:
        """The current path's reductions. A switch call's messages are logged (a fallback may replay
        them over the hosts); a call on the hosts is never replayed, so its words are not copied, and
        its scratch words may be reduced in place."""
        if self._path == SWITCH:
            futures = self.current.reduce_round(messages)
            with self._lock:
                self._log.setdefault(self._call, []).extend(
                    _Logged(op, words.detach().clone(), future)
                    for (op, words), future in zip(messages, futures, strict=True))
            return futures
        return self.current.reduce_round(messages, scratch)

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
        if self._boundary(number, key) and not self.switch_usable and self._vote_due(number):
            self._vote(number)
        self._facts = CallFacts(number, key, elements, self.switch_usable)
        self._path = self.policy.choose(self._facts, self._host_sum)
        self._began = time.perf_counter()
        if self._path not in (SWITCH, HOST) or (self._path == SWITCH and not self.switch_usable):
            raise ValueError(f"the path policy chose {self._path!r} for call {number}: not a usable path")
        self._call = number
        with self._lock:
            self._log[number] = []

    def end_call(self, number: int, protocol: str) -> None:
        """Call ``number`` completed on this rank, sent as ``protocol``: keep its log (a peer may still
        need it), drop older."""
        self._finished = number
        self.calls[self._path] += 1
        if self._facts is not None and self._facts.number == number:
            self.policy.observe(self._facts, self._path, time.perf_counter() - self._began, protocol)
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
        self._rejoined_at = time.monotonic()
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
    def _boundary(self, number: int, key: Hashable) -> bool:
        """Whether a step starts at call ``number`` (see "Coming back"); the same answer on every rank, and
        for a call begun again after a fallback, the same as at its first begin."""
        if self._marked:
            return self._step_ends.get(number - 1, False)
        if self._step_keys.setdefault(key, number) < number:
            self._step_keys = {key: number}
            return True
        return False

    def _vote_due(self, number: int) -> bool:
        return number > self._host_since and number not in self._voted

    def _vote(self, number: int) -> None:
        """Return now if every rank can; else, where a rank's clock says it is time, join again first."""
        self._voted.add(number)
        due = self.rejoin is not None and time.monotonic() - self._rejoined_at >= self.rejoin_every_s
        epoch, rejoin = self._ballot("the return vote", due)
        if not epoch and rejoin:
            self._rejoined_at = time.monotonic()
            if self._join_again():
                epoch, _ = self._ballot("the return vote after joining again", False)
        if not epoch:
            return
        self.switch.reopen(epoch)  # type: ignore[union-attr]
        self.switch_usable, self.why_host = True, ""
        self.returns += 1
        self.events.append({"event": "return", "call": number, "why": f"epoch {epoch} installed"})
        log.warning("rank %d: the switch path is back (job id %d, epoch %d); every rank returns to it from "
                    "call %d", self.rank, self.switch.job_id, epoch, number)  # type: ignore[union-attr]

    def _ballot(self, what: str, due: bool) -> tuple[int, bool]:
        """One ADD of (job id, epoch it could return under, join again now?) per rank: the epoch every rank
        named for the same job (0 unless all did), and whether any rank asked to join again."""
        lanes = torch.zeros(self.world_size, 3, dtype=torch.int32)
        if self.switch is not None:
            lanes[self.rank, 0] = self.switch.job_id  # type: ignore[attr-defined]
            lanes[self.rank, 1] = self.switch.return_epoch()  # type: ignore[attr-defined]
        lanes[self.rank, 2] = int(due)
        votes = self._wait(self.host.reduce(Op.ADD, lanes.reshape(-1)), what).reshape(self.world_size, 3)
        offers = {tuple(row) for row in votes[:, :2].tolist()}
        job, epoch = offers.pop() if len(offers) == 1 else (0, 0)
        return (epoch if job and epoch else 0), bool(votes[:, 2].any())

    def _join_again(self) -> bool:
        """Drop a membership the controller no longer serves, join where none is held, and tell the
        others: True when every rank is a member of the same job (each has then asked its controller)."""
        if self.switch is not None and (why := self.switch.gone()):  # type: ignore[attr-defined]
            log.info("rank %d: %s; joining again", self.rank, why)
            self.switch.close()
            self.switch = None
        if self.switch is None and self.rejoin is not None:
            self.switch = self.rejoin()
        lanes = torch.zeros(self.world_size, dtype=torch.int32)
        lanes[self.rank] = self.switch.job_id if self.switch is not None else 0  # type: ignore[attr-defined]
        jobs = set(self._wait(self.host.reduce(Op.ADD, lanes), "the members' count").tolist())
        if len(jobs) != 1 or 0 in jobs:
            return False
        self.switch.refresh()  # type: ignore[union-attr]
        return True

    def _host_sum(self, words: torch.Tensor, what: str) -> torch.Tensor:
        """``words`` summed over every rank through the hosts (what a policy agrees its measurements with)."""
        return self._wait(self.host.reduce(Op.ADD, words), what)

    def _wait(self, future: Future, what: str) -> torch.Tensor:
        try:
            return future.result(timeout=self.meet_timeout_s)
        except FutureTimeout:
            raise AggregationError(f"no answer to {what} after {self.meet_timeout_s:g} s: a rank did not "
                                   "come (it crashed, or its next call is further away than that)") from None
