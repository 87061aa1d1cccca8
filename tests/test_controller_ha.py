"""Two controllers on one switch and one store (primary and backup), and kill -9 of a controller in the
middle of admissions."""

from __future__ import annotations

import random
import threading
import time

import grpc
import pytest

from controller.integrity import store_problems
from controller.store import DB_NAME, JobStore
from lhc_ina.jobservice.errors import ControllerError
from lhc_launch.processes import ControllerProcess
from tests.harness.controller import Worker, store_state, switch_state


def _wait(predicate, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.1)


@pytest.mark.timeout(180)
def test_backup_writes_nothing_and_takes_over_when_the_primary_dies(switch, tmp_path):
    worker = Worker()
    with ControllerProcess(switch, tmp_path, election_id=10) as primary:
        primary.wait_for_switch()
        primary.client.create_job("ha", workers=1, slots=4)
        worker.joined = primary.client.join("ha", ip="127.0.0.1", udp_port=worker.port)
        want = switch_state(switch)
        with ControllerProcess(switch, tmp_path, "--reconcile-interval", "0.5", election_id=5) as backup:
            backup.wait_for_switch(primary=False)
            _wait(lambda: backup.client.status("ha").installed, "backup sees the job on the switch")
            status = backup.client.switch_status()
            assert not status.primary and "backup" in status.state and status.updates_written == 0
            with pytest.raises(ControllerError) as info:
                backup.client.create_job("refused", workers=1)
            assert info.value.code == grpc.StatusCode.UNAVAILABLE and "backup" in info.value.message
            # The primary changes the switch; the backup keeps its hands off.
            primary.client.create_job("second", workers=1, slots=4)
            primary.client.join("second", ip="127.0.0.1", udp_port=worker.port + 1)
            assert backup.client.switch_status().updates_written == 0

            primary.kill()  # kill -9: the switch ends its stream and tells the backup
            backup.wait_for_switch(primary=True)
            status = backup.client.switch_status()
            # It took over a switch that already equals the shared store: no writes.
            assert status.updates_written == 0, status
            assert switch_state(switch) == store_state(tmp_path) and switch_state(switch) != want
            backup.client.delete_job("second")
            assert switch_state(switch) == want
            assert backup.client.switch_status().updates_written > 0
    worker.close()


@pytest.mark.timeout(180)
def test_primary_that_loses_primaryship_stops_writing_and_takes_it_back(switch, tmp_path):
    with ControllerProcess(switch, tmp_path, "--reconcile-interval", "0.5", election_id=5) as first:
        first.wait_for_switch()
        first.client.create_job("kept", workers=1, slots=4)
        first.client.join("kept", ip="127.0.0.1", udp_port=4000)
        written = first.client.switch_status().updates_written
        with ControllerProcess(switch, tmp_path, election_id=10) as higher:
            higher.wait_for_switch(primary=True)
            first.wait_for_switch(primary=False)
            assert "backup" in first.client.switch_status().state
            with pytest.raises(ControllerError) as info:
                first.client.create_job("refused", workers=1)
            assert info.value.code == grpc.StatusCode.UNAVAILABLE
            assert higher.client.switch_status().updates_written == 0  # shared store: nothing to change
            higher.client.create_job("added", workers=1, slots=4)
            higher.client.join("added", ip="127.0.0.1", udp_port=4001)
        # The higher one left: the switch gives primaryship back and the first one carries on.
        first.wait_for_switch(primary=True)
        _wait(lambda: first.client.status("added").installed, "the first controller sees the new job")
        assert first.client.switch_status().updates_written == written
        assert switch_state(switch) == store_state(tmp_path)
        first.client.delete_job("added")
        assert first.client.switch_status().updates_written > written


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_kill_9_during_admissions_leaves_a_consistent_store(switch, tmp_path):
    rng = random.Random(9)
    for round_ in range(4):
        ctl = ControllerProcess(switch, tmp_path)
        ctl.wait_for_switch()
        stop = threading.Event()

        def churn(client=ctl.client, round_=round_, stop=stop) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                name = f"r{round_}-{n}"
                try:
                    client.create_job(name, workers=2, slots=rng.randint(1, 100))
                    client.join(name, ip="127.0.0.1", udp_port=2000 + n)
                    client.join(name, ip="127.0.0.1", udp_port=3000 + n)
                    if n % 3 == 0:
                        client.delete_job(name)
                except ControllerError:
                    return  # the controller died under us

        threads = [threading.Thread(target=churn) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.3, 1.5))
        ctl.kill()
        stop.set()
        for t in threads:
            t.join(30)
        ctl.client.close()
        store = JobStore(tmp_path / DB_NAME)
        assert store_problems(store) == [], f"round {round_}"
        store.close()
    with ControllerProcess(switch, tmp_path) as ctl:
        ctl.wait_for_switch()
        assert ctl.client.list_jobs(), "no admission ever committed: the test proves nothing"
        assert switch_state(switch) == store_state(tmp_path)
