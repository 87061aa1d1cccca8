"""P4Runtime reads against softswitch's pipeline: what an Entity selects, rendered as p4lang/PI renders
it for BMv2 (values in canonical form, a default entry on request, the multicast groups as they were
written, counters by index or whole), with PI's codes for what it refuses. The writes and their checks are
``entity_store.py``'s."""

from __future__ import annotations

from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2 as p4v1

from lhc_ina.p4rt.values import canonical
from softswitch.entity_store import Entities, TableInfo
from softswitch.errors import NO_CLONE_SESSIONS, SwitchError, invalid, unsupported
from softswitch.pre import FIRST_RESERVED_GROUP
from softswitch.tables import ActionCall, EntryExtras, LpmTable


def read(entities: Entities, entity: p4v1.Entity, response: p4v1.ReadResponse) -> None:
    """Append what ``entity`` selects (wildcards allowed) to ``response``; SwitchError if refused."""
    kind = entity.WhichOneof("entity")
    if kind == "table_entry":
        _table_read(entities, entity.table_entry, response)
    elif kind == "packet_replication_engine_entry":
        _pre_read(entities, entity.packet_replication_engine_entry, response)
    elif kind == "counter_entry":
        _counter_read(entities, entity.counter_entry, response)
    elif kind == "direct_counter_entry":
        entities.no_direct_counter(entity.direct_counter_entry)
    else:
        raise unsupported(kind, "read")


def _table_read(entities: Entities, request: p4v1.TableEntry, response: p4v1.ReadResponse) -> None:
    whole = request.table_id == 0
    infos = list(entities.tables.values()) if whole else [entities.table_info(request.table_id)]
    for info in infos:
        if request.is_default_action:
            entry = response.entities.add().table_entry
            entry.table_id = info.proto.preamble.id
            entry.is_default_action = True
            _fill_action(entities, entry, info.table.default, info.table.default_extras)
            continue
        if request.match:
            key = entities.match_key(info, request)
            found = info.table.get(key)  # type: ignore[arg-type]
            selected = [] if found is None else [(key, *found)]
        else:
            extras = info.table.extras
            selected = [(key, action, extras[key]) for key, action in info.table.entries.items()]
        for key, action, extras in selected:
            entry = response.entities.add().table_entry
            entry.table_id = info.proto.preamble.id
            _fill_match(entry, info, key)
            _fill_action(entities, entry, action, extras)


def _fill_match(entry: p4v1.TableEntry, info: TableInfo, key: int | tuple[int, int]) -> None:
    fields = info.proto.match_fields
    if isinstance(info.table, LpmTable):
        value, prefix = key  # type: ignore[misc]
        if prefix:  # PI leaves out a don't-care LPM field
            match = entry.match.add(field_id=fields[0].id)
            match.lpm.value = canonical(value)
            match.lpm.prefix_len = prefix
        return
    shift = sum(f.bitwidth for f in fields)
    for field in fields:
        shift -= field.bitwidth
        match = entry.match.add(field_id=field.id)
        match.exact.value = canonical((key >> shift) & ((1 << field.bitwidth) - 1))  # type: ignore[operator]


def _fill_action(entities: Entities, entry: p4v1.TableEntry, action: ActionCall, extras: EntryExtras) -> None:
    spec = entities.actions[entities.action_ids[action[0]]]
    out = entry.action.action
    out.action_id = spec.preamble.id
    for param, value in zip(spec.params, action[1:], strict=True):
        out.params.add(param_id=param.id, value=canonical(value))
    entry.controller_metadata, entry.metadata, entry.idle_timeout_ns = extras


def _pre_read(
    entities: Entities, request: p4v1.PacketReplicationEngineEntry, response: p4v1.ReadResponse
) -> None:
    if request.WhichOneof("type") != "multicast_group_entry":
        raise SwitchError(code_pb2.UNIMPLEMENTED, NO_CLONE_SESSIONS)
    group_id = request.multicast_group_entry.multicast_group_id
    if group_id >= FIRST_RESERVED_GROUP:
        raise SwitchError(code_pb2.OUT_OF_RANGE, f"multicast group id {group_id} is too high")
    if group_id == 0:
        selected = [entities.groups[g] for g in sorted(entities.groups)]
    elif group_id in entities.groups:
        selected = [entities.groups[group_id]]
    else:
        raise SwitchError(code_pb2.NOT_FOUND, f"multicast group {group_id} does not exist")
    for group in selected:
        response.entities.add().packet_replication_engine_entry.multicast_group_entry.CopyFrom(group)


def _counter_read(entities: Entities, request: p4v1.CounterEntry, response: p4v1.ReadResponse) -> None:
    counter_ids = sorted(entities.counters) if request.counter_id == 0 else [request.counter_id]
    for counter_id in counter_ids:
        packets, nbytes = entities.counter_arrays(counter_id)
        if request.HasField("index"):
            index = request.index.index
            if index < 0:
                raise invalid("a negative number is not a valid index value")
            if index >= len(packets):
                raise SwitchError(code_pb2.UNKNOWN, f"error when reading counter from target: index "
                                  f"{index} is outside 0..{len(packets) - 1}")
            indexes = range(index, index + 1)
        else:
            indexes = range(len(packets))
        for index in indexes:
            entry = response.entities.add().counter_entry
            entry.counter_id = counter_id
            entry.index.index = index
            entry.data.packet_count = int(packets[index])
            entry.data.byte_count = int(nbytes[index])
