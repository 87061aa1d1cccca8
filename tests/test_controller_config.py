"""What serve reads besides the store: --dataplane and the topology file, with errors that name the
problem."""

from __future__ import annotations

import pytest

from controller.server import parse_dataplane
from controller.topology import parse_topology
from lhc_ina.jobservice.errors import ControllerError

SWITCH = {"ip": "10.0.0.254", "mac": "02:00:00:00:00:fe"}


def test_dataplane_forms():
    assert parse_dataplane("1@127.0.0.5:19521", None) == ("127.0.0.5", 19521, 1)
    assert parse_dataplane("10.0.0.254", None) == ("10.0.0.254", 19520, None)
    topology = parse_topology({"switch": {**SWITCH, "udp_port": 19522}, "hosts": []})
    assert parse_dataplane(None, topology) == ("10.0.0.254", 19522, None)
    for text, words in (("1@h:1", "expected"), ("127.0.0.1:4000", "not an lhc port"),
                        ("300.0.0.1", "not an IPv4 address")):
        with pytest.raises(ControllerError, match=words):
            parse_dataplane(text, None)
    with pytest.raises(ControllerError, match="give --dataplane"):
        parse_dataplane(None, None)


@pytest.mark.parametrize(("hosts", "words"), [
    ([{"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01"}], "host h1: no 'port'"),
    ([{"name": "h1", "ip": "10.0.0.x", "mac": "02:00:00:00:00:01", "port": 1}], "not an IPv4 address"),
    ([{"name": "h1", "ip": "10.0.0.1", "mac": "02-00", "port": 1}], "not a MAC address"),
    ([{"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01", "port": 511}], "outside 0..510"),
    ([{"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01", "port": 1},
      {"name": "h2", "ip": "10.0.0.1", "mac": "02:00:00:00:00:02", "port": 2}], "10.0.0.1 is also host h1"),
])  # fmt: skip
def test_topology_errors_name_the_host(hosts, words):
    with pytest.raises(ControllerError, match=words):
        parse_topology({"switch": SWITCH, "hosts": hosts})


def test_topology_switch_port_must_be_an_lhc_port():
    with pytest.raises(ControllerError, match="not in the lhc port range"):
        parse_topology({"switch": {**SWITCH, "udp_port": 80}, "hosts": []})
