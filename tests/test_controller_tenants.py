"""Tenants of one switch, with a real controller and softswitch over real gRPC: the operator's token
creates, deletes and reads everything; a job credential (handed out once by CreateJob) joins, heartbeats,
watches, reads and leaves its own job only, from its own address; credentials survive a restart and die
with their job; Watch streams are bounded and end on the controller's deadline."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from controller.auth import Caller, check_join_address
from controller.records import MemberRecord
from controller.store import DB_NAME, JobStore
from controller.topology import parse_topology
from host_agent.agent import Agent
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice import jobservice_pb2_grpc as pb_grpc
from lhc_ina.jobservice.client import WATCH_EXPIRED, JobClient
from lhc_ina.jobservice.errors import ControllerError
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.controller import refused

REPO = Path(__file__).resolve().parent.parent
OPERATOR = "operator-s3cret"
DENIED = grpc.StatusCode.PERMISSION_DENIED


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[tuple[SoftswitchProcess, ControllerProcess, Path]]:
    state = tmp_path_factory.mktemp("tenants")
    (state / "operator").write_text(OPERATOR + "\n")
    with (
        SoftswitchProcess() as sw,
        ControllerProcess(sw, state, "--token-file", str(state / "operator"), "--max-watches", "2",
                          "--watch-limit", "2", token=OPERATOR) as ctl,
    ):  # fmt: skip
        ctl.wait_for_switch()
        assert ctl.ready["auth"] == "credentials"
        yield sw, ctl, state


def _cli(ctl: ControllerProcess, token_file: Path, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", "--controller", ctl.listen, "--token-file", str(token_file),
         *argv], capture_output=True, text=True, cwd=REPO, timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


def test_a_job_credential_is_confined_to_its_job(stack, tmp_path):
    _, ctl, _ = stack
    operator = ctl.client
    a = operator.create_job("team-a", workers=2, slots=2)
    b = operator.create_job("team-b", workers=1, slots=2)
    assert a.job_credential.startswith(f"lhcjob.{a.job_id}.") and a.job_credential != b.job_credential
    with JobClient(ctl.listen, token=a.job_credential) as worker_a:
        joined = worker_a.join("team-a", ip="127.0.0.1", udp_port=4100, name="a0")
        assert worker_a.heartbeat("team-a", joined.rank).name == "team-a"
        assert [m.name for m in worker_a.status("team-a").members] == ["a0"]
        assert [j.name for j in worker_a.list_jobs()] == ["team-a"]  # B is not even listed
        for ref in ("team-b", str(b.job_id), "no-such-job"):  # whether B exists is not told either
            refused(lambda r=ref: worker_a.join(r, ip="127.0.0.1", udp_port=4101), DENIED,
                     "job 'team-a''s", f"may not join job {ref!r}")  # fmt: skip
            refused(lambda r=ref: worker_a.status(r), DENIED, f"may not read job {ref!r}")
        refused(lambda: worker_a.heartbeat("team-b", 0), DENIED, "team-a")
        refused(lambda: worker_a.leave("team-b", 0), DENIED, "team-a")
        refused(lambda: next(worker_a.watch("team-b", timeout=10)), DENIED, "may not watch job 'team-b'")
        for call in (lambda: worker_a.delete_job("team-b"), lambda: worker_a.delete_job("team-a")):
            refused(call, DENIED, "deleting a job needs the operator's credential")
        refused(lambda: worker_a.create_job("team-c", workers=1), DENIED, "creating a job")
        refused(lambda: worker_a.switch_status(), DENIED, "operator")

        # The credential is shown once: no other reply carries it, and the controller never logs it.
        assert not operator.status("team-a").job_credential
        assert not any(j.job_credential for j in operator.list_jobs())
        assert a.job_credential.rpartition(".")[2] not in ctl.log()

        # The CLI: exit 5 and the gRPC code for a refusal; `job show` of its own job works.
        token_a = tmp_path / "a.credential"
        token_a.write_text(a.job_credential + "\n")
        denied = _cli(ctl, token_a, "job", "show", "team-b")
        assert denied.returncode == 5 and "PERMISSION_DENIED" in denied.stderr, denied
        shown = _cli(ctl, token_a, "job", "show", "team-a")
        assert shown.returncode == 0 and "a0" in shown.stdout and "lhcjob" not in shown.stdout, shown

        operator.delete_job("team-b")  # the operator may; B's credential dies with B
        with JobClient(ctl.listen, token=b.job_credential) as worker_b:
            refused(lambda: worker_b.status("team-b"), grpc.StatusCode.UNAUTHENTICATED, "deleted job")
        worker_a.leave("team-a", joined.rank)
    operator.delete_job("team-a")


def test_lhc_agent_with_another_jobs_credential_isrefused(stack, tmp_path):
    _, ctl, _ = stack
    mine = ctl.client.create_job("mine", workers=1, slots=2)
    ctl.client.create_job("theirs", workers=1, slots=2)
    credential = tmp_path / "mine.credential"
    credential.write_text(mine.job_credential)
    done = subprocess.run(
        [sys.executable, "-m", "host_agent.cli", "--controller", ctl.listen, "--job", "theirs"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "LHC_TOKEN_FILE": str(credential)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert "cannot join 'theirs'" in done.stderr and "may not join job 'theirs'" in done.stderr
    assert [m.name for m in ctl.client.status("theirs").members] == []
    for job in ("mine", "theirs"):
        ctl.client.delete_job(job)


def test_job_create_hands_the_credential_over_once(stack, tmp_path):
    _, ctl, state = stack
    operator_file = state / "operator"
    shown = _cli(ctl, operator_file, "job", "create", "cli-job", "--workers", "1")
    assert shown.returncode == 0 and "job credential (shown once" in shown.stdout, shown
    saved = tmp_path / "cli-job-2.credential"
    written = _cli(ctl, operator_file, "job", "create", "cli-job-2", "--workers", "1", "--credential-file",
                   str(saved))  # fmt: skip
    assert written.returncode == 0 and "lhcjob" not in written.stdout, written
    assert saved.stat().st_mode & 0o777 == 0o600 and saved.read_text().startswith("lhcjob.")
    assert _cli(ctl, saved, "job", "show", "cli-job-2").returncode == 0
    assert _cli(ctl, saved, "job", "delete", "cli-job-2").returncode == 5
    for job in ("cli-job", "cli-job-2"):
        ctl.client.delete_job(job)


def test_a_join_is_tied_to_the_callers_address(stack):
    _, ctl, _ = stack
    job = ctl.client.create_job("tied", workers=3, slots=2)
    with JobClient(ctl.listen, token=job.job_credential) as worker:
        refused(lambda: worker.join("tied", ip="10.0.0.9", udp_port=4200), DENIED,
                 "worker address 10.0.0.9 is not the caller's (ipv4:127.0.0.1:")  # fmt: skip
        refused(lambda: worker.join("tied", ip="127.0.0.1", udp_port=4200, mac="02:00:00:00:00:09"), DENIED,
                 "cannot choose the MAC or switch port")  # fmt: skip
        refused(lambda: worker.join("tied", ip="127.0.0.1", udp_port=4200, switch_port=5), DENIED, "MAC")
        # A loopback caller is this host: any loopback address is its own.
        assert worker.join("tied", ip="127.0.0.2", udp_port=4200).rank == 0
    # The operator's credential vouches for any address.
    assert ctl.client.join("tied", ip="10.0.0.9", udp_port=4200, switch_port=5).rank == 1
    ctl.client.delete_job("tied")


def test_the_topology_vouches_for_a_hosts_control_address():
    topology = parse_topology({
        "switch": {"ip": "10.0.0.254", "mac": "02:00:00:00:00:fe"},
        "hosts": [{"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01", "port": 1,
                   "control_ips": ["192.168.1.1", "fd00::1"]},
                  {"name": "h2", "ip": "10.0.0.2", "mac": "02:00:00:00:00:02", "port": 2}],
    })  # fmt: skip
    h1 = MemberRecord(0, "h1", "10.0.0.1", 4000, "02:00:00:00:00:01", 1)
    for peer in ("ipv4:10.0.0.1:5000", "ipv4:192.168.1.1:5000", "ipv6:[fd00::1]:5000",
                 "ipv6:[::ffff:10.0.0.1]:5000"):  # fmt: skip
        check_join_address(Caller(7, peer), h1, topology, chose_link=False)
    for peer in ("ipv4:10.0.0.2:5000", "ipv4:192.168.1.2:5000", "ipv4:127.0.0.1:5000", "unix:/tmp/s"):
        with pytest.raises(ControllerError) as info:
            check_join_address(Caller(7, peer), h1, topology, chose_link=False)
        assert info.value.code == DENIED and "control_ips" in info.value.message
    check_join_address(Caller(None, "ipv4:10.9.9.9:1"), h1, topology, chose_link=True)  # the operator


def test_a_job_credential_aggregates_through_the_switch(stack):
    """A worker joins, waits for installation (a Watch), heartbeats, aggregates and leaves with nothing
    but its job's credential."""
    _, ctl, _ = stack
    job = ctl.client.create_job("solo", workers=1, slots=4)
    agent = Agent.join(ctl.listen, "solo", token=job.job_credential, ip="127.0.0.1", mode="dense")
    try:
        x = torch.arange(1000, dtype=torch.int32)
        assert torch.equal(agent.allreduce(x, key="k").total, x)
    finally:
        agent.close()
    assert all(j.name != "solo" for j in ctl.client.list_jobs())  # its last member left: the job ended


