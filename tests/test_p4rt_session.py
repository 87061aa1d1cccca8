"""``P4RuntimeClient``'s facts of life against a real lhc-softswitch process: pipeline cookies, losing and
regaining primaryship, and the device going away (the stream's end is noticed; primaryship goes with it)."""

from __future__ import annotations

import threading
import time

import pytest

from lhc_ina.p4info import P4InfoIndex
from lhc_ina.p4rt import P4RuntimeClient, P4RuntimeError
from lhc_launch.processes import SoftswitchProcess

INDEX = P4InfoIndex.from_file()


@pytest.mark.timeout(120)
def test_cookie_arbitration_callbacks_and_a_lost_stream():
    with SoftswitchProcess() as sw:
        first = P4RuntimeClient(sw.grpc_addr, election_id=5, p4info=INDEX, timeout=10)
        changes: list[bool] = []
        lost = threading.Event()
        first.on_arbitration = changes.append
        first.on_stream_lost = lambda error: lost.set()
        first.connect()
        assert first.get_pipeline() is None  # the spec's answer before any Set: no config
        first.set_pipeline(INDEX, cookie=1234)
        p4info, cookie = first.get_pipeline()
        assert cookie == 1234 and [t.preamble.name for t in p4info.tables] == [
            t.preamble.name for t in INDEX.p4info.tables]

        second = P4RuntimeClient(sw.grpc_addr, election_id=9, p4info=INDEX, timeout=10).connect()
        second.read_table("LhcIngress.jobs")
        assert second.is_primary
        _wait(lambda: changes == [True, False])
        assert not first.is_primary
        second.close()  # the primary leaves: the device gives primaryship back
        _wait(lambda: changes == [True, False, True])

        sw.kill()  # the device goes away
        assert lost.wait(30), "the stream's end was not noticed"
        assert not first.is_primary
        params = {"job_index": 1, "slot_base": 0, "slot_count": 1, "fan_in": 1, "mcast_grp": 1, "epoch": 1}
        entry = first.entities.table_entry("LhcIngress.jobs", {"hdr.lhc.job_id": 1}, "LhcIngress.set_job",
                                           params)
        with pytest.raises(P4RuntimeError):
            first.insert(entry)
        first.close()


def _wait(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)
