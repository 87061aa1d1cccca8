"""Bad requests to the job service get a precise gRPC status and a message naming the problem; workers
that never join or stop heartbeating fail their job with a status that names them; the shared token keeps
strangers out. One controller and one softswitch serve the whole module."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_ina.jobservice.client import JobClient
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.controller import refused, store_state, switch_state


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[tuple[SoftswitchProcess, ControllerProcess, Path]]:
    state = tmp_path_factory.mktemp("state")
    token = state / "token"
    token.write_text("s3cret\n")
    with (
        SoftswitchProcess() as sw,
        ControllerProcess(
            sw, state, "--token-file", str(token), "--heartbeat-timeout", "3", token="s3cret"
        ) as ctl,
    ):
        ctl.wait_for_switch()
        yield sw, ctl, state


def test_precise_errors(setup):
    _, ctl, _ = setup
    client = ctl.client
    nf = grpc.StatusCode.NOT_FOUND
    refused(lambda: client.status("nope"), nf, "'nope'")
    refused(lambda: client.join("nope", ip="127.0.0.1", udp_port=4000), nf, "'nope'")
    refused(lambda: client.delete_job("nope"), nf, "'nope'")
    bad = grpc.StatusCode.INVALID_ARGUMENT
    refused(lambda: client.create_job("big", workers=33), bad, "33 workers on one switch", "1..32",
            "one bit each in its 32-bit contributor bitmap", "leaf/spine")
    refused(lambda: client.create_job("bigger", workers=1025), bad, "1025 workers", "1..1024")
    refused(lambda: client.create_job("none", workers=0), bad, "0 workers")
    refused(lambda: client.create_job("lanes", workers=2, lanes=32), bad, "32 lanes")
    refused(lambda: client.create_job("huge", workers=2, slots=5000), bad, "5000 slots")
    refused(lambda: client.create_job("", workers=2), bad, "job name")

    client.create_job("errs", workers=2, slots=4)
    refused(lambda: client.create_job("errs", workers=2), grpc.StatusCode.ALREADY_EXISTS, "'errs' exists")
    refused(lambda: client.join("errs", ip="10.0.0.300", udp_port=4000), bad, "10.0.0.300", "IPv4")
    refused(lambda: client.join("errs", ip="127.0.0.1", udp_port=0), bad, "UDP port 0")
    refused(lambda: client.join("errs", ip="127.0.0.1", udp_port=19521), bad, "lhc range")
    refused(lambda: client.join("errs", ip="127.0.0.1", udp_port=4000, mac="zz"), bad, "'zz'", "MAC")
    refused(lambda: client.join("errs", ip="127.0.0.1", udp_port=4000, switch_port=511), bad, "511")
    refused(lambda: client.join("errs", host="h1", udp_port=4000), bad, "no topology")
    first = client.join("errs", ip="127.0.0.1", udp_port=4000, name="a")
    assert first.rank == 0
    twice = grpc.StatusCode.ALREADY_EXISTS
    refused(lambda: client.join("errs", ip="127.0.0.1", udp_port=4000, name="a"), twice, "already joined")
    refused(lambda: client.join("errs", ip="127.0.0.1", udp_port=4000, name="b"), twice, "taken by rank 0")
    refused(lambda: client.join("errs", ip="127.0.0.1", udp_port=4001, name="a"), twice, "named 'a'")
    client.join("errs", ip="127.0.0.1", udp_port=4001, name="b")
    refused(
        lambda: client.join("errs", ip="127.0.0.1", udp_port=4002),
        grpc.StatusCode.FAILED_PRECONDITION,
        "all its 2 workers",
    )
    refused(lambda: client.heartbeat("errs", 7), nf, "no rank 7")
    client.delete_job("errs")


def test_slots_exhausted_and_freed(setup):
    _, ctl, state = setup
    client = ctl.client
    free = client.switch_status().slots_free
    client.create_job("most", workers=1, slots=free - 10)
    message = refused(
        lambda: client.create_job("more", workers=1, slots=11),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "wants 11 slots",
        "10 of 4096 free",
    )
    assert "'more'" in message
    small = client.create_job("fits", workers=1, slots=10)
    client.delete_job("most")
    again = client.create_job("again", workers=1, slots=free - 10)
    assert again.slot_base == 0 and small.slot_base == free - 10
    # A range given again carries a new epoch: stale slot state cannot leak into the new job.
    assert again.epoch not in (small.epoch,)
    client.delete_job("again")
    client.delete_job("fits")
    assert client.switch_status().slots_free == free
    assert switch_state(setup[0]) == store_state(state)


def test_wrong_or_missing_token_isrefused(setup):
    _, ctl, _ = setup
    for token in (None, "guess"):
        with JobClient(ctl.listen, token=token) as stranger:
            refused(
                lambda s=stranger: s.create_job("intruder", workers=1),
                grpc.StatusCode.UNAUTHENTICATED,
                "lhc-token",
            )
            refused(lambda s=stranger: next(s.watch("x", timeout=10)), grpc.StatusCode.UNAUTHENTICATED)
    assert all(j.name != "intruder" for j in ctl.client.list_jobs())


def test_worker_that_never_joins_fails_the_job_by_name(setup):
    _, ctl, _ = setup
    client = ctl.client
    client.create_job("late", workers=3, slots=2, join_timeout_s=2)
    client.join("late", ip="127.0.0.1", udp_port=5000, name="alice")
    client.join("late", ip="127.0.0.1", udp_port=5001, name="bob")
    failed = next(i for i in client.watch("late", timeout=60) if i.state == pb.FAILED)
    assert "1 of 3 workers did not join within 2 s: rank 2;" in failed.failure
    assert "rank 0 'alice' 127.0.0.1:5000" in failed.failure and "'bob'" in failed.failure
    refused(
        lambda: client.join("late", ip="127.0.0.1", udp_port=5002),
        grpc.StatusCode.FAILED_PRECONDITION,
        "has failed",
        "did not join",
    )
    client.delete_job("late")


def test_silent_worker_fails_the_job_and_its_entries_leave(setup):
    sw, ctl, state = setup
    client = ctl.client
    client.create_job("beat", workers=2, slots=2)
    a = client.join("beat", ip="127.0.0.1", udp_port=6000, name="steady")
    client.join("beat", ip="127.0.0.1", udp_port=6001, name="quiet")
    assert client.status("beat").installed
    seen: list[tuple[int, bool]] = []
    beats = client.start_heartbeats(
        "beat", a.rank, interval=0.5, on_change=lambda i: seen.append((i.state, i.installed))
    )
    try:
        failed = next(i for i in client.watch("beat", timeout=60) if i.state == pb.FAILED)
        assert "rank 1 'quiet' 127.0.0.1:6001" in failed.failure and "steady" not in failed.failure
        deadline = time.monotonic() + 30
        while (beats.latest is None or beats.latest.state != pb.FAILED) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert beats.latest.state == pb.FAILED  # the live worker learns it from its heartbeat
        assert seen[0] == (pb.ACTIVE, True) and seen[-1] == (pb.FAILED, False)
    finally:
        beats.stop()
    deadline = time.monotonic() + 30
    while switch_state(sw).tables and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not switch_state(sw).tables and switch_state(sw) == store_state(state)
    client.delete_job("beat")