@pytest.mark.slow
def test_watches_are_bounded_and_released(stack):
    _, ctl, _ = stack
    job = ctl.client.create_job("watched", workers=1, slots=2)
    metadata = (("lhc-token", job.job_credential),)
    with JobClient(ctl.listen, token=job.job_credential) as client:
        stub = pb_grpc.JobServiceStub(client._channel)

        def open_watch():
            stream = stub.Watch(pb.WatchRequest(job="watched"), timeout=30, metadata=metadata)
            assert next(stream).name == "watched"
            return stream

        first, second = open_watch(), open_watch()
        refused(lambda: next(client.watch("watched", timeout=10)), grpc.StatusCode.RESOURCE_EXHAUSTED,
                 "2 watches open on job")  # fmt: skip
        assert next(ctl.client.watch("watched", timeout=10)).name == "watched"  # another credential's quota
        first.cancel()  # the client goes away: its thread and slot are free at once
        deadline = time.monotonic() + 5
        while True:
            try:
                third = open_watch()
                break
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and time.monotonic() < deadline
                time.sleep(0.05)

        # The controller ends an idle watch at its --watch-limit (2 s here), however patient the client.
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as info:
            list(second)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--watch-limit" in info.value.details()
        assert WATCH_EXPIRED in tuple(info.value.trailing_metadata())
        assert time.monotonic() - started < 5
        third.cancel()

        # JobClient.watch opens the next stream by itself and ends at its own deadline only.
        seen: list[int] = []
        started = time.monotonic()
        with pytest.raises(ControllerError) as ended:
            for update in client.watch("watched", timeout=5):
                seen.append(update.job_id)
        assert ended.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "--watch-limit" not in ended.value.message  # the client's own deadline, not the server's
        assert len(seen) >= 2 and time.monotonic() - started >= 4.5
    ctl.client.delete_job("watched")


