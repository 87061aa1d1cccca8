"""The controller's P4Runtime session: it owns the switch, survives it, and keeps it equal to the store.

One thread connects, arbitrates (election id), and while primary: checks the loaded pipeline (pushing it
when there is none), then reconciles at start, after every (re)connection or regained primaryship, on
request (a job changed) and periodically. The facts of life it handles:

- **Lost primaryship** (a higher election id arrived): stop writing, say so in status and logs; the
  device tells us when the other one goes, and we take over (prepare and reconcile again).
- **The switch goes away**: reconnect with exponential backoff, forever.
- **The switch comes back empty** (no pipeline, or not the pipeline this store pushed: the cookie
  differs): push it, give every job a new epoch (the registers may hold anything), repopulate.

A backup (not primary) never writes; it reads the switch to report whether the store's jobs are there.

A controller of a leaf/spine fabric runs one session per switch (``controller.sessions``), each with its
own election, pipeline cookie and reconcile, writing that switch's share of the jobs that span it. A switch
that comes back empty renews the epochs of the jobs that span it, and the other switches' sessions are
asked to reconcile (``on_renewed``) so that every switch of such a job carries the new epoch.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from p4.v1 import p4runtime_pb2

from controller.reconcile import desired_state, pipeline_differences, plan, read_state
from controller.records import JobRecord
from controller.spans import job_switches
from controller.store import JobStore
from controller.targets import Target
from controller.topology import SINGLE, Topology
from lhc_ina import constants as c
from lhc_ina.p4rt import P4RuntimeClient, P4RuntimeError
from lhc_ina.tls import TlsConfig

log = logging.getLogger("lhc-controller.switch")
#: How often a connected switch is asked for one cheap answer (Capabilities), and how long it has to give it.
PROBE_PERIOD_S = 1.0
PROBE_TIMEOUT_S = 1.0
#: The longest a counter read (JobStatus, the metrics) waits for one switch.
COUNTER_READ_S = 1.0
_SET = p4runtime_pb2.SetForwardingPipelineConfigRequest
COOKIE_KEY = "pipeline_cookie"


@dataclass
class SwitchStatus:
    connected: bool = False
    primary: bool = False
    state: str = "starting"
    last_error: str = ""
    reconciles: int = 0
    updates_written: int = 0
    primary_changes: int = 0
    #: How the switch's loaded P4Info differs from the target's ("" when it matches or none is loaded).
    mismatch: str = ""
    #: job id -> the epoch the switch held for it at the last reconcile that left it equal to the store.
    installed: dict[int, int] = field(default_factory=dict)
    #: False while a connected switch does not answer the probe (a hung or stopped process keeps its
    #: connection open); ``silent_since`` is when it stopped (time.monotonic()).
    answering: bool = True
    silent_since: float = 0.0


@dataclass(frozen=True)
class SessionContext:
    """What every switch's session of one controller shares: the target (its pipeline), the job store and
    the topology, the election id (a controller is primary or backup for the fabric as a whole), how often
    a session reconciles unasked, how it retries a switch that is away, how it dials (TLS) and whom it
    tells that a switch's state changed."""

    target: Target
    store: JobStore
    topology: Topology | None
    election_id: int = 1
    reconcile_interval: float = 10.0
    backoff: tuple[float, float] = (0.2, 5.0)
    tls: TlsConfig | None = None
    on_change: Callable[[], None] = lambda: None


