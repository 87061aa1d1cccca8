"""The topology: the switches the controller drives, the links between them, and the hosts behind them.

One switch (JSON)::

    {"switch": {"ip": "10.0.0.254", "mac": "02:00:00:00:00:fe", "udp_port": 19520},
     "hosts": [{"name": "h1", "ip": "10.0.0.1", "mac": "02:00:00:00:00:01", "port": 1}, ...]}

A leaf/spine fabric (docs/controller.md, "Several switches")::

    {"switches": [{"name": "leaf1", "role": "leaf", "p4runtime": "127.0.0.1:9601", "device_id": 1,
                   "ip": "10.0.1.254", "mac": "02:00:00:00:01:fe", "udp_port": 19520}, ...,
                  {"name": "spine", "role": "spine", "p4runtime": "127.0.0.1:9600", ...}],
     "links": [{"leaf": "leaf1", "leaf_port": 5, "spine_port": 1}, ...],
     "hosts": [{"name": "h1", "switch": "leaf1", "ip": "10.0.1.1", "mac": "02:00:00:00:01:01",
                "port": 1}, ...]}

A switch's ``ip``/``mac``/``udp_port`` is its lhc address: where its workers send, and (a leaf's) where
the spine sends its results, so a leaf's results to its workers come from the address they sent to. A
link may give the spine's address on it (``spine_ip``, ``spine_mac``, ``spine_udp_port``; default the
spine's own). From the topology the controller installs ``ipv4_routes`` and ``l2_forward`` on every
switch (each host's /32 and MAC: towards its port on its leaf, towards the spine elsewhere, towards the
leaf on the spine), so ordinary traffic crosses the fabric, resolves a worker that joins by host name
(or, in a fabric, by a host's ip) to its leaf and port, and places jobs (``controller.spans``). A host's
optional ``control_ips`` are the addresses it reaches the controller from when that is not its data-plane
``ip`` (a management network): a join for that host with a job credential is accepted from them
(``controller.auth``).
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
#: The one switch of a ``{"switch": ...}`` topology (and of a controller without a topology).
SINGLE = "switch"
ROLES = ("leaf", "spine")


@dataclass(frozen=True)
class Host:
    name: str
    ip: str
    mac: str
    port: int
    control_ips: tuple[str, ...] = ()
    #: The switch the host is cabled to (a leaf; SINGLE in a one-switch topology).
    switch: str = SINGLE


@dataclass(frozen=True)
class Switch:
    """A switch the controller drives: its name and role, its P4Runtime address ("" for the one switch of
    a one-switch topology: ``serve --switch``) and device id, and its lhc address."""

    name: str
    role: str
    ip: str
    mac: str
    udp_port: int
    p4runtime: str = ""
    device_id: int = 1


@dataclass(frozen=True)
class Link:
    """A leaf's cable to the spine: the port at each end, and the spine's lhc address on it."""

    leaf: str
    leaf_port: int
    spine_port: int
    spine_ip: str
    spine_mac: str
    spine_udp_port: int


@dataclass(frozen=True)
class Topology:
    switches: dict[str, Switch]
    hosts: dict[str, Host]
    links: dict[str, Link]  # by leaf

    @property
    def fabric(self) -> bool:
        """Several switches (leaves and a spine) rather than one."""
        return SINGLE not in self.switches

    @property
    def spine(self) -> Switch | None:
        return next((s for s in self.switches.values() if s.role == "spine"), None)

    # The one switch's address (a one-switch topology), as ``--dataplane`` defaults to.
    @property
    def switch_ip(self) -> str:
        return self.switches[SINGLE].ip

    @property
    def switch_udp_port(self) -> int:
        return self.switches[SINGLE].udp_port

    def host(self, name: str) -> Host:
        try:
            return self.hosts[name]
        except KeyError:
            known = ", ".join(sorted(self.hosts)) or "none"
            raise errors.invalid(f"unknown topology host {name!r} (known: {known})") from None

    def host_at(self, ip: str) -> Host | None:
        return next((h for h in self.hosts.values() if h.ip == ip), None)

    def forwarding_entries(self, switch: str = SINGLE) -> list[TableEntrySpec]:
        """``switch``'s routes: each host's /32 and MAC to its port on its own leaf, up the link on the other
        leaves, and down the host's leaf's link on the spine."""
        me = self.switches.get(switch)
        if me is None:
            return []
        entries = []
        for h in self.hosts.values():
            if h.switch == switch:
                hop = (h.port, me.mac, h.mac)
            elif me.role == "spine" and h.switch in self.links:
                link = self.links[h.switch]
                hop = (link.spine_port, link.spine_mac, self.switches[h.switch].mac)
            elif me.role == "leaf" and switch in self.links:
                link = self.links[switch]
                hop = (link.leaf_port, me.mac, link.spine_mac)
            else:
                continue  # no way there from this switch
            port, src_mac, dst_mac = hop
            entries.append(TableEntrySpec(
                "LhcIngress.ipv4_routes", (("hdr.ipv4.dst_addr", (ip_to_int(h.ip), 32)),), "LhcIngress.route",
                (("port", port), ("src_mac", mac_to_int(src_mac)), ("dst_mac", mac_to_int(dst_mac))),
            ))
            entries.append(TableEntrySpec(
                "LhcIngress.l2_forward", (("hdr.ethernet.dst_addr", mac_to_int(h.mac)),),
                "LhcIngress.set_port", (("port", port),),
            ))
        return entries


def _field(item: dict, key: str, where: str) -> object:
    if not isinstance(item, dict):
        raise errors.invalid(f"{where}: must be an object")
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


def _port(value: object, where: str) -> int:
    if not isinstance(value, int) or not 0 <= value < DROP_PORT:
        raise errors.invalid(f"{where}: port {value!r} is outside 0..{DROP_PORT - 1}")
    return value


def _lhc_port(value: object, where: str) -> int:
    if not isinstance(value, int) or value & c.UDP_PORT_MASK != c.UDP_PORT_BASE:
        raise errors.invalid(
            f"{where}: udp_port {value!r} is not in the lhc port range "
            f"{c.UDP_PORT_BASE}..{c.UDP_PORT_BASE + c.UDP_PORT_COUNT - 1}"
        )
    return value


def _switch(item: dict, name: str, role: str, where: str) -> Switch:
    device_id = item.get("device_id", 1)
    if not isinstance(device_id, int) or device_id < 0:
        raise errors.invalid(f"{where}: device_id {device_id!r} is not a non-negative integer")
    return Switch(name, role, _ip(_field(item, "ip", where), where), _mac(_field(item, "mac", where), where),
                  _lhc_port(item.get("udp_port", c.UDP_PORT_BASE), where), str(item.get("p4runtime", "")),
                  device_id)


def _fabric_switches(data: dict) -> tuple[dict[str, Switch], dict[str, Link]]:
    switches: dict[str, Switch] = {}
    for i, item in enumerate(_field(data, "switches", "topology")):
        name = str(_field(item, "name", f"topology switch #{i}"))
        role = _field(item, "role", f"switch {name}")
        if role not in ROLES:
            raise errors.invalid(f"switch {name}: role {role!r} is not one of {', '.join(ROLES)}")
        if not item.get("p4runtime"):
            raise errors.invalid(f"switch {name}: no 'p4runtime' address (HOST:PORT the controller dials)")
        if name in switches or name == SINGLE:
            taken = " (reserved for a one-switch topology)" if name == SINGLE else ""
            raise errors.invalid(f"switch {name}: the name is taken{taken}")
        switches[name] = _switch(item, name, role, f"switch {name}")
    spines = [s.name for s in switches.values() if s.role == "spine"]
    if len(spines) > 1:
        raise errors.invalid(f"topology: one spine at most (two levels), got {spines}")
    for key in ("p4runtime", "ip"):
        seen: dict[object, str] = {}
        for s in switches.values():
            value = (s.p4runtime, s.device_id) if key == "p4runtime" else (s.ip, s.udp_port)
            if value in seen:
                raise errors.invalid(f"switch {s.name}: {key} {value[0]} is also switch {seen[value]}'s")
            seen[value] = s.name
    links: dict[str, Link] = {}
    for i, item in enumerate(data.get("links", [])):
        where = f"topology link #{i}"
        leaf = str(_field(item, "leaf", where))
        if switches.get(leaf) is None or switches[leaf].role != "leaf":
            raise errors.invalid(f"{where}: {leaf!r} is not a leaf of the topology")
        if not spines:
            raise errors.invalid(f"{where}: the topology has no spine to link leaf {leaf} to")
        if leaf in links:
            raise errors.invalid(f"{where}: leaf {leaf} has a link already (one uplink per leaf)")
        spine = switches[spines[0]]
        links[leaf] = Link(
            leaf, _port(_field(item, "leaf_port", where), where),
            _port(_field(item, "spine_port", where), where),
            _ip(item.get("spine_ip", spine.ip), where), _mac(item.get("spine_mac", spine.mac), where),
            _lhc_port(item.get("spine_udp_port", spine.udp_port), where),
        )
    return switches, links


def parse_topology(data: dict) -> Topology:
    if not isinstance(data, dict):
        raise errors.invalid("topology: must be a JSON object")
    if "switches" in data:
        if "switch" in data:
            raise errors.invalid("topology: give 'switch' (one switch) or 'switches' (a fabric), not both")
        switches, links = _fabric_switches(data)
    else:
        switch = _field(data, "switch", "topology")
        if not isinstance(switch, dict):
            raise errors.invalid("topology: 'switch' must be an object")
        switches, links = {SINGLE: _switch(switch, SINGLE, SINGLE, "topology switch")}, {}
    hosts: dict[str, Host] = {}
    seen: dict[str, str] = {}
    for i, item in enumerate(_field(data, "hosts", "topology")):
        name = str(_field(item, "name", f"topology host #{i}"))
        where = f"host {name}"
        under = str(item.get("switch", SINGLE)) if SINGLE in switches else str(_field(item, "switch", where))
        if switches.get(under) is None or switches[under].role not in ("leaf", SINGLE):
            leaves = sorted(s.name for s in switches.values() if s.role == "leaf")
            raise errors.invalid(f"{where}: switch {under!r} is not a leaf of the topology ({leaves})")
        host = Host(name, _ip(_field(item, "ip", where), where), _mac(_field(item, "mac", where), where),
                    _port(_field(item, "port", where), where),
                    _control_ips(item.get("control_ips", []), where), under)
        for key in (name, host.ip, host.mac):
            if key in seen:
                raise errors.invalid(f"{where}: {key} is also host {seen[key]}'s")
            seen[key] = name
        hosts[name] = host
    return Topology(switches, hosts, links)


def load_topology(path: Path | str) -> Topology:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise errors.invalid(f"topology {path}: {exc}") from None
    return parse_topology(data)