def test_credentials_survive_a_restart_and_an_old_store(tmp_path):
    token = tmp_path / "operator"
    token.write_text(OPERATOR)
    with SoftswitchProcess() as sw:
        with ControllerProcess(sw, tmp_path, "--token-file", str(token), token=OPERATOR) as ctl:
            job = ctl.client.create_job("kept", workers=2, slots=2)
        with (
            ControllerProcess(sw, tmp_path, "--token-file", str(token), token=OPERATOR) as ctl,
            JobClient(ctl.listen, token=job.job_credential) as worker,
        ):
            ctl.wait_for_switch()
            assert worker.join("kept", ip="127.0.0.1", udp_port=4300).rank == 0
    store = sqlite3.connect(tmp_path / DB_NAME)
    digest = store.execute("SELECT digest FROM job_credentials").fetchone()[0]
    assert job.job_credential.rpartition(".")[2] not in digest and len(digest) == 64  # hashed, not kept
    # A store of schema 1 (before credentials) gains the table; its jobs answer the operator only.
    store.executescript("DROP TABLE job_credentials; PRAGMA user_version = 1;")
    store.close()
    migrated = JobStore(tmp_path / DB_NAME)
    try:
        assert migrated.job("kept").name == "kept" and migrated.credential_digest(job.job_id) is None
    finally:
        migrated.close()
