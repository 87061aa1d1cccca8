"""What softswitch's pipeline binds in a P4Info: the tables, actions, counter and registers of
``p4src/v1model/lhc.p4`` by name and width, and the check that a pushed P4Info has them all.

Kept apart from ``softswitch.pipeline`` (the per-packet code) so that each module has one job.
"""

from __future__ import annotations

from p4.config.v1 import p4info_pb2

from lhc_ina.p4info import P4InfoIndex
from softswitch.tables import ActionCall

# Action names the pipeline dispatches on (P4Info names, docs/switch.md).
SET_JOB = "LhcIngress.set_job"
UNKNOWN_JOB = "LhcIngress.unknown_job"
ADMIT_WORKER = "LhcIngress.admit_worker"
REJECT_WORKER = "LhcIngress.reject_worker"
SET_UPLINK = "LhcIngress.set_uplink"
NO_UPLINK = "LhcIngress.no_uplink"
ROUTE = "LhcIngress.route"
SET_PORT = "LhcIngress.set_port"
DROP = "LhcIngress.drop"
SET_REPLICA_DST = "LhcEgress.set_replica_dst"
DROP_REPLICA = "LhcEgress.drop_replica"

#: Tables the pipeline binds: name -> (match fields as (name, bits), match kind).
TABLES: dict[str, tuple[tuple[tuple[str, int], ...], str]] = {
    "LhcIngress.jobs": ((("hdr.lhc.job_id", 16),), "exact"),
    "LhcIngress.workers": (
        (("hdr.lhc.job_id", 16), ("hdr.lhc.worker_id", 8), ("hdr.ipv4.src_addr", 32),
         ("hdr.udp.src_port", 16), ("standard_metadata.ingress_port", 9)),
        "exact",
    ),
    "LhcIngress.uplinks": ((("hdr.lhc.job_id", 16),), "exact"),
    "LhcIngress.ipv4_routes": ((("hdr.ipv4.dst_addr", 32),), "lpm"),
    "LhcIngress.l2_forward": ((("hdr.ethernet.dst_addr", 48),), "exact"),
    "LhcEgress.replicas": ((("hdr.lhc.job_id", 16), ("standard_metadata.egress_rid", 16)), "exact"),
}
#: Actions the pipeline executes: name -> params as (name, bits), in the order it unpacks them.
ACTIONS: dict[str, tuple[tuple[str, int], ...]] = {
    SET_JOB: (
        ("job_index", 8), ("slot_base", 16), ("slot_count", 16), ("fan_in", 8), ("mcast_grp", 16),
        ("epoch", 16),
    ),
    UNKNOWN_JOB: (),
    ADMIT_WORKER: (("worker_bit", 32),),
    REJECT_WORKER: (),
    SET_UPLINK: (
        ("port", 9), ("worker_id", 8), ("src_mac", 48), ("dst_mac", 48), ("src_addr", 32), ("dst_addr", 32),
        ("src_port", 16), ("dst_port", 16),
    ),
    NO_UPLINK: (),
    ROUTE: (("port", 9), ("src_mac", 48), ("dst_mac", 48)),
    SET_PORT: (("port", 9),),
    DROP: (),
    SET_REPLICA_DST: (("dst_mac", 48), ("dst_addr", 32), ("dst_port", 16)),
    DROP_REPLICA: (),
}
STATS_COUNTER = "LhcIngress.lhc_stats"
REGISTERS = {
    "LhcIngress.slot_epoch": 16,
    "LhcIngress.slot_round": 32,
    "LhcIngress.slot_bitmap": 32,
    "LhcIngress.slot_remaining": 8,
    "LhcIngress.slot_values": 32,
}


class PipelineMismatch(ValueError):
    """The P4Info lacks something the pipeline executes, or gives it other widths."""


def check_p4info(p4info: P4InfoIndex) -> None:
    """Fail loudly, by name, when the P4Info and this pipeline disagree on what it binds."""
    problems = []
    for name, (fields, kind) in TABLES.items():
        table = p4info.tables.get(name)
        if table is None:
            problems.append(f"no table {name}")
            continue
        got = tuple((f.name, f.bitwidth) for f in table.match_fields)
        kinds = {p4info_pb2.MatchField.MatchType.Name(f.match_type).lower() for f in table.match_fields}
        if got != fields or kinds != {kind}:
            problems.append(f"table {name}: match fields {got} ({kinds}), the pipeline implements "
                            f"{fields} ({kind})")
    for name, params in ACTIONS.items():
        action = p4info.actions.get(name)
        if action is None:
            problems.append(f"no action {name}")
        elif tuple((p.name, p.bitwidth) for p in action.params) != params:
            problems.append(f"action {name}: params differ from the pipeline's {params}")
    if STATS_COUNTER not in p4info.counters:
        problems.append(f"no counter {STATS_COUNTER}")
    for name, bits in REGISTERS.items():
        register = p4info.registers.get(name)
        if register is None or register.bitwidth != bits:
            problems.append(f"register {name} must be bit<{bits}>")
    if problems:
        raise PipelineMismatch("P4Info does not match the softswitch pipeline: " + "; ".join(problems))


def initial_default(p4info: P4InfoIndex, table_name: str) -> tuple[ActionCall, bool]:
    """The table's initial default action (from the P4Info) and whether it is const."""
    for table in p4info.p4info.tables:
        if table.preamble.name == table_name:
            action_id = table.initial_default_action.action_id or table.const_default_action_id
            if not action_id:
                raise PipelineMismatch(f"table {table_name} has no default action in the P4Info")
            action = p4info.by_id(action_id)
            arguments = table.initial_default_action.arguments
            args = {a.param_id: int.from_bytes(a.value, "big") for a in arguments}
            call = (action.name, *(args.get(p.id, 0) for p in action.params))
            return call, table.const_default_action_id != 0
    raise PipelineMismatch(f"no table {table_name}")
