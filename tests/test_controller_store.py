"""The job store and its parts: the slot free list, fresh epochs, transactions, and kill -9 at any point."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controller.epochs import EpochsExhausted, next_epoch
from controller.integrity import store_problems
from controller.records import JobState, MemberRecord
from controller.slots import SlotPool, SlotPoolError, SlotRange
from controller.store import DB_NAME, SCHEMA_VERSION, JobStore
from lhc_ina import constants as c
from lhc_ina.jobservice.errors import ControllerError

REPO = Path(__file__).resolve().parent.parent


def _member(port: int, name: str = "") -> MemberRecord:
    return MemberRecord(0, name or f"w{port}", "127.0.0.1", port, "02:00:7f:00:00:01", 1)


def _no_check(job, member) -> None:
    return None


# --- slots ---------------------------------------------------------------------------------------
def test_slot_pool_first_fit_and_coalescing():
    pool = SlotPool(100)
    a, b, d = pool.allocate(10), pool.allocate(20), pool.allocate(30)
    assert (a, b, d) == (SlotRange(0, 10), SlotRange(10, 20), SlotRange(30, 30))
    pool.release(b)
    assert pool.allocate(15) == SlotRange(10, 15)  # first fit reuses the hole
    pool.release(SlotRange(10, 15))
    pool.release(a)
    assert pool.free == [SlotRange(0, 30), SlotRange(60, 40)]  # a and b's hole merged
    pool.release(d)
    assert pool.free == [SlotRange(0, 100)]
    with pytest.raises(SlotPoolError, match="no 101 consecutive free slots: 100 of 100 free"):
        pool.allocate(101)
    with pytest.raises(SlotPoolError, match="overlap"):
        pool.release(SlotRange(5, 2))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 40)), max_size=40))
def test_slot_pool_never_overlaps_or_leaks(ops):
    pool, held = SlotPool(256), []
    for allocate, size in ops:
        if allocate or not held:
            try:
                held.append(pool.allocate(size))
            except SlotPoolError:
                assert pool.largest_free < size
        else:
            pool.release(held.pop(size % len(held)))
        covered = sorted([*held, *pool.free])
        assert sum(r.count for r in covered) == 256
        assert all(x.end <= y.base for x, y in itertools.pairwise(covered))
        assert all(x.end < y.base for x, y in itertools.pairwise(pool.free))  # coalesced


# --- epochs --------------------------------------------------------------------------------------
def test_epoch_skips_what_the_range_may_hold_and_wraps():
    marks = [(SlotRange(0, 10), 5), (SlotRange(10, 10), 6)]
    assert next_epoch(5, [SlotRange(0, 4)], marks, set()) == 6  # slot 0..9 may hold 5
    assert next_epoch(5, [SlotRange(10, 4)], marks, set()) == 5  # those slots never held 5
    assert next_epoch(65535, [SlotRange(0, 4)], [(SlotRange(0, 4), 65535)], {1}) == 2  # wraps, skips 0 and 1
    # A slot keeps the epoch of the last job that sent to it, not of the last job given its range.
    marks.append((SlotRange(0, 20), 7))
    assert next_epoch(5, [SlotRange(0, 4)], marks, set()) == 6
    with pytest.raises(EpochsExhausted, match=r"slots 0\.\.3"):
        next_epoch(1, [SlotRange(0, 4)], [(SlotRange(0, 4), e) for e in range(1, 1 << 16)], set())


def test_readmitted_range_never_gets_an_epoch_its_slots_held(tmp_path):
    store = JobStore(tmp_path / DB_NAME)
    seen = []
    for i in range(5):
        job = store.create_job(f"j{i}", 1, 64, c.LANES, 10, 10, time.time())
        assert job.slot_base == 0
        seen.append(job.epoch)
        store.delete(job.name)
    assert len(set(seen)) == 5
    # Force the counter to wrap onto epochs the range held: they are skipped.
    store.set_meta("next_epoch", seen[0])
    assert store.create_job("wrapped", 1, 64, c.LANES, 10, 10, time.time()).epoch not in seen


# --- store operations ----------------------------------------------------------------------------
def test_store_lifecycle_and_persistence(tmp_path):
    path = tmp_path / DB_NAME
    store = JobStore(path)
    job = store.create_job("a", 2, 8, c.LANES, 30, 10, time.time())
    assert (job.state, job.job_index, job.mcast_grp, job.slot_base) == (JobState.PENDING, 1, 1, 0)
    store.join("a", _member(4000), _no_check)
    job, rank = store.join("a", _member(4001), _no_check)
    assert rank == 1 and job.state is JobState.ACTIVE
    store.close()
    reopened = JobStore(path)
    assert reopened.job("a") == job and reopened.job(str(job.job_id)) == job
    renewed = reopened.renew_epochs()
    assert renewed[job.job_id] != job.epoch and reopened.job("a").epoch_changes == 1
    assert store_problems(reopened) == []
    with pytest.raises(ControllerError) as info:
        reopened.job("b")
    assert info.value.code == grpc.StatusCode.NOT_FOUND


def test_job_index_rows_run_out_with_a_reason(tmp_path):
    store = JobStore(tmp_path / DB_NAME)
    for i in range(1, c.MAX_JOBS):
        assert store.create_job(f"j{i}", 1, 1, c.LANES, 10, 10, 0).job_index == i
    with pytest.raises(ControllerError, match=f"counts {c.MAX_JOBS - 1} jobs"):
        store.create_job("one-too-many", 1, 1, c.LANES, 10, 10, 0)


def test_a_failed_check_leaves_no_trace(tmp_path):
    store = JobStore(tmp_path / DB_NAME)
    store.create_job("a", 2, 8, c.LANES, 30, 10, 0)

    def refuse(job, member):
        raise ControllerError(grpc.StatusCode.INVALID_ARGUMENT, "no")

    with pytest.raises(ControllerError):
        store.join("a", _member(4000), refuse)
    assert store.job("a").members == ()


def test_newer_schema_is_refused(tmp_path):
    import sqlite3

    db = sqlite3.connect(tmp_path / DB_NAME)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(ControllerError, match="schema version"):
        JobStore(tmp_path / DB_NAME)


# --- kill -9 -------------------------------------------------------------------------------------
_CHURN = textwrap.dedent("""
    import random, sys, time
    from controller.records import MemberRecord
    from controller.store import JobStore
    store = JobStore(sys.argv[1])
    rng = random.Random(int(sys.argv[2]))
    print("ready", flush=True)
    n = 0
    while True:
        n += 1
        jobs = store.jobs()
        op = rng.random()
        try:
            if op < 0.4 or not jobs:
                store.create_job(f"j{sys.argv[2]}-{n}", rng.randint(1, 4), rng.randint(1, 300), 64, 60, 60,
                                 time.time())
            elif op < 0.8:
                job = rng.choice(jobs)
                store.join(job.name, MemberRecord(0, f"w{n}", "127.0.0.1", 1000 + n, "02:00:00:00:00:01", 1),
                           lambda job, member: None)
            elif op < 0.9:
                store.renew_epochs()
            else:
                store.delete(rng.choice(jobs).name)
        except Exception as exc:  # refusals (slots exhausted, job full) are part of the churn
            if type(exc).__name__ != "ControllerError":
                raise
""")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_kill_9_at_any_point_leaves_a_consistent_store(tmp_path):
    path = tmp_path / DB_NAME
    env = dict(os.environ, PYTHONPATH=str(REPO))
    rng = random.Random(3)
    for round_ in range(12):
        proc = subprocess.Popen(
            [sys.executable, "-c", _CHURN, str(path), str(round_)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
        time.sleep(rng.uniform(0.05, 0.6))
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        store = JobStore(path)
        assert store_problems(store) == [], f"after kill -9 #{round_}"
        free, total = store.slot_usage()
        assert free == total - sum(j.slot_count for j in store.jobs())
        store.close()
    store = JobStore(path)
    assert store.jobs(), "the churn never committed anything: the test proves nothing"
