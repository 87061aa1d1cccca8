"""P4Runtime entities <-> pipeline state: table entries, multicast groups, counters.

Validation follows p4lang/PI's DeviceMgr (the P4Runtime server inside BMv2's simple_switch_grpc) check for
check, with the same canonical codes, so a client sees the same failure on both targets:

- unknown table/action/counter id, unknown or missing match field, wrong match kind, a value wider than its
  field or param, wrong param count, an LPM prefix of 0 or with host bits set, a priority on a table
  without ternary fields, INSERT/DELETE of a default entry: INVALID_ARGUMENT;
- an action used against its scope (``@defaultonly`` in an entry, table-only as default) or a change to
  a ``const default_action``: PERMISSION_DENIED;
- duplicate entry or group: ALREADY_EXISTS; missing entry or group on MODIFY/DELETE: NOT_FOUND;
- full table: UNKNOWN (PI reports the target's refusal); group id >= 2^15: OUT_OF_RANGE;
- register reads and writes: UNIMPLEMENTED, as BMv2 answers them.

Values are accepted in any byte length whose value fits (as PI does) and read back in canonical form
(shortest big-endian, zero as one byte).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from google.rpc import code_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2 as p4v1

from softswitch.errors import NO_CLONE_SESSIONS, SwitchError, invalid, unsupported
from softswitch.pipeline import Pipeline
from softswitch.tables import ActionCall, EntryExtras, ExactTable, LpmTable, pack_key

_EXACT = p4info_pb2.MatchField.EXACT
_LPM = p4info_pb2.MatchField.LPM
_TABLE_ONLY = p4info_pb2.ActionRef.TABLE_ONLY
_DEFAULT_ONLY = p4info_pb2.ActionRef.DEFAULT_ONLY
_Update = p4v1.Update


def _fit(data: bytes, bits: int, what: str) -> int:
    """A P4Runtime byte string as an int, refused when its value does not fit in ``bits`` (PI accepts any
    length whose value fits)."""
    value = int.from_bytes(data, "big")
    if value >> bits:
        raise invalid(f"{what}: value {data.hex() or '(empty)'} does not fit within {bits} bits")
    return value


def _invalid_id(kind: str, entity_id: int) -> SwitchError:
    return invalid(f"invalid P4 id {entity_id:#x}: the P4Info has no {kind} with that id")


@dataclass
class TableInfo:
    table: ExactTable | LpmTable
    proto: p4info_pb2.Table
    scopes: dict[int, int]  # action id -> ActionRef scope

    @property
    def name(self) -> str:
        return self.proto.preamble.name


class Entities:
    """Reads and writes P4Runtime entities against one pipeline, with the ids of one P4Info (the reads
    render in ``entity_reads.py``, which takes an Entities: this module does not import it).

    The pipeline's group replicas are tuples; the proto of each group is kept as written so reads give
    back the replica port in the form the client used (``egress_port`` or ``port``), as PI does.
    """

    def __init__(self, pipeline: Pipeline, p4info: p4info_pb2.P4Info) -> None:
        self.pipeline = pipeline
        self.p4info = p4info
        self.tables = {
            t.preamble.id: TableInfo(
                pipeline.tables[t.preamble.name], t, {ref.id: ref.scope for ref in t.action_refs}
            )
            for t in p4info.tables
        }
        self.actions = {a.preamble.id: a for a in p4info.actions}
        self.action_ids = {a.preamble.name: a.preamble.id for a in p4info.actions}
        self.counters = {c.preamble.id: c for c in p4info.counters}
        self.registers = {r.preamble.id for r in p4info.registers}
        self.groups: dict[int, p4v1.MulticastGroupEntry] = {}

    def reset(self) -> None:
        self.groups.clear()

    # --- writes ------------------------------------------------------------------------------------
    def write(self, update: p4v1.Update) -> None:
        """Apply one update; raise SwitchError (with PI's code) when it is refused."""
        entity = update.entity
        kind = entity.WhichOneof("entity")
        if kind == "table_entry":
            self._table_write(update.type, entity.table_entry)
        elif kind == "packet_replication_engine_entry":
            self._pre_write(update.type, entity.packet_replication_engine_entry)
        elif kind == "counter_entry":
            self._counter_write(update.type, entity.counter_entry)
        elif kind == "direct_counter_entry":
            self.no_direct_counter(entity.direct_counter_entry)
        else:
            raise unsupported(kind, "write")

    def no_direct_counter(self, entry: p4v1.DirectCounterEntry) -> None:
        """The spec: a direct counter entry of a table without a direct counter is INVALID_ARGUMENT. No
        table of this program has one, so every such read or write is refused, naming the table."""
        table_id = entry.table_entry.table_id
        if table_id == 0:
            raise invalid("direct counter entry without a table id (no table of this program has a direct "
                          "counter)")
        raise invalid(f"table {self.table_info(table_id).name} has no direct counter")

    def table_info(self, table_id: int) -> TableInfo:
        info = self.tables.get(table_id)
        if info is None:
            raise _invalid_id("table", table_id)
        return info

    def _table_write(self, update_type: int, entry: p4v1.TableEntry) -> None:
        info = self.table_info(entry.table_id)
        if entry.HasField("time_since_last_hit"):
            raise invalid("time_since_last_hit must not be set in a WriteRequest")
        if update_type == _Update.UNSPECIFIED:
            raise invalid("update type is not set")
        if update_type not in (_Update.INSERT, _Update.MODIFY, _Update.DELETE):
            raise invalid(f"invalid update type {update_type}")
        if entry.is_default_action and update_type != _Update.MODIFY:
            raise invalid(f"{info.name}: cannot use {_Update.Type.Name(update_type)} for the default entry")
        if update_type == _Update.INSERT and not entry.HasField("action"):
            raise invalid(f"{info.name}: 'action' field must be set")
        key = self.match_key(info, entry)
        if update_type == _Update.DELETE:
            info.table.delete(key)
            return
        self._check_action_use(info, entry)
        action = self._action_call(info, entry.action) if entry.HasField("action") else None
        if action is None and not entry.is_default_action:
            raise invalid(f"{info.name}: 'action' field must be set for non-default entries")
        if entry.HasField("counter_data") or entry.HasField("meter_config"):
            raise invalid(f"{info.name} has no direct counters or meters")
        if entry.idle_timeout_ns:
            raise invalid(f"{info.name} does not support idle timeout")
        extras: EntryExtras = (entry.controller_metadata, entry.metadata, entry.idle_timeout_ns)
        if entry.is_default_action:
            info.table.set_default(action, extras)
        elif update_type == _Update.INSERT:
            info.table.insert(key, action, extras)
        else:
            info.table.modify(key, action, extras)

    def match_key(self, info: TableInfo, entry: p4v1.TableEntry) -> int | tuple[int, int] | None:
        """PI's construct_match_key: the table's key from the entry's FieldMatches, None for the default."""
        if entry.is_default_action:
            if entry.match:
                raise invalid(f"{info.name}: non-empty key for the default entry")
            if entry.priority:
                raise invalid(f"{info.name}: non-zero priority for the default entry")
            return None
        fields = info.proto.match_fields
        if len(entry.match) > len(fields):
            raise invalid(f"{info.name}: too many fields in match key ({len(entry.match)} > {len(fields)})")
        given = {}
        for match in entry.match:
            given.setdefault(match.field_id, match)
        values: list[int] = []
        prefix = None
        for field in fields:
            match = given.get(field.id)
            what = f"{info.name} match field {field.name}"
            if field.match_type == _EXACT:
                if match is None:
                    raise invalid(f"{what}: missing non-ternary field in match key")
                if match.WhichOneof("field_match_type") != "exact":
                    raise invalid(f"{what}: invalid match type (the field is exact)")
                values.append(_fit(match.exact.value, field.bitwidth, what))
            elif field.match_type == _LPM:
                if match is None:  # don't care: prefix length 0
                    values.append(0)
                    prefix = 0
                    continue
                if match.WhichOneof("field_match_type") != "lpm":
                    raise invalid(f"{what}: invalid match type (the field is lpm)")
                value = _fit(match.lpm.value, field.bitwidth, what)
                prefix = match.lpm.prefix_len
                if prefix < 0 or prefix > field.bitwidth:
                    raise invalid(f"{what}: prefix length {prefix} is outside 1..{field.bitwidth}")
                if prefix == 0:
                    raise invalid(f"{what}: invalid representation of 'don't care' LPM match, omit the "
                                  "match field instead of using a prefix length of 0")
                if value & ((1 << (field.bitwidth - prefix)) - 1):
                    raise invalid(f"{what}: invalid LPM value, incorrect number of trailing zeros")
                values.append(value)
            else:  # the P4Info comparison admits only the exact and lpm fields of the program
                raise invalid(f"{what}: match kind {field.match_type} is not implemented")
        if sum(1 for f in fields if f.id in given) != len(entry.match):
            raise invalid(f"{info.name}: unknown field in match key")
        if entry.priority:
            raise invalid(f"{info.name}: non-zero priority for a table without ternary, range or optional "
                          "fields")
        if isinstance(info.table, LpmTable):
            return (values[0], prefix or 0)
        return pack_key(values, info.table.widths)

    def _check_action_use(self, info: TableInfo, entry: p4v1.TableEntry) -> None:
        """PI's validate_action: const defaults, direct actions only, action in the table, scope."""
        if entry.is_default_action and info.table.const_default:
            raise SwitchError(code_pb2.PERMISSION_DENIED, f"cannot set / reset the default action of "
                              f"{info.name}, which has a const default action")
        if not entry.HasField("action"):
            return
        if entry.action.WhichOneof("type") != "action":
            raise invalid(f"{info.name}: cannot provide an indirect action for a direct table")
        action_id = entry.action.action.action_id
        if action_id not in self.actions:
            raise _invalid_id("action", action_id)
        scope = info.scopes.get(action_id)
        name = self.actions[action_id].preamble.name
        if scope is None:
            raise invalid(f"invalid action for table: {info.name} has no action {name}")
        if scope == _TABLE_ONLY and entry.is_default_action:
            raise SwitchError(code_pb2.PERMISSION_DENIED, f"cannot use TABLE_ONLY action {name} as the "
                              f"default action of {info.name}")
        if scope == _DEFAULT_ONLY and not entry.is_default_action:
            raise SwitchError(code_pb2.PERMISSION_DENIED, f"cannot use DEFAULT_ONLY action {name} in a "
                              f"table entry of {info.name}")

    def _action_call(self, info: TableInfo, table_action: p4v1.TableAction) -> ActionCall:
        action = table_action.action
        spec = self.actions[action.action_id]
        name = spec.preamble.name
        if len(action.params) != len(spec.params):
            raise invalid(f"{name}: unexpected number of action parameters ({len(action.params)}, the "
                          f"action takes {len(spec.params)})")
        given = {}
        for param in action.params:
            if param.param_id in given:
                raise invalid(f"{name}: parameter id {param.param_id} given twice")
            given[param.param_id] = param.value
        args = []
        for param in spec.params:
            if param.id not in given:
                raise invalid(f"{name}: unknown action parameter (missing {param.name})")
            args.append(_fit(given[param.id], param.bitwidth, f"{name} parameter {param.name}"))
        return (name, *args)

    def _pre_write(self, update_type: int, pre: p4v1.PacketReplicationEngineEntry) -> None:
        kind = pre.WhichOneof("type")
        if kind == "clone_session_entry":
            raise SwitchError(code_pb2.UNIMPLEMENTED, NO_CLONE_SESSIONS)
        if kind != "multicast_group_entry":
            raise invalid("invalid PRE operation: no multicast group entry")
        group = pre.multicast_group_entry
        replicas = [(self._replica_port(r), r.instance) for r in group.replicas]
        groups = self.pipeline.pre
        if update_type == _Update.INSERT:
            groups.insert(group.multicast_group_id, replicas)
        elif update_type == _Update.MODIFY:
            groups.modify(group.multicast_group_id, replicas)
        elif update_type == _Update.DELETE:
            groups.delete(group.multicast_group_id)
            del self.groups[group.multicast_group_id]
            return
        else:
            raise invalid("update type is not set" if update_type == _Update.UNSPECIFIED else
                          f"invalid update type {update_type}")
        stored = p4v1.MulticastGroupEntry()
        stored.CopyFrom(group)
        del stored.replicas[:]
        stored.replicas.extend(sorted(group.replicas, key=lambda r: (r.instance, self._replica_port(r))))
        self.groups[group.multicast_group_id] = stored

    @staticmethod
    def _replica_port(replica: p4v1.Replica) -> int:
        kind = replica.WhichOneof("port_kind")
        if kind == "egress_port":
            return replica.egress_port
        if kind == "port":
            if not replica.port:
                raise invalid("replica port must not be the empty string")
            if len(replica.port) > 4:
                raise SwitchError(code_pb2.UNIMPLEMENTED, f"replica port of {len(replica.port)} bytes, only "
                                  "4 bytes are supported")
            value = int.from_bytes(replica.port, "big")
            if value <= 0 or value >= 1 << 31:
                raise invalid("replica port must be positive")
            return value
        raise invalid("missing port in multicast group replica")

    def _counter_write(self, update_type: int, entry: p4v1.CounterEntry) -> None:
        packets, nbytes = self.counter_arrays(entry.counter_id)
        if not entry.HasField("index"):
            raise SwitchError(code_pb2.UNIMPLEMENTED, "wildcard write is not supported for indirect counters")
        index = entry.index.index
        if index < 0:
            raise invalid("a negative number is not a valid index value")
        if update_type == _Update.INSERT:
            raise invalid("INSERT update type not supported for counters")
        if update_type not in (_Update.MODIFY, _Update.DELETE):
            raise invalid("update type is not set")
        if index >= len(packets):
            raise SwitchError(code_pb2.UNKNOWN, f"error when writing to counter: index {index} is outside "
                              f"0..{len(packets) - 1}")
        modify = update_type == _Update.MODIFY
        packets[index] = entry.data.packet_count if modify else 0
        nbytes[index] = entry.data.byte_count if modify else 0

    def counter_arrays(self, counter_id: int) -> tuple[np.ndarray, np.ndarray]:
        """The packets and bytes arrays of a counter (the program has one, lhc_stats)."""
        if counter_id not in self.counters:
            raise _invalid_id("counter", counter_id)
        return self.pipeline.stats_packets, self.pipeline.stats_bytes
