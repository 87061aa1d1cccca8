"""Emulation runs in Mininet (root and Debian's Mininet): a minimal exact training run under loss, and
no leftovers after a run or an interrupted one."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lhc_ina import constants as c
from lhc_ina.wire import FRAME_END, FRAME_LHC, LhcHeader
from softswitch.capture import INBOUND
from tests.harness.pcapng import read_frames, read_pcap

REPO = Path(__file__).resolve().parent.parent
RUNNER = [("/usr/bin/python3"), str(REPO / "mininet" / "run.py"), "--python", sys.executable]
pytestmark = [pytest.mark.root, pytest.mark.mininet, pytest.mark.slow]


def leftovers() -> list[str]:
    """Interfaces and processes an emulation run creates, if any survived it."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
    ours = [n for n in names if n.startswith(("s1-eth", "lhcctl", "l1-", "l2-", "sp-eth"))
            or (n.startswith("h") and "-eth" in n)]
    ours += [p for p in _command_lines() if "mnexec" in p or ("softswitch.cli" in p and "--port" in p)
             or ("lhc_demo.worker" in p and "--host" in p)]
    return ours


def _command_lines() -> list[str]:
    """Every process's whole command line (``-ww``: without it, ps cuts them at 80 columns when its
    output is not a terminal, and the arguments matched here would be cut off)."""
    return subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()


def check_leafspine_bench(tmp_path: Path, switch: str, length: int) -> None:
    """The benchmark over two leaves and a spine: every row exact, and one partial up and one result down
    per leaf and round on the leaf-spine links."""
    argv = [*RUNNER, "--switch", switch, "--topology", "leafspine", "--workers", "4", "--workload", "bench",
            "--length", str(length), "--bw", "0", "--out", str(tmp_path)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    rows = [line for line in lines if "mode" in line]
    assert len(rows) == 4 * 3 and all(row["exact"] and row["topology"] == "leafspine" for row in rows)
    assert all(row["switch"] == switch for row in rows)
    links = lines[-1]["leaf_spine_links"]["bench"]
    assert set(links) == {"leaf1", "leaf2"}
    for leaf, counts in links.items():
        # One partial up and one result down per round (a worker's packet), retransmissions aside: a leaf
        # that sent one packet per worker would show 2.0, one that sent nothing 0.
        assert counts["worker_packets"] > 100, (leaf, counts)
        assert 0.8 <= counts["up_per_worker_packet"] <= 1.25, (leaf, counts)
        assert 0.8 <= counts["down_per_worker_packet"] <= 1.25, (leaf, counts)
        assert counts["link_tx_bytes"] >= counts["up_bytes"], (leaf, counts)
    assert leftovers() == []


def test_two_leaves_and_a_spine_aggregate_exactly_one_packet_per_leaf_and_round(tmp_path: Path) -> None:
    check_leafspine_bench(tmp_path, "softswitch", 20000)


@pytest.mark.bmv2
@pytest.mark.p4c
def test_two_bmv2_leaves_and_a_bmv2_spine_aggregate_exactly(tmp_path: Path) -> None:
    """The same fabric of three BMv2 switches, each running the v1model program with its role's tables."""
    subprocess.run(["make", "-C", str(REPO), "p4-v1model", f"PYTHON={sys.executable}"], check=True,
                   capture_output=True)
    check_leafspine_bench(tmp_path, "bmv2", 20000)


def test_a_minimal_emulation_trains_exactly_under_loss(tmp_path: Path) -> None:
    pcap = tmp_path / "pcap"
    done = subprocess.run([*RUNNER, "--workers", "2", "--steps", "3", "--bw", "0", "--loss", "1",
                           "--out", str(tmp_path), "--pcap", str(pcap)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["losses_match"] is True
    assert summary["loss_percent"] == 1
    assert sum(summary["dropped_frames"].values()) > 0, "the loss rules dropped nothing"
    assert leftovers() == []
    # --pcap: each host's interface saw its own DATA leave and results arrive; the switch saw DATA come in.
    for index in (1, 2):
        types = {LhcHeader.unpack(frame[FRAME_LHC:]).msg_type for frame in read_pcap(pcap / f"h{index}.pcap")}
        assert {c.MsgType.DATA, c.MsgType.RESULT} <= types, index
    switch = read_frames(pcap / "switch.pcapng")
    assert any(frame.direction == INBOUND and len(frame.data) == FRAME_END for frame in switch)


def _training_workers() -> list[str]:
    return [p for p in _command_lines() if "lhc_demo.worker" in p and "--host" in p]


def test_an_interrupted_run_leaves_nothing(tmp_path: Path) -> None:
    """Interrupted once its workers train (the cluster, the switch and the controller are up before
    them), a run removes every interface and process it made."""
    proc = subprocess.Popen([*RUNNER, "--workers", "2", "--steps", "200", "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_training_workers()) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # into the workers' training: past their start, before their end
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert len(_training_workers()) == 2, "the run's two workers did not start"
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:  # the interrupt did not end it: end it, so no run outlives the test
            proc.terminate()
            proc.communicate(timeout=120)
    assert leftovers() == []


@pytest.mark.bmv2
@pytest.mark.p4c
def test_aggregation_through_bmv2_is_exact(tmp_path: Path) -> None:
    """The agents' transport through BMv2 simple_switch_grpc (small buckets: BMv2 forwards about a
    thousand packets per second), every mode exact."""
    subprocess.run(["make", "-C", str(REPO), "p4-v1model", f"PYTHON={sys.executable}"], check=True,
                   capture_output=True)
    done = subprocess.run([*RUNNER, "--switch", "bmv2", "--workers", "2", "--bw", "0", "--workload", "bench",
                           "--length", "20000", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert {r["mode"] for r in rows} == {"dense", "sketch", "auto"} and len(rows) == 6
    assert all(r["exact"] and r["switch"] == "bmv2" for r in rows), rows
    assert leftovers() == []
