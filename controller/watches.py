"""Watch streams, kept from holding the job service's threads.

Every open Watch holds one server thread while it waits for the next change, so watches are bounded: at
most ``per_key`` open at once per credential and job, at most ``total`` in all (the rest of the thread pool
stays for the unary calls), and none lives longer than ``max_seconds`` (it then ends DEADLINE_EXCEEDED
with trailing metadata ``lhc-watch: expired``; ``JobClient.watch`` opens the next one). A client that
goes away (cancels, closes its channel, or is found dead by the server's keepalive pings) frees its
thread at once: the call's termination callback wakes the waiting loop.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import grpc

from lhc_ina.jobservice import errors
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice.client import WATCH_EXPIRED


class Changes:
    """A version number and a condition: watchers wait for the next change of anything."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.version = 0

    def notify(self) -> None:
        with self._cond:
            self.version += 1
            self._cond.notify_all()

    def wake(self) -> None:
        """Wake every waiter without a change: one of them has been cancelled."""
        with self._cond:
            self._cond.notify_all()

    def wait(self, seen: int, timeout: float, cancelled: threading.Event | None = None) -> int:
        with self._cond:
            self._cond.wait_for(
                lambda: self.version != seen or (cancelled is not None and cancelled.is_set()), timeout
            )
            return self.version


class WatchLimits:
    def __init__(self, per_key: int, total: int, max_seconds: float) -> None:
        self.per_key = per_key
        self.total = total
        self.max_seconds = max_seconds
        self._lock = threading.Lock()
        self._open: Counter[tuple[str, int]] = Counter()

    def acquire(self, who: str, job_id: int) -> tuple[str, int]:
        """Take one watch slot of ``who`` (a credential) on job ``job_id``; RESOURCE_EXHAUSTED if none.
        The caller gives it back with ``release`` when its stream ends, however it ends."""
        key = (who, job_id)
        with self._lock:
            if sum(self._open.values()) >= self.total:
                raise errors.exhausted(f"the controller has {self.total} watches open: its limit")
            if self._open[key] >= self.per_key:
                raise errors.exhausted(
                    f"{who} has {self.per_key} watches open on job {job_id}, the limit per credential and job"
                )
            self._open[key] += 1
        return key

    def release(self, key: tuple[str, int]) -> None:
        with self._lock:
            self._open[key] -= 1
            if not self._open[key]:
                del self._open[key]


def stream(
    fetch: Callable[[], pb.JobInfo | None], changes: Changes, context: grpc.ServicerContext,
    max_seconds: float,
) -> Iterator[pb.JobInfo]:  # fmt: skip
    """The job (``fetch``; None once deleted, which ends the stream OK) now and on every change of state,
    epoch, installation, failure or membership, until the client goes or ``max_seconds`` pass."""
    cancelled = threading.Event()

    def gone() -> None:
        cancelled.set()
        changes.wake()

    context.add_callback(gone)
    deadline = time.monotonic() + max_seconds
    last = None
    seen = changes.version
    while not cancelled.is_set() and context.is_active():
        left = deadline - time.monotonic()
        if left <= 0:
            context.set_trailing_metadata((WATCH_EXPIRED,))
            context.abort(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"watch ended after the controller's limit of {max_seconds:g} s (--watch-limit): watch again",
            )
        info = fetch()
        if info is None:
            return
        key = (info.state, info.epoch, info.installed, info.failure,
               tuple((m.rank, m.left) for m in info.members))  # fmt: skip
        if key != last:
            last = key
            yield info
        seen = changes.wait(seen, min(1.0, left), cancelled)
