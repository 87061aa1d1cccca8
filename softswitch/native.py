"""The native pipeline: ``softswitch/_dataplane.c + dataplane_*.c`` bound to one ``Pipeline``'s state.

The C engine runs the per-packet semantics of ``softswitch.pipeline`` (the reference model) over whole
bursts: one recvmmsg per port, every frame through the pipeline, one sendmmsg per port. It owns no state:
it reads and writes the Pipeline's numpy registers and counters in place and looks entries up in the
tables' own dicts, with the GIL held under the switch lock, so a P4Runtime write lands between bursts
exactly as with the Python data plane.

Every number the C code uses (header offsets and widths, codes, limits, table key layouts, action
parameter positions) comes from ``layout()``, built here from ``lhc_ina.constants``, ``lhc_ina.wire`` and
``softswitch.program``: the C files hold no copy of them.
"""

from __future__ import annotations

from types import ModuleType

from lhc_ina import constants as c
from lhc_ina import wire
from lhc_ina.udp import errno_names
from softswitch import capture, program
from softswitch.pipeline import DROP_PORT, RX_BYTES, Pipeline
from softswitch.ports import MAX_PORT, Port, RawPort, UdpPort

_native: ModuleType | None
try:
    from softswitch import _dataplane as _native
except ImportError:  # built without a C compiler: the Python pipeline runs
    _native = None

PIPELINES = ("native", "python")


def native_available() -> bool:
    """Whether setup.py built the native data plane."""
    return _native is not None


def choose_pipeline(requested: str | None) -> str:
    """The pipeline to run: the one requested, or native where it is built and python otherwise.

    Raises RuntimeError when native is requested and not built."""
    if requested is None:
        return "native" if _native is not None else "python"
    if requested not in PIPELINES:
        raise ValueError(f"pipeline must be one of {PIPELINES}, not {requested!r}")
    if requested == "native" and _native is None:
        raise RuntimeError(
            "the native pipeline (softswitch/_dataplane.c) is not built: reinstall (pip install -e .) "
            "where a C compiler and the Python headers are present, or run --pipeline python"
        )
    return requested


def _action_layout(action: str, names: dict[str, str], length: str | None = None) -> dict[str, int]:
    """Where an action call ``(name, *params)`` holds the params ``names`` maps to layout names, and its
    length under ``length``: the positions pipeline.py unpacks."""
    params = [name for name, _ in program.ACTIONS[action]]
    out = {layout_name: 1 + params.index(param) for param, layout_name in names.items()}
    if length is not None:
        out[length] = 1 + len(params)
    return out


