"""P4Runtime entities from P4Info names: table entries, default actions, actions, counter cells and PRE
multicast groups built and checked by name before anything reaches the switch; table entries read back
into names and ints (hashable, so desired and actual state diff as sets)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2

from lhc_ina.p4info import P4InfoError, P4InfoIndex
from lhc_ina.p4rt.values import P4RuntimeValueError, Value, decode_value, encode_value, value_to_int

_MATCH = p4info_pb2.MatchField


def _format_names(names: Iterable[str]) -> str:
    return ", ".join(sorted(names)) or "none"


class EntityBuilder:
    """Builds P4Runtime entity messages from P4Info names; every name and width is checked here, so a
    mistake is reported by name before anything reaches the switch."""

    def __init__(self, p4info: P4InfoIndex) -> None:
        self.p4info = p4info

    def table_entry(
        self,
        table: str,
        match: Mapping[str, Any] | None = None,
        action: str | None = None,
        params: Mapping[str, Value] | None = None,
        *,
        priority: int = 0,
    ) -> p4runtime_pb2.TableEntry:
        """A table entry. ``match`` maps match-field names to:

        - exact: a value;
        - lpm: ``(value, prefix_len)`` or ``"a.b.c.d/len"``;
        - ternary: ``(value, mask)``;
        - range: ``(low, high)``;
        - optional: a value.

        Don't-care matches (lpm prefix 0, ternary mask 0) are left out, as P4Runtime requires. ``action`` may
        be omitted only for a match-only entry used in reads and deletes.
        """
        info = self.p4info.table(table)
        entry = p4runtime_pb2.TableEntry(table_id=info.id, priority=priority)
        given = dict(match or {})
        for name in given:
            info.match_field(name)  # raises with the table's name when unknown
        for mf in info.match_fields:
            if mf.name not in given:
                if mf.match_type == _MATCH.EXACT:
                    raise P4RuntimeValueError(f"table {table}: exact match field {mf.name!r} is required")
                continue
            field_match = self._field_match(table, mf, given[mf.name])
            if field_match is not None:
                entry.match.append(field_match)
        if action is not None:
            entry.action.action.CopyFrom(self.action(action, params, table=table))
        elif params:
            raise P4RuntimeValueError(f"table {table}: params given without an action")
        return entry

    def default_action(
        self, table: str, action: str, params: Mapping[str, Value] | None = None
    ) -> p4runtime_pb2.TableEntry:
        """The table's default entry with ``action``; write it with MODIFY (a default entry always exists)."""
        info = self.p4info.table(table)
        entry = p4runtime_pb2.TableEntry(table_id=info.id, is_default_action=True)
        entry.action.action.CopyFrom(self.action(action, params, table=table))
        return entry

    def action(
        self, name: str, params: Mapping[str, Value] | None = None, *, table: str | None = None
    ) -> p4runtime_pb2.Action:
        """An action with all of its parameters (by name); when ``table`` is given, the action must be one
        of that table's."""
        info = self.p4info.action(name)
        if table is not None:
            table_info = self.p4info.table(table)
            if info.id not in table_info.action_ids:
                allowed = (self.p4info.by_id(action_id) for action_id in table_info.action_ids)
                raise P4InfoError(
                    f"action {name!r} is not an action of table {table} "
                    f"(its actions: {_format_names(a.name for a in allowed)})"
                )
        given = dict(params or {})
        for param_name in given:
            info.param(param_name)  # raises with the action's name when unknown
        missing = [p.name for p in info.params if p.name not in given]
        if missing:
            raise P4RuntimeValueError(f"action {name}: missing parameter(s) {_format_names(missing)}")
        message = p4runtime_pb2.Action(action_id=info.id)
        for param in info.params:
            message.params.add(
                param_id=param.id,
                value=encode_value(given[param.name], param.bitwidth, f"{name}({param.name})"),
            )
        return message

    def counter_entry(self, counter: str, index: int | None = None) -> p4runtime_pb2.CounterEntry:
        """A counter cell (or, with ``index`` None, every cell of the counter, for a read)."""
        info = self.p4info.counter(counter)
        entry = p4runtime_pb2.CounterEntry(counter_id=info.id)
        if index is not None:
            if not 0 <= index < info.size:
                raise P4RuntimeValueError(f"counter {counter} has {info.size} cells, no index {index}")
            entry.index.index = index
        return entry

    def _field_match(self, table: str, mf: Any, spec: Any) -> p4runtime_pb2.FieldMatch | None:
        what = f"{table} match {mf.name}"
        width = mf.bitwidth
        fm = p4runtime_pb2.FieldMatch(field_id=mf.id)
        if mf.match_type == _MATCH.EXACT:
            fm.exact.value = encode_value(spec, width, what)
        elif mf.match_type == _MATCH.LPM:
            value, prefix = _lpm_spec(spec, what)
            if not 0 <= prefix <= width:
                raise P4RuntimeValueError(f"{what}: prefix length {prefix} is outside 0..{width}")
            if prefix == 0:
                return None
            number = value_to_int(value)
            host_bits = (1 << (width - prefix)) - 1
            if number & host_bits:
                raise P4RuntimeValueError(f"{what}: {value!r} has bits set beyond the /{prefix} prefix")
            fm.lpm.value = encode_value(number, width, what)
            fm.lpm.prefix_len = prefix
        elif mf.match_type == _MATCH.TERNARY:
            value, mask = _pair(spec, what, "(value, mask)")
            number, mask_number = value_to_int(value), value_to_int(mask)
            if mask_number == 0:
                return None
            if number & ~mask_number:
                raise P4RuntimeValueError(f"{what}: {value!r} has bits set outside the mask {mask!r}")
            fm.ternary.value = encode_value(number, width, what)
            fm.ternary.mask = encode_value(mask_number, width, what)
        elif mf.match_type == _MATCH.RANGE:
            low, high = _pair(spec, what, "(low, high)")
            fm.range.low = encode_value(low, width, what)
            fm.range.high = encode_value(high, width, what)
        elif mf.match_type == _MATCH.OPTIONAL:
            fm.optional.value = encode_value(spec, width, what)
        else:
            raise P4RuntimeValueError(f"{what}: match type {mf.match_type} is not supported")
        return fm


