"""The job store: SQLite (stdlib, WAL), one transaction per admission, join, leave, failure and delete.

Everything the controller must remember across a restart lives here: jobs, members, the epoch and job-id
counters, the epoch each slot range last carried, and the cookie of the pipeline this controller pushed.
Nothing is cached in memory, so two controllers sharing the file (primary and backup) see one state, and
a controller killed at any instant leaves either the whole of an operation or none of it. Write
transactions start with ``BEGIN IMMEDIATE`` so that concurrent writers queue instead of failing late.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from controller.epochs import EPOCH_LIMIT, EpochsExhausted, next_epoch
from controller.records import JobRecord, JobState, MemberRecord
from controller.slots import SlotPool, SlotPoolError, SlotRange
from lhc_ina import constants as c
from lhc_ina.jobservice import errors

SCHEMA_VERSION = 3
DB_NAME = "controller.sqlite3"

_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE jobs (
    job_id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    state TEXT NOT NULL CHECK (state IN ('PENDING', 'ACTIVE', 'FAILED')),
    workers INTEGER NOT NULL,
    slot_base INTEGER NOT NULL,
    slot_count INTEGER NOT NULL,
    lanes INTEGER NOT NULL,
    job_index INTEGER NOT NULL UNIQUE,
    epoch INTEGER NOT NULL,
    join_timeout_s REAL NOT NULL,
    heartbeat_timeout_s REAL NOT NULL,
    created_at REAL NOT NULL,
    failure TEXT NOT NULL DEFAULT '',
    epoch_changes INTEGER NOT NULL DEFAULT 0,
    hosts TEXT NOT NULL DEFAULT ''  -- the expected workers' names, in rank order, comma-separated
);
CREATE TABLE members (
    job_id INTEGER NOT NULL REFERENCES jobs (job_id) ON DELETE CASCADE,
    rank INTEGER NOT NULL,
    name TEXT NOT NULL,
    ip TEXT NOT NULL,
    udp_port INTEGER NOT NULL,
    mac TEXT NOT NULL,
    switch_port INTEGER NOT NULL,
    left_job INTEGER NOT NULL DEFAULT 0,
    switch TEXT NOT NULL DEFAULT '',  -- the switch (a fabric's leaf) the worker sits under
    PRIMARY KEY (job_id, rank),
    UNIQUE (job_id, ip, udp_port),
    UNIQUE (job_id, name)
);
-- Every epoch given to a slot range since the switch's registers were last reset (controller.epochs).
CREATE TABLE slot_marks (first INTEGER NOT NULL, count INTEGER NOT NULL, epoch INTEGER NOT NULL);
"""
#: Version 2: each job's credential, as the SHA-256 of its secret (controller.auth); never the secret.
_CREDENTIALS = """
CREATE TABLE job_credentials (
    job_id INTEGER PRIMARY KEY REFERENCES jobs (job_id) ON DELETE CASCADE,
    digest TEXT NOT NULL
)
"""
#: Version 3: the switch each member sits under (a leaf of a fabric), and the topology the controller was
#: last started with (the JSON document), so that a restart without --topology drives the same switches.
_MEMBER_SWITCH = "ALTER TABLE members ADD COLUMN switch TEXT NOT NULL DEFAULT ''"
_TOPOLOGY = (
    "CREATE TABLE IF NOT EXISTS topology (id INTEGER PRIMARY KEY CHECK (id = 1), document TEXT NOT NULL)"
)