def layout(pipeline: Pipeline, burst: int) -> dict[str, int]:
    """Every number the C engine uses, by the name ``dataplane.h`` gives it."""
    offsets, shifts, widths = wire.HEADER_OFFSETS, wire.HEADER_SHIFTS, dict(c.HEADER_FIELDS)
    fields = ("worker_id", "job_id", "slot", "epoch", "seq", "bitmap")
    lhc = {f"lhc_{name}": wire.FRAME_LHC + offsets[name] for name in fields}
    lhc["lhc_byte0"] = wire.FRAME_LHC + offsets["msg_type"]
    sizes = {f"{name}_bytes": widths[name] // 8 for name in fields}
    stats = {f"stat_{stat.name.lower()}": int(stat) for stat in c.Stat}
    workers, replicas = pipeline.workers.widths, pipeline.replicas.widths
    job_shift, worker_shift, src_shift, sport_shift, _ = (sum(workers[i + 1:]) for i in range(len(workers)))
    return {
        "ethernet_bytes": c.ETHERNET_BYTES, "frame_ipv4": wire.FRAME_IPV4, "frame_udp": wire.FRAME_UDP,
        "frame_lhc": wire.FRAME_LHC, "frame_payload": wire.FRAME_PAYLOAD, "frame_end": wire.FRAME_END,
        "eth_dst": wire.ETH_DST.start, "eth_src": wire.ETH_SRC.start,
        "mac_bytes": wire.ETH_DST.stop - wire.ETH_DST.start, "eth_type": wire.ETH_TYPE,
        "ip_total_len": wire.IP_TOTAL_LEN, "ip_frag": wire.IP_FRAG, "ip_ttl": wire.IP_TTL,
        "ip_proto": wire.IP_PROTO, "ip_checksum": wire.IP_CHECKSUM, "ip_src": wire.IP_SRC.start,
        "ip_dst": wire.IP_DST.start, "ip_addr_bytes": wire.IP_SRC.stop - wire.IP_SRC.start,
        "ipv4_bytes": c.IPV4_BYTES, "udp_sport": wire.UDP_SPORT.start, "udp_dport": wire.UDP_DPORT.start,
        "udp_port_bytes": wire.UDP_SPORT.stop - wire.UDP_SPORT.start, "udp_len": wire.UDP_LEN,
        "udp_checksum": wire.UDP_CHECKSUM, "udp_bytes": c.UDP_BYTES,
        "ipv4_version_ihl": wire.IPV4_VERSION_IHL, "frag_offset_mask": wire.IP_FRAG_OFFSET_MASK,
        "ethertype_ipv4": c.ETHERTYPE_IPV4, "ip_proto_udp": c.IP_PROTO_UDP,
        "udp_port_base": c.UDP_PORT_BASE, "udp_port_mask": c.UDP_PORT_MASK, "udp_length": c.UDP_LENGTH,
        "ipv4_total_length": c.IPV4_TOTAL_LENGTH, **lhc, **sizes,
        "type_shift": shifts["msg_type"], "op_shift": shifts["op"], "op_mask": (1 << widths["op"]) - 1,
        "ver_shift": shifts["ver"], "ver_mask": (1 << widths["ver"]) - 1, "flags_shift": shifts["flags"],
        "flags_mask": (1 << widths["flags"]) - 1, "byte0_keep": (1 << shifts["msg_type"]) - 1,
        "msg_data": int(c.MsgType.DATA), "msg_result": int(c.MsgType.RESULT),
        "msg_result_retx": int(c.MsgType.RESULT_RETX), "op_add": int(c.Op.ADD), "op_or": int(c.Op.OR),
        **stats, "lanes": c.LANES, "lane_bytes": c.LANE_BYTES, "slot_copies": c.SLOT_COPIES,
        "num_stats": c.NUM_STATS, "drop_port": DROP_PORT, "max_port": MAX_PORT, "rx_bytes": RX_BYTES,
        "burst": burst, "udp_gso_segments": c.UDP_GSO_SEGMENTS, "udp_gso_refusals": c.UDP_GSO_REFUSALS,
        "udp_gso_bytes": c.UDP_GSO_BYTES,
        # exact keys are the match fields concatenated (tables.pack_key); ipv4_routes has one LPM field
        "workers_job_shift": job_shift, "workers_worker_shift": worker_shift, "workers_src_shift": src_shift,
        "workers_sport_shift": sport_shift,
        "replicas_job_shift": replicas[1], "lpm_width": pipeline.ipv4_routes.width,
        **_action_layout(program.SET_JOB, {name: f"{name}_at" for name in (
            "job_index", "slot_base", "slot_count", "fan_in", "mcast_grp", "epoch")}, "set_job_len"),
        **_action_layout(program.ADMIT_WORKER, {"worker_bit": "worker_bit_at"}),
        **_action_layout(program.ROUTE, {"port": "route_port_at", "src_mac": "route_src_mac_at",
                                         "dst_mac": "route_dst_mac_at"}, "route_len"),
        **_action_layout(program.SET_PORT, {"port": "set_port_at"}),
        **_action_layout(program.SET_UPLINK, {name: f"uplink_{name}_at" for name in (
            "port", "worker_id", "src_mac", "dst_mac", "src_addr", "dst_addr", "src_port", "dst_port")},
            "uplink_len"),
        **_action_layout(program.SET_REPLICA_DST, {name: f"replica_{name}_at" for name in (
            "dst_mac", "dst_addr", "dst_port")}, "replica_len"),
    }


class NativePipeline:
    """The C engine over ``pipeline``'s state. ``inject`` for tests; ``attach``, ``burst`` and ``flush``
    for the data plane's loop (``burst`` under the switch lock, ``flush`` outside it)."""

    def __init__(self, pipeline: Pipeline, burst: int) -> None:
        if _native is None:
            choose_pipeline("native")  # raises the clear error
        assert _native is not None
        self.pipeline = pipeline
        actions = {"set_job": program.SET_JOB, "admit_worker": program.ADMIT_WORKER, "route": program.ROUTE,
                   "set_port": program.SET_PORT, "set_replica_dst": program.SET_REPLICA_DST,
                   "set_uplink": program.SET_UPLINK}
        self.engine = _native.Dataplane(pipeline, layout(pipeline, burst), actions)
        self.burst = self.engine.burst
        self.flush = self.engine.flush

    def inject(self, frame: bytes, ingress_port: int) -> list[tuple[int, bytes]]:
        """``Pipeline.inject``: one frame through the pipeline, the frames it sends as (port, bytes)."""
        return self.engine.inject(frame, ingress_port)

    def attach(self, port: Port) -> None:
        """Let the engine receive from and send to ``port``'s socket (the port keeps owning it)."""
        if isinstance(port, UdpPort):
            self.engine.attach_udp(port.number, port.fileno(), port.template)
        elif isinstance(port, RawPort):
            self.engine.attach_raw(port.number, port.fileno())
        else:
            raise TypeError(f"cannot attach {port!r}")

    def set_capture(self, records: list[tuple[int, int, bytes]]) -> None:
        """From now on every burst appends ``(direction, port, frame)`` to ``records`` for each frame it
        receives and each frame it queues on a port (``softswitch.capture``)."""
        self.engine.set_capture(records, capture.INBOUND, capture.OUTBOUND)

    @property
    def errors(self) -> int:
        """Frames that raised (a broken table entry), and ``last_error``: the last one's exception."""
        return self.engine.errors

    @property
    def last_error(self) -> BaseException | None:
        return self.engine.last_error

    def port_counters(self) -> dict[int, dict]:
        """Per port: frames received, frames dropped because they could not leave a UDP port, datagrams
        the kernel refused, and those again per errno name (``{"EINVAL": 3}``): the shape of
        ``DataPlane.port_counters`` for either pipeline."""
        counters = self.engine.port_counters()
        for port in counters.values():
            port["send_errors_by_errno"] = errno_names(port["send_errors_by_errno"])
        return counters
