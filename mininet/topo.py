"""The emulated cluster: W worker hosts in a star around one switch port each, the controller behind one
more port, links shaped by TCLink, loss injected with nftables.

Runs under the system Python that has Debian's Mininet (``/usr/bin/python3``); nothing here imports the
project's own packages, whose dependencies live in the project's virtualenv.

Addresses: host ``hI`` is 10.0.0.I with MAC 02:00:00:00:00:I behind switch port I; the switch's lhc
address is 10.0.0.253; the controller (root namespace) is 10.0.0.254 behind port W + 1, on a veth pair
of its own. Nobody answers ARP (the switch only forwards by table), so every neighbour is static.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from mininet.link import TCLink
from mininet.net import Mininet
from mininet.node import Host

SUBNET = "10.0.0"
SWITCH_IP, SWITCH_MAC = f"{SUBNET}.253", "02:00:00:00:00:fd"
CONTROLLER_IP, CONTROLLER_MAC = f"{SUBNET}.254", "02:00:00:00:00:fe"
CONTROLLER_VETH, CONTROLLER_PORT_VETH = "lhcctl0", "lhcctl1"
LHC_UDP_PORT = 19520  # lhc_ina.constants.UDP_PORT_BASE, the switch's lhc port in the topology file
LHC_UDP_PORT_COUNT = 16  # lhc_ina.constants.UDP_PORT_COUNT (tests/test_wireshark_capture.py checks both)
#: run.py --pcap's host capture filter: lhc datagrams, either way (RESULTs come from an lhc port).
LHC_CAPTURE_FILTER = f"udp portrange {LHC_UDP_PORT}-{LHC_UDP_PORT + LHC_UDP_PORT_COUNT - 1}"


def host_ip(index: int) -> str:
    return f"{SUBNET}.{index}"


def host_mac(index: int) -> str:
    return f"02:00:00:00:00:{index:02x}"


def run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


def quiet_interface(name: str, namespace_node: Host | None = None) -> None:
    """Offloads and IPv6 off: the switch reads frames with AF_PACKET and must see them as sent."""
    for command in (f"ethtool -K {name} tx off rx off tso off gso off gro off",
                    f"sysctl -qw net.ipv6.conf.{name}.disable_ipv6=1"):
        if namespace_node is None:
            run(*command.split(), check=False)
        else:
            namespace_node.cmd(command)


@dataclass
class Cluster:
    """A started emulation: the Mininet network, its hosts and the switch-side interface of each port."""

    net: Mininet
    hosts: list[Host]
    switch_ports: dict[int, str]  # switch port -> root-namespace interface softswitch attaches to

    def topology(self) -> dict:
        """The controller's topology file (controller/topology.py)."""
        hosts = [{"name": h.name, "ip": host_ip(i + 1), "mac": host_mac(i + 1), "port": i + 1}
                 for i, h in enumerate(self.hosts)]
        hosts.append({"name": "controller", "ip": CONTROLLER_IP, "mac": CONTROLLER_MAC,
                      "port": len(self.hosts) + 1})
        return {"switch": {"ip": SWITCH_IP, "mac": SWITCH_MAC, "udp_port": LHC_UDP_PORT}, "hosts": hosts}

    def write_topology(self, path: Path) -> Path:
        path.write_text(json.dumps(self.topology(), indent=1))
        return path


def build(workers: int, bw_mbit: float | None) -> Cluster:
    """Start W hosts linked to a root-namespace switch node, plus the controller's veth pair."""
    if not 1 <= workers <= 250:
        raise ValueError(f"workers must be in 1..250, not {workers}")
    net = Mininet(controller=None, switch=None, link=TCLink, build=False, autoSetMacs=False)
    switch = net.addHost("s1", inNamespace=False)
    hosts = []
    link_options = {"bw": bw_mbit} if bw_mbit else {}
    for index in range(1, workers + 1):
        host = net.addHost(f"h{index}", ip=f"{host_ip(index)}/24", mac=host_mac(index))
        net.addLink(host, switch, intfName1=f"h{index}-eth0", intfName2=f"s1-eth{index}", **link_options)
        hosts.append(host)
    net.build()
    net.start()
    switch_ports = {index: f"s1-eth{index}" for index in range(1, workers + 1)}
    for name in switch_ports.values():
        run("ip", "addr", "flush", "dev", name, check=False)  # a switch port, not an address of the root
        quiet_interface(name)
    _controller_veth(workers + 1)
    switch_ports[workers + 1] = CONTROLLER_PORT_VETH
    cluster = Cluster(net, hosts, switch_ports)
    _static_neighbours(cluster)
    return cluster


