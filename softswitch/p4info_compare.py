"""Is a pushed P4Info the program softswitch implements? Compared entity by entity, by name.

Ids are not compared: the server translates with the pushed P4Info's own ids, so a client whose compiler
numbers entities differently still works. What must agree is what the pipeline executes: every entity's
name and kind, match fields (name, width, match kind, order), actions and their scopes, params (name,
width, order), sizes, counter units, register widths and const default actions. The answer lists every
difference, so whoever pushed the wrong file learns what is wrong with it.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message
from p4.config.v1 import p4info_pb2

_MatchType = p4info_pb2.MatchField.MatchType
_Scope = p4info_pb2.ActionRef.Scope
_Unit = p4info_pb2.CounterSpec.Unit

#: P4Info repeated fields that hold entities with a preamble, and the word used for them in messages.
_KINDS = {
    "tables": "table",
    "actions": "action",
    "action_profiles": "action profile",
    "counters": "counter",
    "direct_counters": "direct counter",
    "meters": "meter",
    "direct_meters": "direct meter",
    "controller_packet_metadata": "controller packet metadata",
    "value_sets": "value set",
    "registers": "register",
    "digests": "digest",
}


def _names_by_id(p4info: p4info_pb2.P4Info) -> dict[int, str]:
    names = {}
    for field in _KINDS:
        for entity in getattr(p4info, field):
            names[entity.preamble.id] = entity.preamble.name
    return names


def _signature(field: str, entity: Message, names: dict[int, str]) -> dict[str, Any]:
    """What must agree for one entity, id-free."""
    if field == "tables":
        return {
            "match fields": [
                (m.name, m.bitwidth, _MatchType.Name(m.match_type)) for m in entity.match_fields
            ],
            "actions": sorted(
                (names.get(a.id, f"#{a.id}"), _Scope.Name(a.scope)) for a in entity.action_refs
            ),
            "const default action": names.get(entity.const_default_action_id, "none"),
            "size": entity.size,
            "implementation": names.get(entity.implementation_id, "none"),
            "direct resources": sorted(names.get(i, f"#{i}") for i in entity.direct_resource_ids),
            "idle timeout": entity.idle_timeout_behavior,
            "const entries": entity.is_const_table,
        }
    if field == "actions":
        return {"params": [(p.name, p.bitwidth) for p in entity.params]}
    if field in ("counters", "direct_counters"):
        return {"unit": _Unit.Name(entity.spec.unit), "size": getattr(entity, "size", None)}
    if field == "registers":
        return {"type": text_format.MessageToString(entity.type_spec, as_one_line=True), "size": entity.size}
    return {}  # the program has none of the other kinds: their presence alone is a difference


def p4info_differences(implemented: p4info_pb2.P4Info, pushed: p4info_pb2.P4Info) -> list[str]:
    """Every way ``pushed`` differs from ``implemented``, as sentences; empty when they agree."""
    problems: list[str] = []
    names_impl, names_pushed = _names_by_id(implemented), _names_by_id(pushed)
    for field, kind in _KINDS.items():
        impl = {e.preamble.name: e for e in getattr(implemented, field)}
        got = {e.preamble.name: e for e in getattr(pushed, field)}
        for name in sorted(impl.keys() - got.keys()):
            problems.append(f"the pushed P4Info has no {kind} {name}")
        for name in sorted(got.keys() - impl.keys()):
            problems.append(f"the pushed P4Info has {kind} {name}, which softswitch does not implement")
        for name in sorted(impl.keys() & got.keys()):
            want = _signature(field, impl[name], names_impl)
            have = _signature(field, got[name], names_pushed)
            for key in want:
                if want[key] != have[key]:
                    problems.append(f"{kind} {name}: {key} is {have[key]} (softswitch: {want[key]})")
    return problems
