"""The topology file: the switch's own address and the hosts behind its ports.

JSON, e.g.::

    {"switch": {"ip": "10.0.0.254", "mac": "02:00:00:00:00:fe", "udp_port": 19520},
     "hosts": [{"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01", "port": 1}, ...]}

From it the controller installs ``ipv4_routes`` (each host's /32) and ``l2_forward`` (each host's MAC),
so ordinary traffic crosses the switch, and resolves a worker that joins by host name. A host's optional
``control_ips`` (e.g. ``["192.168.1.1"]``) are the addresses it reaches the controller from when that is not
its data-plane ``ip`` (a management network): a join for that host with a job credential is accepted from
them (``controller.auth``).
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from pathlib import Path

from lhc_ina import constants as c
from lhc_ina.jobs import DROP_PORT, TableEntrySpec, ip_to_int, mac_to_int
from lhc_ina.jobservice import errors

_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


@dataclass(frozen=True)
class Host:
    name: str
    ip: str
    mac: str
    port: int
    control_ips: tuple[str, ...] = ()


@dataclass(frozen=True)
class Topology:
    switch_ip: str
    switch_mac: str
    switch_udp_port: int
    hosts: dict[str, Host]

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise errors.invalid(f"unknown topology host {name!r} (known: {known})") from None

    def forwarding_entries(self) -> list[TableEntrySpec]:
        entries = []
        for h in self.hosts.values():
            entries.append(
                TableEntrySpec(
                    "LhcIngress.ipv4_routes",
                    (("hdr.ipv4.dst_addr", (ip_to_int(h.ip), 32)),),
                    "LhcIngress.route",
                    (
                        ("port", h.port),
                        ("src_mac", mac_to_int(self.switch_mac)),
                        ("dst_mac", mac_to_int(h.mac)),
                    ),
                )
            )
            entries.append(
                TableEntrySpec(
                    "LhcIngress.l2_forward",
                    (("hdr.ethernet.dst_addr", mac_to_int(h.mac)),),
                    "LhcIngress.set_port",
                    (("port", h.port),),
                )
            )
        return entries


def _field(item: dict, key: str, where: str) -> object:
    if key not in item:
        raise errors.invalid(f"{where}: no {key!r}")
    return item[key]


def _ip(value: object, where: str) -> str:
    try:
        return str(ipaddress.IPv4Address(str(value)))
    except ValueError:
        raise errors.invalid(f"{where}: {value!r} is not an IPv4 address") from None


def _control_ips(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise errors.invalid(f"{where}: control_ips must be a list of IP addresses")
    try:
        return tuple(str(ipaddress.ip_address(str(v))) for v in value)
    except ValueError as exc:
        raise errors.invalid(f"{where}: control_ips: {exc}") from None


def _mac(value: object, where: str) -> str:
    if not isinstance(value, str) or not _MAC.match(value):
        raise errors.invalid(f"{where}: {value!r} is not a MAC address (aa:bb:cc:dd:ee:ff)")
    return value.lower()


def parse_topology(data: dict) -> Topology:
    switch = _field(data, "switch", "topology")
    if not isinstance(switch, dict):
        raise errors.invalid("topology: 'switch' must be an object")
    hosts: dict[str, Host] = {}
    seen: dict[str, str] = {}
    for i, item in enumerate(_field(data, "hosts", "topology")):
        where = f"topology host #{i}"
        name = str(_field(item, "name", where))
        port = _field(item, "port", f"host {name}")
        if not isinstance(port, int) or not 0 <= port < DROP_PORT:
            raise errors.invalid(f"host {name}: port {port!r} is outside 0..{DROP_PORT - 1}")
        host = Host(
            name,
            _ip(_field(item, "ip", f"host {name}"), f"host {name}"),
            _mac(_field(item, "mac", f"host {name}"), f"host {name}"),
            port,
            _control_ips(item.get("control_ips", []), f"host {name}"),
        )
        for key in (name, host.ip, host.mac):
            if key in seen:
                raise errors.invalid(f"host {name}: {key} is also host {seen[key]}'s")
            seen[key] = name
        hosts[name] = host
    udp_port = switch.get("udp_port", c.UDP_PORT_BASE)
    if not isinstance(udp_port, int) or udp_port & c.UDP_PORT_MASK != c.UDP_PORT_BASE:
        raise errors.invalid(
            f"topology switch: udp_port {udp_port!r} is not in the lhc port range "
            f"{c.UDP_PORT_BASE}..{c.UDP_PORT_BASE + c.UDP_PORT_COUNT - 1}"
        )
    return Topology(
        _ip(_field(switch, "ip", "topology switch"), "topology switch"),
        _mac(_field(switch, "mac", "topology switch"), "topology switch"),
        udp_port,
        hosts,
    )


def load_topology(path: Path | str) -> Topology:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise errors.invalid(f"topology {path}: {exc}") from None
    return parse_topology(data)