def _controller_veth(port: int) -> None:
    remove_controller_veth()
    run("ip", "link", "add", CONTROLLER_VETH, "address", CONTROLLER_MAC, "type", "veth", "peer", "name",
        CONTROLLER_PORT_VETH)
    for name in (CONTROLLER_VETH, CONTROLLER_PORT_VETH):
        quiet_interface(name)
        run("ip", "link", "set", name, "up")
    run("ip", "addr", "add", f"{CONTROLLER_IP}/24", "dev", CONTROLLER_VETH)


def remove_controller_veth() -> None:
    run("ip", "link", "del", CONTROLLER_VETH, check=False)


def _static_neighbours(cluster: Cluster) -> None:
    peers = [(host_ip(i + 1), host_mac(i + 1)) for i in range(len(cluster.hosts))]
    peers += [(SWITCH_IP, SWITCH_MAC), (CONTROLLER_IP, CONTROLLER_MAC)]
    for index, host in enumerate(cluster.hosts, start=1):
        quiet_interface(f"h{index}-eth0", host)
        for ip, mac in peers:
            if ip != host_ip(index):
                host.cmd(f"ip neigh replace {ip} lladdr {mac} dev h{index}-eth0 nud permanent")
    for ip, mac in peers[: len(cluster.hosts)]:
        run("ip", "neigh", "replace", ip, "lladdr", mac, "dev", CONTROLLER_VETH, "nud", "permanent")


# --- loss ----------------------------------------------------------------------------------------------
_LOSS_TABLE = "lhc_loss"
#: What --loss applies, as the run's JSON reports it: losses come whole per packet the hook sees.
LOSS_MODEL = ("nftables numgen drops at every host's interface, both ways (netdev ingress and egress); the "
              "egress hook sees a worker's UDP GSO send (up to UDP_GSO_SEGMENTS datagrams) as one packet and "
              "drops it whole, while results reach the host as single frames and are dropped one by one")


def in_host(host: Host, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run a command in ``host``'s namespaces, apart from its interactive shell (whose output may still
    carry an earlier command's)."""
    return subprocess.run(["mnexec", "-a", str(host.pid), *argv], input=stdin, capture_output=True,
                          text=True)


def apply_loss(cluster: Cluster, percent: int) -> None:
    """Drop ``percent``% of the frames each host sends and receives, in its own namespace (netdev
    ingress and egress hooks: the sockets never see them), counting what was dropped."""
    if not 0 < percent < 100:
        raise ValueError(f"loss must be in 1..99 percent, not {percent}")
    for index, host in enumerate(cluster.hosts, start=1):
        device = f"h{index}-eth0"
        script = "\n".join([
            f"table netdev {_LOSS_TABLE} {{",
            *(f"  chain {hook} {{ type filter hook {hook} device {device} priority 0; "
              f"numgen random mod 100 < {percent} counter drop; }}" for hook in ("ingress", "egress")),
            "}",
        ])
        done = in_host(host, "nft", "-f", "-", stdin=script)
        if done.returncode != 0:
            raise RuntimeError(f"nftables could not apply {percent}% loss on {host.name}: {done.stderr}")


def dropped(cluster: Cluster) -> dict[str, int]:
    """Frames the loss rules dropped, per host (both directions)."""
    counts = {}
    for host in cluster.hosts:
        done = in_host(host, "nft", "-j", "list", "table", "netdev", _LOSS_TABLE)
        if done.returncode != 0:
            raise RuntimeError(f"cannot read the loss counters of {host.name}: {done.stderr}")
        counts[host.name] = sum(
            expr["counter"]["packets"]
            for item in json.loads(done.stdout)["nftables"] if "rule" in item
            for expr in item["rule"]["expr"] if "counter" in expr
        )
    return counts
