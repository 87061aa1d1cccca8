"""Plain forwarding of everything that is not lhc: IPv4 by longest prefix (`ipv4_routes`: set port, rewrite
both MACs, decrement TTL, drop at TTL 0 or 1), everything else by destination MAC (`l2_forward`). Misses
drop. IPv4 with options is not parsed as IPv4 (it goes to `l2_forward`); a non-first fragment is not
parsed as UDP, so it is routed even when its UDP port is an lhc one. No lhc counter moves."""

from __future__ import annotations

import ptf.testutils as tu
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Packet, Raw

from lhc_ina import constants as c
from ptf_tests.base import LhcTest

HOST_MAC = "02:00:00:00:aa:01"
ROUTER_MAC = "02:00:00:00:00:fe"
NEXT_HOP_MAC = "02:00:00:00:bb:02"
L2_DST = "02:00:00:00:cc:03"


def routed(packet: Packet, src_mac: str, dst_mac: str) -> Packet:
    """``packet`` as the switch must emit it after a route hit: MACs rewritten, TTL - 1, checksum redone."""
    out = packet.copy()
    out[Ether].src, out[Ether].dst = src_mac, dst_mac
    out[IP].ttl -= 1
    out[IP].chksum = None
    return Ether(bytes(out))


class _Forwarding(LhcTest):
    def add_route(self, prefix: str, port: int, dst_mac: str = NEXT_HOP_MAC) -> None:
        self.install(
            self.entities.table_entry(
                "LhcIngress.ipv4_routes",
                {"hdr.ipv4.dst_addr": prefix},
                "LhcIngress.route",
                {"port": port, "src_mac": ROUTER_MAC, "dst_mac": dst_mac},
            )
        )

    def add_l2(self, mac: str, port: int) -> None:
        self.install(
            self.entities.table_entry(
                "LhcIngress.l2_forward", {"hdr.ethernet.dst_addr": mac}, "LhcIngress.set_port", {"port": port}
            )
        )

    def ipv4(self, dst: str, ttl: int = 64, l4: Packet | None = None) -> Packet:
        l4 = UDP(sport=1234, dport=5000) / Raw(b"x" * 40) if l4 is None else l4
        return Ether(src=HOST_MAC, dst=ROUTER_MAC) / IP(src="10.50.0.1", dst=dst, ttl=ttl, id=7) / l4


class L3Routed(_Forwarding):
    """UDP (also one whose *source* port is an lhc port) and TCP, by longest prefix."""

    def runTest(self) -> None:
        p_short, p_long = self.ports[1], self.ports[2]
        self.add_route("10.77.0.0/16", p_short)
        self.add_route("10.77.1.0/24", p_long, dst_mac="02:00:00:00:bb:03")
        cases = [
            (self.ipv4("10.77.2.9"), p_short, NEXT_HOP_MAC),
            (self.ipv4("10.77.1.9"), p_long, "02:00:00:00:bb:03"),
            (
                self.ipv4("10.77.2.9", l4=UDP(sport=c.UDP_PORT_BASE, dport=5000) / Raw(b"y" * 30)),
                p_short,
                NEXT_HOP_MAC,
            ),
            (
                self.ipv4("10.77.1.200", ttl=2, l4=TCP(sport=80, dport=8080) / Raw(b"z" * 20)),
                p_long,
                "02:00:00:00:bb:03",
            ),
        ]
        for packet, port, dst_mac in cases:
            self.send(self.ports[0], packet)
            tu.verify_packet(self, routed(packet, ROUTER_MAC, dst_mac), port)
            tu.verify_no_other_packets(self)
        self.assert_stats({})


class L3Drops(_Forwarding):
    """TTL 1 and 0 expire; a destination no route covers is dropped."""

    def runTest(self) -> None:
        self.add_route("10.77.0.0/16", self.ports[1])
        for packet in (self.ipv4("10.77.0.5", ttl=1), self.ipv4("10.77.0.5", ttl=0), self.ipv4("10.78.0.5")):
            self.send(self.ports[0], packet)
        self.expect_silence()
        self.assert_stats({})


class L2Forwarded(_Forwarding):
    """Non-IPv4 frames (ARP, an experimental ethertype) go by destination MAC, unchanged; misses drop."""

    def runTest(self) -> None:
        self.add_l2(L2_DST, self.ports[3])
        arp = Ether(src=HOST_MAC, dst=L2_DST) / ARP(hwsrc=HOST_MAC, psrc="10.50.0.1", pdst="10.50.0.2")
        raw = Ether(src=HOST_MAC, dst=L2_DST, type=0x88B5) / Raw(bytes(range(64)))
        for packet in (arp, raw):
            self.send(self.ports[0], packet)
            tu.verify_packet(self, packet, self.ports[3])
            tu.verify_no_other_packets(self)
        self.send(self.ports[0], Ether(src=HOST_MAC, dst="02:00:00:00:cc:99", type=0x88B5) / Raw(b"q" * 50))
        self.expect_silence()
        self.assert_stats({})


class IPv4WithOptionsGoesByMac(_Forwarding):
    """ihl > 5 is not parsed as IPv4: switched by MAC unchanged (TTL kept), even to an lhc port."""

    def runTest(self) -> None:
        self.add_route("10.255.0.0/16", self.ports[1])
        self.add_l2(ROUTER_MAC, self.ports[2])
        packet = (
            Ether(src=HOST_MAC, dst=ROUTER_MAC)
            / IP(src="10.50.0.1", dst="10.255.0.1", ttl=9, options=b"\x01\x01\x01\x00")
            / UDP(sport=40000, dport=c.UDP_PORT_BASE)
            / Raw(b"\x00" * (c.HEADER_BYTES + c.PAYLOAD_BYTES))
        )
        packet = Ether(bytes(packet))
        self.assertEqual(packet[IP].ihl, 6)
        self.send(self.ports[0], packet)
        tu.verify_packet(self, packet, self.ports[2])
        tu.verify_no_other_packets(self)
        self.assert_stats({})


class FragmentIsNotLhc(_Forwarding):
    """A non-first fragment is not parsed as UDP: routed even though its UDP port bytes say lhc."""

    def runTest(self) -> None:
        self.add_route("10.255.0.0/16", self.ports[1])
        packet = (
            Ether(src=HOST_MAC, dst=ROUTER_MAC)
            / IP(src="10.50.0.1", dst="10.255.0.1", ttl=9, frag=10, proto=17)
            / UDP(sport=40000, dport=c.UDP_PORT_BASE)
            / Raw(b"\x00" * (c.HEADER_BYTES + c.PAYLOAD_BYTES))
        )
        packet = Ether(bytes(packet))
        self.send(self.ports[0], packet)
        tu.verify_packet(self, routed(packet, ROUTER_MAC, NEXT_HOP_MAC), self.ports[1])
        tu.verify_no_other_packets(self)
        self.assert_stats({})


class TruncatedNonLhcDropped(_Forwarding):
    """A frame that ends inside its IPv4 header is dropped, even with a route and a MAC entry for it."""

    def runTest(self) -> None:
        self.add_route("10.77.0.0/16", self.ports[1])
        self.add_l2(ROUTER_MAC, self.ports[2])
        whole = bytes(self.ipv4("10.77.0.5"))
        self.send(self.ports[0], whole[: c.ETHERNET_BYTES + 12])
        self.expect_silence()
        self.assert_stats({})