_JOB_COLUMNS = (
    "job_id, name, state, workers, slot_base, slot_count, lanes, job_index, epoch, join_timeout_s, "
    "heartbeat_timeout_s, created_at, failure, epoch_changes, hosts"
)


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/lhc-controller`` (``~/.local/state/lhc-controller``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "lhc-controller"


class JobStore:
    """Jobs in one SQLite file. Thread-safe (one connection behind a lock)."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: all of it commits or none of it (also on kill -9)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextmanager
    def snapshot(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: several SELECTs see one state, even while another process writes."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")

    def _migrate(self) -> None:
        with self.transaction() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                # Statement by statement: executescript() would COMMIT the transaction first.
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
            if version in (0, 1):  # version 1's jobs have no credential: only the operator acts on them
                db.execute(_CREDENTIALS)
            if version in (0, 1, 2):  # before version 3 every member sat under the one switch
                columns = {row[1] for row in db.execute("PRAGMA table_info(members)")}
                if "switch" not in columns:
                    db.execute(_MEMBER_SWITCH)
                db.execute(_TOPOLOGY)
            elif version != SCHEMA_VERSION:
                raise errors.precondition(
                    f"{self.path}: schema version {version}, this controller reads {SCHEMA_VERSION}"
                )
            db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    # -- meta --
    def meta(self, key: str, default: int = 0) -> int:
        with self.snapshot() as db:
            return _get_meta(db, key, default)

    def set_meta(self, key: str, value: int) -> None:
        with self.transaction() as db:
            _set_meta(db, key, value)

    # -- topology --
    def topology_document(self) -> str | None:
        """The topology JSON the controller was last started with; None when it never had one."""
        with self.snapshot() as db:
            row = db.execute("SELECT document FROM topology WHERE id = 1").fetchone()
            return None if row is None else row[0]

    def save_topology(self, document: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO topology (id, document) VALUES (1, ?) "
                       "ON CONFLICT (id) DO UPDATE SET document = excluded.document", (document,))

    # -- reads --
    def jobs(self) -> list[JobRecord]:
        with self.snapshot() as db:
            rows = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs ORDER BY job_id").fetchall()
            return [self._record(db, row) for row in rows]

    def job(self, ref: str) -> JobRecord:
        """A job by name or decimal id; NOT_FOUND names what was asked for."""
        with self.snapshot() as db:
            return self._find(db, ref)

    def credential_digest(self, job_id: int) -> str | None:
        """The digest of job ``job_id``'s credential; None when the job is gone or predates credentials."""
        with self.snapshot() as db:
            row = db.execute("SELECT digest FROM job_credentials WHERE job_id = ?", (job_id,)).fetchone()
            return None if row is None else row[0]

    def slot_usage(self) -> tuple[int, int]:
        """(free slots, total slots)."""
        with self._lock:
            return _pool(self._db).free_slots, c.MAX_SLOTS

    # -- writes --
    def create_job(
        self,
        name: str,
        workers: int,
        slots: int,
        lanes: int,
        join_timeout_s: float,
        heartbeat_timeout_s: float,
        now: float,
        hosts: tuple[str, ...] = (),
        credential_digest: str = "",
    ) -> JobRecord:
        """Admit a job: id, counter row, slot range, a fresh epoch and (given) its credential's digest, in
        one transaction: no job is ever left without the credential its creator was handed."""
        with self.transaction() as db:
            if db.execute("SELECT 1 FROM jobs WHERE name = ?", (name,)).fetchone():
                raise errors.exists(f"a job named {name!r} exists")
            used_rows = {r[0] for r in db.execute("SELECT job_index FROM jobs")}
            job_index = next((i for i in range(1, c.MAX_JOBS) if i not in used_rows), None)
            if job_index is None:
                raise errors.exhausted(f"the switch counts {c.MAX_JOBS - 1} jobs and all are admitted")
            try:
                chosen = _pool(db).allocate(slots)
            except SlotPoolError as exc:
                raise errors.exhausted(f"job {name!r} wants {slots} slots: {exc}") from None
            job_id = _next_job_id(db)
            epoch = _fresh_epoch(db, [chosen])
            row = (job_id, name, JobState.PENDING.value, workers, chosen.base, chosen.count, lanes, job_index,
                   epoch, join_timeout_s, heartbeat_timeout_s, now, "", 0, ",".join(hosts))  # fmt: skip
            db.execute(f"INSERT INTO jobs ({_JOB_COLUMNS}) VALUES ({','.join('?' * len(row))})", row)
            if credential_digest:
                db.execute("INSERT INTO job_credentials (job_id, digest) VALUES (?, ?)",
                           (job_id, credential_digest))
            return self._find(db, str(job_id))

    def join(
        self, ref: str, member: MemberRecord, check: Callable[[JobRecord, MemberRecord], None]
    ) -> tuple[JobRecord, int]:
        """Add ``member`` with the lowest free rank (its own is ignored); returns the job and the rank.
        ``check`` (admission's) sees the job as this transaction does, after the duplicate checks. The job
        turns ACTIVE when its last worker joins."""
        with self.transaction() as db:
            job = self._find(db, ref)
            if job.state is JobState.FAILED:
                raise errors.precondition(f"job {job.name!r} has failed: {job.failure}")
            for m in job.members:
                if (m.ip, m.udp_port) == (member.ip, member.udp_port):
                    again = "already joined" if m.name == member.name else f"is taken by {m.describe()}"
                    raise errors.exists(f"job {job.name!r}: {member.address} {again} (rank {m.rank})")
                if m.name == member.name:
                    raise errors.exists(
                        f"job {job.name!r}: a worker named {member.name!r} already joined ({m.describe()})"
                    )
            if len(job.members) >= job.workers:
                raise errors.precondition(f"job {job.name!r} has all its {job.workers} workers")
            if job.hosts:
                if member.name not in job.hosts:
                    expected = ", ".join(job.hosts)
                    raise errors.invalid(f"job {job.name!r} expects {expected}; {member.name!r} is not one")
                rank = job.hosts.index(member.name)
            else:
                taken = {m.rank for m in job.members}
                rank = min(r for r in range(job.workers) if r not in taken)
            check(job, replace(member, rank=rank))
            db.execute(
                "INSERT INTO members (job_id, rank, name, ip, udp_port, mac, switch_port, switch) "
                "VALUES (?,?,?,?,?,?,?,?)",
                (job.job_id, rank, member.name, member.ip, member.udp_port, member.mac, member.switch_port,
                 member.switch),
            )
            if len(job.members) + 1 == job.workers:
                db.execute("UPDATE jobs SET state = ? WHERE job_id = ?", (JobState.ACTIVE.value, job.job_id))
            return self._find(db, str(job.job_id)), rank

    def leave(self, ref: str, rank: int) -> bool:
        """Mark a member as gone; the last one to leave ends (deletes) the job. Returns whether it ended."""
        with self.transaction() as db:
            job = self._find(db, ref)
            member = job.member(rank)
            if member is None:
                raise errors.not_found(f"job {job.name!r} has no rank {rank}")
            if job.state is JobState.PENDING:
                # Before the job starts a leave frees the rank for the next join; the others keep theirs.
                db.execute("DELETE FROM members WHERE job_id = ? AND rank = ?", (job.job_id, rank))
                return False
            db.execute("UPDATE members SET left_job = 1 WHERE job_id = ? AND rank = ?", (job.job_id, rank))
            if all(m.left or m.rank == rank for m in job.members):
                db.execute("DELETE FROM jobs WHERE job_id = ?", (job.job_id,))
                return True
            return False

    def delete(self, ref: str) -> JobRecord:
        with self.transaction() as db:
            job = self._find(db, ref)
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job.job_id,))
            return job

    def fail(self, job_id: int, reason: str) -> bool:
        """Mark a live job FAILED with ``reason``; False when it is gone or already failed."""
        with self.transaction() as db:
            cursor = db.execute(
                "UPDATE jobs SET state = ?, failure = ? WHERE job_id = ? AND state != ?",
                (JobState.FAILED.value, reason, job_id, JobState.FAILED.value),
            )
            return cursor.rowcount == 1

    def forget_slot_epochs(self) -> None:
        """The switch's registers were reset (it came back without a pipeline): no slot holds any epoch
        but those of the jobs about to be (re)installed, which ``renew_epochs`` then marks."""
        with self.transaction() as db:
            db.execute("DELETE FROM slot_marks")

    def renew_epochs(self, touches: Callable[[JobRecord], bool] = lambda job: True) -> dict[int, int]:
        """A fresh epoch for every ACTIVE job (a switch lost its state) that ``touches`` it: job id -> new
        epoch, the same on every switch the job spans. Agents may still have packets of the old epoch in
        flight; with a new one they cannot start or join a round in the fresh registers. Pending jobs have
        no traffic yet and keep theirs."""
        with self.transaction() as db:
            renewed = {}
            active = [self._record(db, row) for row in db.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE state = ? ORDER BY job_id", (JobState.ACTIVE.value,)
            ).fetchall()]
            for job_id, base, count in [(j.job_id, j.slot_base, j.slot_count) for j in active if touches(j)]:
                epoch = _fresh_epoch(db, [SlotRange(base, count)])
                db.execute(
                    "UPDATE jobs SET epoch = ?, epoch_changes = epoch_changes + 1 WHERE job_id = ?",
                    (epoch, job_id),
                )
                renewed[job_id] = epoch
            return renewed

    # -- helpers --
    def _find(self, db: sqlite3.Connection, ref: str) -> JobRecord:
        row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE name = ?", (ref,)).fetchone()
        if row is None and ref.isdigit():
            row = db.execute(f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ?", (int(ref),)).fetchone()
        if row is None:
            raise errors.not_found(f"no job named {ref!r}")
        return self._record(db, row)

    @staticmethod
    def _record(db: sqlite3.Connection, row: tuple) -> JobRecord:
        members = tuple(
            MemberRecord(rank, name, ip, port, mac, switch_port, bool(left), switch)
            for rank, name, ip, port, mac, switch_port, left, switch in db.execute(
                "SELECT rank, name, ip, udp_port, mac, switch_port, left_job, switch FROM members "
                "WHERE job_id = ? ORDER BY rank",
                (row[0],),
            )
        )
        values = list(row)
        values[2] = JobState(values[2])
        values[-1] = tuple(values[-1].split(",")) if values[-1] else ()
        return JobRecord(*values, members=members)


def _set_meta(db: sqlite3.Connection, key: str, value: int) -> None:
    db.execute(
        "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = ?",
        (key, value, value),
    )


def _get_meta(db: sqlite3.Connection, key: str, default: int) -> int:
    row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return default if row is None else int(row[0])


def _pool(db: sqlite3.Connection) -> SlotPool:
    taken = [SlotRange(b, n) for b, n in db.execute("SELECT slot_base, slot_count FROM jobs")]
    return SlotPool(c.MAX_SLOTS, taken)


def _next_job_id(db: sqlite3.Connection) -> int:
    """Job ids count up (1..65535, then wrap), skipping ids in use, so a deleted job's id is not at once
    reused: its stale packets cannot be mistaken for the next job's."""
    used = {r[0] for r in db.execute("SELECT job_id FROM jobs")}
    candidate = _get_meta(db, "next_job_id", 1)
    for _ in range(1 << 16):
        if candidate not in used:
            _set_meta(db, "next_job_id", candidate % 0xFFFF + 1)
            return candidate
        candidate = candidate % 0xFFFF + 1
    raise errors.exhausted("every job id is in use")


def _fresh_epoch(db: sqlite3.Connection, ranges: list[SlotRange]) -> int:
    marks = [(SlotRange(f, n), e) for f, n, e in db.execute("SELECT first, count, epoch FROM slot_marks")]
    live = {r[0] for r in db.execute("SELECT epoch FROM jobs")}
    try:
        epoch = next_epoch(_get_meta(db, "next_epoch", 1), ranges, marks, live)
    except EpochsExhausted as exc:
        raise errors.exhausted(str(exc)) from None
    _set_meta(db, "next_epoch", epoch % (EPOCH_LIMIT - 1) + 1)
    for r in ranges:
        db.execute("INSERT INTO slot_marks (first, count, epoch) VALUES (?,?,?)", (r.base, r.count, epoch))
    return epoch
