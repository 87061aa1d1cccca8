"""The reconcile plan without a switch: only the difference is written, in a data-plane-safe order."""

from __future__ import annotations

from dataclasses import replace

from p4.v1 import p4runtime_pb2 as p4v1

from controller.reconcile import SwitchState, desired_state, pipeline_differences, plan
from controller.records import JobState
from controller.targets import load_target
from lhc_ina.p4rt import decode_table_entry
from tests.harness.controller import two_worker_job

TARGET = load_target("softswitch")
JOBS = "LhcIngress.jobs"


def _described(updates: list[p4v1.Update]) -> list[tuple[str, str]]:
    out = []
    for u in updates:
        kind = p4v1.Update.Type.Name(u.type)
        if u.entity.HasField("table_entry"):
            out.append((kind, decode_table_entry(TARGET.p4info, u.entity.table_entry).table))
        else:
            out.append((kind, "group"))
    return out


EMPTY = SwitchState(frozenset(), frozenset())


def test_a_job_is_installed_jobs_entry_last_and_removed_jobs_entry_first():
    want = desired_state([two_worker_job()], None)
    adds = _described(plan(want, EMPTY, TARGET))
    assert adds[0] == ("INSERT", "group") and adds[-1] == ("INSERT", JOBS) and len(adds) == 1 + 2 + 2 + 1
    removes = _described(plan(EMPTY, want, TARGET))
    assert removes[0] == ("DELETE", JOBS) and removes[-1] == ("DELETE", "group")
    assert plan(want, want, TARGET) == []  # equal: nothing to write


def test_an_epoch_change_is_one_modify():
    new, old = desired_state([two_worker_job(epoch=4)], None), desired_state([two_worker_job(epoch=3)], None)
    updates = plan(new, old, TARGET)
    assert _described(updates) == [("MODIFY", JOBS)]
    params = decode_table_entry(TARGET.p4info, updates[0].entity.table_entry).params
    assert params["epoch"] == 4


def test_pending_and_failed_jobs_are_not_on_the_switch():
    for state in (JobState.PENDING, JobState.FAILED):
        assert desired_state([replace(two_worker_job(), state=state)], None) == EMPTY


def test_pipeline_differences_name_the_entity():
    theirs = type(TARGET.p4info.p4info)()
    theirs.CopyFrom(TARGET.p4info.p4info)
    assert pipeline_differences(TARGET.p4info.p4info, theirs) == []
    theirs.tables[0].size += 1
    del theirs.actions[-1]
    problems = pipeline_differences(TARGET.p4info.p4info, theirs)
    assert any(TARGET.p4info.p4info.tables[0].preamble.name in p and "differs" in p for p in problems)
    assert any("has no action" in p for p in problems)