class SwitchSession:
    def __init__(
        self,
        context: SessionContext,
        address: str,
        *,
        device_id: int = 1,
        name: str = SINGLE,
        on_renewed: Callable[[dict[int, int]], None] = lambda renewed: None,
    ) -> None:
        self.context = context
        self.target, self.store, self.topology = context.target, context.store, context.topology
        self.address = address
        self.device_id = device_id
        self.name = name
        self.on_renewed = on_renewed
        self.status = SwitchStatus()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._done = threading.Condition()
        self._requested = 0  # reconcile requests so far
        self._served = 0  # requests covered by a finished reconcile
        self._client: P4RuntimeClient | None = None
        self._thread = threading.Thread(target=self._run, name=f"switch-session-{name}", daemon=True)
        self._prober = threading.Thread(target=self._probe, name=f"switch-probe-{name}", daemon=True)

    @property
    def election_id(self) -> int:
        return self.context.election_id

    # -- control --
    def start(self) -> None:
        self._thread.start()
        self._prober.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=15)
        self._prober.join(timeout=PROBE_PERIOD_S + PROBE_TIMEOUT_S + 1)

    def request_reconcile(self) -> int:
        with self._done:
            self._requested += 1
            ticket = self._requested
        self._wake.set()
        return ticket

    def sync(self, timeout: float) -> bool:
        """Reconcile now and wait (at most ``timeout`` s) until the switch equals the store; False when it
        could not be done in time (switch away, not primary)."""
        return self.wait_served(self.request_reconcile(), timeout)

    def wait_served(self, ticket: int, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until a reconcile requested as ``ticket`` has finished."""
        if not (self.status.connected and self.status.primary):
            return False  # it will reach the switch when this controller drives it again
        deadline = time.monotonic() + timeout
        with self._done:
            while self._served < ticket:
                left = deadline - time.monotonic()
                if left <= 0 or not self._done.wait(left):
                    return False
        return True

    def read_counters(self) -> dict[int, list[int]] | None:
        """Packet counts of ``lhc_stats`` per job index (NUM_STATS each); None when the switch is away."""
        client = self._client
        if client is None or not self.status.connected or not self.status.answering:
            return None
        try:
            cells = client.read_counter("LhcIngress.lhc_stats", timeout=COUNTER_READ_S)
        except P4RuntimeError as exc:
            log.info("counter read failed: %s", exc)
            return None
        rows: dict[int, list[int]] = {}
        for index, value in cells.items():
            rows.setdefault(index // c.NUM_STATS, [0] * c.NUM_STATS)[index % c.NUM_STATS] = value.packets
        return rows

    # -- the probe's thread --
    def _probe(self) -> None:
        """Ask the connected switch for one cheap answer every period: a switch that stops answering is
        marked so (its jobs are no longer installed; counter reads skip it) within a period and a timeout;
        when it answers again, its jobs get new epochs (what was in flight during the silence is stale, and
        workers that left it for the hosts see an epoch they can return under)."""
        while not self._stop.wait(PROBE_PERIOD_S):
            client = self._client
            if client is None or not self.status.connected:
                self.status.answering = True  # away is said by ``connected``
                continue
            answering = client.answers(PROBE_TIMEOUT_S)
            if client is not self._client or answering == self.status.answering:
                continue  # reconnected meanwhile: the old connection's silence says nothing
            self.status.answering = answering
            who = self.address if self.name == SINGLE else f"{self.name} ({self.address})"
            if not answering:
                self.status.silent_since = time.monotonic()
                self.status.installed = {}
                log.warning("switch %s: not answering (no P4Runtime reply within %g s)", who, PROBE_TIMEOUT_S)
            else:
                log.warning("switch %s: answering again after %.1f s", who,
                            time.monotonic() - self.status.silent_since)
                if self.status.primary:
                    renewed = self.store.renew_epochs(self._touches)
                    self.on_renewed(renewed)
                self.request_reconcile()
            self.context.on_change()

    # -- the thread --
    @property
    def cookie_key(self) -> str:
        """The store's key for the cookie of the pipeline pushed to this switch."""
        return COOKIE_KEY if self.name == SINGLE else f"{COOKIE_KEY}:{self.name}"

    def _touches(self, job: JobRecord) -> bool:
        return self.name in job_switches(job, self.topology)

    def _set_state(self, state: str, error: str = "") -> None:
        """Record what the session is doing; log it when it changes (warnings carry the error)."""
        who = self.address if self.name == SINGLE else f"{self.name} ({self.address})"
        if error and (state, error) != (self.status.state, self.status.last_error):
            log.warning("switch %s: %s: %s", who, state, error)
        elif not error and state != self.status.state:
            log.info("switch %s: %s", who, state)
        self.status.state = state
        if error:
            self.status.last_error = error
        self.context.on_change()

    def _run(self) -> None:
        delay = self.context.backoff[0]
        while not self._stop.is_set():
            client = P4RuntimeClient(
                self.address, self.device_id, self.election_id, self.target.p4info, timeout=5.0,
                tls=self.context.tls,
            )
            client.on_arbitration = self._on_arbitration
            client.on_stream_lost = self._on_stream_lost
            self._lost.clear()
            try:
                client.connect(require_primary=False)
            except P4RuntimeError as exc:
                self._set_state("unreachable; reconnecting with backoff", str(exc).splitlines()[0])
                self._stop.wait(delay)
                delay = min(delay * 2, self.context.backoff[1])
                continue
            delay = self.context.backoff[0]
            # A new connection answered its handshake: a silence the probe saw on the old one is over
            # without an "answering again" (that would renew every job's epoch a second time, after the
            # renewal this connection's pipeline check makes where the switch restarted).
            self.status.answering = True
            self._client = client
            self.status.connected = True
            try:
                self._serve(client)
            except Exception as exc:  # a bug must not end the session: say so, then start over
                log.exception("switch session failed")
                self._set_state("internal error; reconnecting", f"{type(exc).__name__}: {exc}")
                self._stop.wait(self.context.backoff[1])
            finally:
                self._client = None
                self.status.connected = self.status.primary = False
                self.status.installed = {}  # unknown until the next reconcile
                client.close()
                self._release_waiters()
        self._set_state("stopped")

    def _on_arbitration(self, primary: bool) -> None:
        self.status.primary_changes += 1
        self._wake.set()

    def _on_stream_lost(self, error: BaseException) -> None:
        self._lost.set()
        self._wake.set()

    def _serve(self, client: P4RuntimeClient) -> None:
        """While connected: prepare and reconcile whenever woken, as primary; observe as backup."""
        prepared = False
        while not self._stop.is_set() and not self._lost.is_set():
            self._wake.clear()
            with self._done:
                ticket = self._requested
            self.status.primary = client.is_primary
            try:
                if client.is_primary:
                    if not prepared:
                        prepared = self._prepare(client)
                    if prepared:
                        self._reconcile(client, write=True)
                else:
                    prepared = False
                    self._set_state("backup: another controller is primary; not writing")
                    self._reconcile(client, write=False)
            except P4RuntimeError as exc:
                self._set_state("switch error; will retry", " ".join(str(exc).split()))
                if exc.code == grpc.StatusCode.UNAVAILABLE:
                    return
                prepared = prepared and exc.code != grpc.StatusCode.FAILED_PRECONDITION
                self._wake.wait(self.context.backoff[1])  # retry sooner than the next periodic pass
                continue
            else:
                with self._done:
                    self._served = max(self._served, ticket)
                    self._done.notify_all()
            self._wake.wait(self.context.reconcile_interval)
        if self._lost.is_set():
            self._set_state("connection lost; reconnecting", "the P4Runtime stream ended")

    def _release_waiters(self) -> None:
        with self._done:
            self._done.notify_all()

    def _prepare(self, client: P4RuntimeClient) -> bool:
        """Check the loaded pipeline (push ours when there is none). A switch that does not run the
        pipeline this store pushed lost its state: every job gets a new epoch before repopulation."""
        loaded = client.get_pipeline()
        stored_cookie = self.store.meta(self.cookie_key)
        if loaded is not None:
            problems = pipeline_differences(self.target.p4info.p4info, loaded[0])
            self.status.mismatch = "; ".join(problems)
            if problems:
                self._set_state(
                    "pipeline mismatch: not writing",
                    "; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
                )
                return False
            if stored_cookie and loaded[1] == stored_cookie:
                self._set_state("primary: pipeline verified (cookie matches)")
                return True
        # Push first, then renew: a crash in between leaves the old cookie, so the next start renews again.
        cookie = secrets.randbits(63) or 1
        if loaded is None:
            client.set_pipeline(self.target.p4info, self.target.device_config, cookie=cookie)
            what = "had no pipeline: pushed it"
        else:
            try:
                client.set_pipeline(
                    self.target.p4info,
                    self.target.device_config,
                    cookie=cookie,
                    action=_SET.RECONCILE_AND_COMMIT,
                )
            except P4RuntimeError as exc:
                if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                client.set_pipeline(self.target.p4info, self.target.device_config, cookie=cookie)
            what = "runs a pipeline this store did not push: re-tagged it"
        if loaded is None and self.name == SINGLE:
            # A freshly loaded pipeline starts with zeroed registers. In a fabric the marks also stand for
            # the other switches' registers (a job holds one range on all of them): they stay.
            self.store.forget_slot_epochs()
        renewed = self.store.renew_epochs(self._touches)
        self.store.set_meta(self.cookie_key, cookie)
        self._set_state(f"primary: switch {what}; new epochs for {len(renewed)} job(s)")
        if renewed:
            self.on_renewed(renewed)
        return True

    def _reconcile(self, client: P4RuntimeClient, *, write: bool) -> None:
        jobs = self.store.jobs()
        desired = desired_state(jobs, self.topology, self.name, data_plane=self.target.data_plane)
        actual = read_state(client, self.target)
        updates = plan(desired, actual, self.target)
        if updates and write:
            log.info("reconcile: writing %d update(s)", len(updates))
            try:
                client.write(updates)
            except P4RuntimeError as exc:
                # Per-update errors: the others were applied. None: the call itself failed.
                self.status.updates_written += len(updates) - len(exc.errors) if exc.errors else 0
                raise
            self.status.updates_written += len(updates)
            actual = desired
        self.status.reconciles += 1
        on_switch = actual.job_ids()
        self.status.installed = (
            {j.job_id: j.epoch for j in jobs if j.job_id in on_switch} if (not updates or write) else {}
        )
        if write:
            self._set_state("primary: switch equals the store")
        self.context.on_change()