def _pair(spec: Any, what: str, form: str) -> tuple[Any, Any]:
    if not isinstance(spec, (tuple, list)) or len(spec) != 2:
        raise P4RuntimeValueError(f"{what}: expected {form}, got {spec!r}")
    return spec[0], spec[1]


def _lpm_spec(spec: Any, what: str) -> tuple[Value, int]:
    if isinstance(spec, str) and "/" in spec:
        address, _, prefix = spec.partition("/")
        return address, int(prefix)
    value, prefix = _pair(spec, what, "(value, prefix_len) or 'a.b.c.d/len'")
    return value, int(prefix)


def multicast_group_entry(
    group_id: int, replicas: Iterable[tuple[int, int]]
) -> p4runtime_pb2.PacketReplicationEngineEntry:
    """A PRE multicast group: one replica per ``(egress_port, instance)``; ``instance`` is what egress sees
    as ``egress_rid``."""
    if not 0 < group_id < 1 << 32:
        raise P4RuntimeValueError(f"multicast group id {group_id} must be in 1..2^32-1")
    group = p4runtime_pb2.MulticastGroupEntry(multicast_group_id=group_id)
    for port, instance in replicas:
        group.replicas.add(egress_port=port, instance=instance)
    return p4runtime_pb2.PacketReplicationEngineEntry(multicast_group_entry=group)


_ENTITY_FIELDS: dict[type, str] = {
    p4runtime_pb2.TableEntry: "table_entry",
    p4runtime_pb2.CounterEntry: "counter_entry",
    p4runtime_pb2.PacketReplicationEngineEntry: "packet_replication_engine_entry",
}


def to_entity(message: Any) -> p4runtime_pb2.Entity:
    """Wrap a table entry, counter entry, PRE entry (or a bare multicast group) into an ``Entity``."""
    if isinstance(message, p4runtime_pb2.Entity):
        return message
    if isinstance(message, p4runtime_pb2.MulticastGroupEntry):
        message = p4runtime_pb2.PacketReplicationEngineEntry(multicast_group_entry=message)
    name = _ENTITY_FIELDS.get(type(message))
    if name is None:
        raise TypeError(f"cannot make a P4Runtime entity of {type(message).__name__}")
    entity = p4runtime_pb2.Entity()
    getattr(entity, name).CopyFrom(message)
    return entity


@dataclass(frozen=True)
class DecodedTableEntry:
    """A table entry in names and ints. Match values: exact/optional → int, lpm → (value, prefix_len),
    ternary → (value, mask), range → (low, high). Hashable, so entries read back diff as sets."""

    table: str
    match: dict[str, Any]
    action: str | None
    params: dict[str, int] = field(default_factory=dict)
    priority: int = 0
    is_default_action: bool = False

    def __hash__(self) -> int:
        return hash((self.table, tuple(sorted(self.match.items())), self.action,
                     tuple(sorted(self.params.items())), self.priority, self.is_default_action))


def decode_table_entry(p4info: P4InfoIndex, entry: p4runtime_pb2.TableEntry) -> DecodedTableEntry:
    """Names and ints of an entry read from the switch, for comparisons and logs."""
    table = p4info.by_id(entry.table_id)
    fields_by_id = {mf.id: mf.name for mf in table.match_fields}
    match: dict[str, Any] = {}
    for fm in entry.match:
        kind = fm.WhichOneof("field_match_type")
        name = fields_by_id.get(fm.field_id, f"#{fm.field_id}")
        if kind == "exact":
            match[name] = decode_value(fm.exact.value)
        elif kind == "lpm":
            match[name] = (decode_value(fm.lpm.value), fm.lpm.prefix_len)
        elif kind == "ternary":
            match[name] = (decode_value(fm.ternary.value), decode_value(fm.ternary.mask))
        elif kind == "range":
            match[name] = (decode_value(fm.range.low), decode_value(fm.range.high))
        elif kind == "optional":
            match[name] = decode_value(fm.optional.value)
    action_name, params = None, {}
    if entry.action.WhichOneof("type") == "action":
        action = p4info.by_id(entry.action.action.action_id)
        action_name = action.name
        names = {p.id: p.name for p in action.params}
        params = {
            names.get(p.param_id, f"#{p.param_id}"): decode_value(p.value) for p in entry.action.action.params
        }
    return DecodedTableEntry(
        table=table.name,
        match=match,
        action=action_name,
        params=params,
        priority=entry.priority,
        is_default_action=entry.is_default_action,
    )


@dataclass(frozen=True)
class CounterValue:
    packets: int
    bytes: int


