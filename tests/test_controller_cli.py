"""`lhc-controller` from the command line against a running controller, its metrics endpoint, and the
topology file (forwarding entries, workers joining by host name)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from lhc_ina.jobs import ip_to_int, mac_to_int
from lhc_ina.jobservice import jobservice_pb2 as pb
from lhc_launch.processes import ControllerProcess, SoftswitchProcess
from tests.harness.controller import store_state, switch_state

REPO = Path(__file__).resolve().parent.parent
TOPOLOGY = {
    "switch": {"ip": "10.0.0.254", "mac": "02:00:00:00:00:fe"},
    "hosts": [
        {"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01", "port": 1},
        {"name": "h2", "ip": "10.0.0.2", "mac": "02:00:00:00:00:02", "port": 2},
    ],
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[tuple[SoftswitchProcess, ControllerProcess, Path]]:
    state = tmp_path_factory.mktemp("state")
    topology = state / "topology.json"
    topology.write_text(json.dumps(TOPOLOGY))
    with (
        SoftswitchProcess() as sw,
        ControllerProcess(
            sw, state, "--topology", str(topology), "--metrics-addr", "127.0.0.1:0", election_id=5
        ) as ctl,
    ):
        ctl.wait_for_switch()
        yield sw, ctl, state


def cli(ctl: ControllerProcess, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "controller.cli", "--controller", ctl.listen, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


def test_cli_job_commands_tables_json_and_exit_codes(setup, tmp_path):
    sw, ctl, _state = setup
    made = cli(ctl, "job", "create", "cli-job", "--workers", "2", "--slots", "16")
    assert made.returncode == 0, made.stderr
    assert "job cli-job (id" in made.stdout and "PENDING" in made.stdout
    listed = cli(ctl, "job", "list")
    assert listed.returncode == 0 and listed.stdout.splitlines()[0].split() == [
        "NAME",
        "ID",
        "STATE",
        "WORKERS",
        "SLOTS",
        "EPOCH",
    ]
    assert "cli-job" in listed.stdout and "0/2" in listed.stdout
    as_json = json.loads(cli(ctl, "--json", "job", "list").stdout)
    assert [j["name"] for j in as_json["jobs"]] == ["cli-job"] and as_json["jobs"][0]["slot_count"] == 16
    shown = json.loads(cli(ctl, "--json", "job", "show", "cli-job").stdout)
    assert shown["state"] == "PENDING" and shown["workers"] == 2
    assert "switch counters: all zero" in cli(ctl, "job", "show", "cli-job").stdout
    status = cli(ctl, "switch", "status")
    assert status.returncode == 0 and "connected, primary" in status.stdout, status.stdout
    assert json.loads(cli(ctl, "--json", "switch", "status").stdout)["primary"] is True

    # switch status says, by its exit code, whether the controller drives the switch.
    with ControllerProcess(sw, tmp_path, election_id=2) as backup:
        backup.wait_for_switch(primary=False)
        assert cli(backup, "switch", "status").returncode == 7
    missing = cli(ctl, "job", "show", "nope")
    assert missing.returncode == 3 and "NOT_FOUND: no job named 'nope'" in missing.stderr
    twice = cli(ctl, "job", "create", "cli-job", "--workers", "2")
    assert twice.returncode == 4 and "ALREADY_EXISTS" in twice.stderr
    bad = cli(ctl, "job", "create", "x", "--workers", "40")
    assert bad.returncode == 2 and "40 workers" in bad.stderr
    assert cli(ctl, "job", "delete", "cli-job").returncode == 0
    assert "no jobs" in cli(ctl, "job", "list").stdout
    nobody = subprocess.run(
        [sys.executable, "-m", "controller.cli", "--controller", "127.0.0.1:1", "job", "list"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert nobody.returncode == 6 and "UNAVAILABLE" in nobody.stderr


def test_topology_forwarding_and_join_by_host(setup):
    sw, ctl, state = setup
    routes = {e for e in switch_state(sw).tables if e.table == "LhcIngress.ipv4_routes"}
    assert {dict(e.match)["hdr.ipv4.dst_addr"] for e in routes} == {
        (ip_to_int("10.0.0.1"), 32),
        (ip_to_int("10.0.0.2"), 32),
    }
    h2 = next(e for e in routes if dict(e.match)["hdr.ipv4.dst_addr"][0] == ip_to_int("10.0.0.2"))
    assert dict(h2.params) == {
        "port": 2,
        "src_mac": mac_to_int("02:00:00:00:00:fe"),
        "dst_mac": mac_to_int("02:00:00:00:00:02"),
    }
    l2 = {e for e in switch_state(sw).tables if e.table == "LhcIngress.l2_forward"}
    assert len(l2) == 2
    ctl.client.create_job("topo", workers=2, slots=4)
    a = ctl.client.join("topo", host="h1", udp_port=40000)
    b = ctl.client.join("topo", host="h2", udp_port=40000)
    peers = {p.name: p for p in b.peers}
    assert (peers["h1"].ip, peers["h1"].mac, peers["h1"].switch_port) == ("10.0.0.1", "02:00:00:00:00:01", 1)
    assert (peers["h2"].switch_port, a.rank, b.rank) == (2, 0, 1)
    assert (b.switch_ip, b.switch_udp_port) == (sw.host, sw.udp_port)  # --dataplane wins over the file
    group = next(iter(switch_state(sw).groups))
    assert group.replicas == ((1, 0), (2, 1))
    assert switch_state(sw) == store_state(state, state / "topology.json")
    from lhc_ina.jobservice.errors import ControllerError

    with pytest.raises(ControllerError, match="unknown topology host 'h9'"):
        ctl.client.join("topo", host="h9", udp_port=1)
    ctl.client.delete_job("topo")


def test_metrics(setup):
    sw, ctl, _state = setup
    ctl.client.create_job("metered", workers=1, slots=2)
    ctl.client.join("metered", ip="127.0.0.1", udp_port=41000)
    text = urllib.request.urlopen(f"http://{ctl.metrics}/metrics", timeout=30).read().decode()
    assert f'lhc_switch_primary{{switch="{sw.grpc_addr}"}} 1.0' in text
    assert 'lhc_job_members{job="metered"} 1.0' in text
    assert 'lhc_job_packets_total{job="metered",outcome="absorbed"} 0.0' in text
    assert 'lhc_job_epoch_changes_total{job="metered"} 0.0' in text
    ctl.client.delete_job("metered")


def test_expected_hosts_fix_ranks_and_a_missing_one_is_named(setup):
    sw, ctl, state = setup
    client = ctl.client
    from lhc_ina.jobservice.errors import ControllerError

    with pytest.raises(ControllerError, match="unknown topology host 'h7'"):
        client.create_job("named", workers=2, hosts=["h1", "h7"])
    with pytest.raises(ControllerError, match="1 hosts named for 2 workers"):
        client.create_job("named", workers=2, hosts=["h1"])
    made = cli(ctl, "job", "create", "named", "--workers", "2", "--hosts", "h2,h1", "--join-timeout", "2")
    assert made.returncode == 0, made.stderr
    with pytest.raises(ControllerError, match="expects h2, h1; 'stranger' is not one"):
        client.join("named", ip="127.0.0.1", udp_port=4000, name="stranger")
    assert client.join("named", host="h1", udp_port=40000).rank == 1  # its place in the list
    failed = next(i for i in client.watch("named", timeout=60) if i.state == pb.FAILED)
    assert "1 of 2 workers did not join within 2 s: rank 0 'h2' 10.0.0.2" in failed.failure
    assert "joined: rank 1 'h1' 10.0.0.1:40000" in failed.failure and list(failed.hosts) == ["h2", "h1"]
    client.delete_job("named")
    assert switch_state(sw) == store_state(state, state / "topology.json")
