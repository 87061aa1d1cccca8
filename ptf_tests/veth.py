"""Quiet veth pairs for the PTF harness: PTF holds one end of each pair, the switch under test the other.

The kernel must not inject packets of its own (IPv6 router/neighbour solicitations, MLD reports) or the
suite's "no other packets" checks would fail at random, so IPv6 is disabled before a link comes up; and
offloads are turned off so that frames cross the pair byte for byte as written (no VLAN tag stripping
into metadata, no checksum or segmentation deferred to a NIC that does not exist).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.ethtool import Ethtool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VethPair:
    port: int  # the port number on both sides (PTF's and the switch's)
    ptf_end: str
    switch_end: str


def pair_names(ports: range, prefix: str = "lhc") -> list[VethPair]:
    """The names of the pairs for ``ports``: ``lhcptf<port>`` for PTF, ``lhcsw<port>`` for the switch."""
    return [VethPair(port, f"{prefix}ptf{port}", f"{prefix}sw{port}") for port in ports]


def create(pairs: list[VethPair]) -> None:
    """Create the pairs (replacing leftovers of an interrupted run with the same names), quiet and up."""
    delete(pairs)
    with IPRoute() as ipr:
        for pair in pairs:
            ipr.link("add", ifname=pair.ptf_end, kind="veth", peer={"ifname": pair.switch_end})
            for name in (pair.ptf_end, pair.switch_end):
                _disable_ipv6(name)
                _disable_offloads(name)
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0], state="up")


def delete(pairs: list[VethPair]) -> None:
    """Remove the pairs that exist (deleting one end removes its peer)."""
    with IPRoute() as ipr:
        for pair in pairs:
            for index in ipr.link_lookup(ifname=pair.ptf_end):
                ipr.link("del", index=index)


def _disable_ipv6(ifname: str) -> None:
    knob = Path("/proc/sys/net/ipv6/conf") / ifname / "disable_ipv6"
    if knob.exists():
        knob.write_text("1\n")


def _disable_offloads(ifname: str) -> None:
    """Best effort: a feature the driver fixes stays as it is (veth fixes none that matter here)."""
    ethtool = Ethtool()
    try:
        features = ethtool.get_features(ifname)
        for name, feature in features.features.items():
            if feature.available and feature.enable and name != "highdma":
                feature.enable = False
        ethtool.set_features(ifname, features)
    except Exception as error:  # a kernel without the ioctl still runs the suite, with offloads on
        log.warning("could not turn offloads off on %s: %s", ifname, error)
    finally:
        ethtool.close()
