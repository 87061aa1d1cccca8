"""Look up P4Info entities by name or id, with their widths.

Both ends of P4Runtime need this: softswitch validates writes against the P4Info it implements, and
clients (PTF tests, the controller) build entities from names. Code names tables, actions, counters and
registers by their P4Info names (``LhcIngress.jobs``); numeric ids stay inside this module and the protos.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from google.protobuf import text_format
from p4.config.v1 import p4info_pb2

REPO_ROOT = Path(__file__).resolve().parent.parent
V1MODEL_P4INFO = REPO_ROOT / "p4src" / "v1model" / "lhc.p4info.txtpb"


class P4InfoError(KeyError):
    """A name or id that the P4Info does not define."""

    def __str__(self) -> str:  # KeyError quotes its message; this one reads as a sentence.
        return str(self.args[0])


_Entry = TypeVar("_Entry", "Param", "MatchField")


def _named(entries: tuple[_Entry, ...], name: str, missing: str) -> _Entry:
    """The entry of ``entries`` called ``name``; P4InfoError(``missing``) where there is none."""
    found = next((entry for entry in entries if entry.name == name), None)
    if found is None:
        raise P4InfoError(missing)
    return found


@dataclass(frozen=True)
class MatchField:
    id: int
    name: str
    bitwidth: int
    match_type: int  # p4info_pb2.MatchField.MatchType


@dataclass(frozen=True)
class Param:
    id: int
    name: str
    bitwidth: int


@dataclass(frozen=True)
class Action:
    id: int
    name: str
    params: tuple[Param, ...]

    def param(self, name: str) -> Param:
        return _named(self.params, name, f"action {self.name} has no parameter {name!r}")


@dataclass(frozen=True)
class Table:
    id: int
    name: str
    match_fields: tuple[MatchField, ...]
    action_ids: tuple[int, ...]
    default_action_id: int  # 0 when the P4Info names none (NoAction)
    const_default_action: bool
    size: int

    def match_field(self, name: str) -> MatchField:
        return _named(self.match_fields, name, f"table {self.name} has no match field {name!r}")


@dataclass(frozen=True)
class Sized:
    """A counter or register: an array of ``size`` cells."""

    id: int
    name: str
    size: int
    bitwidth: int = 0  # registers only


class P4InfoIndex:
    """The entities of one P4Info, by name and by id."""

    def __init__(self, p4info: p4info_pb2.P4Info) -> None:
        self.p4info = p4info
        self.actions = {
            a.preamble.name: Action(
                a.preamble.id, a.preamble.name, tuple(Param(p.id, p.name, p.bitwidth) for p in a.params)
            )
            for a in p4info.actions
        }
        self.tables = {
            t.preamble.name: Table(
                id=t.preamble.id,
                name=t.preamble.name,
                match_fields=tuple(
                    MatchField(m.id, m.name, m.bitwidth, m.match_type) for m in t.match_fields
                ),
                action_ids=tuple(ref.id for ref in t.action_refs),
                default_action_id=t.const_default_action_id,
                const_default_action=t.const_default_action_id != 0,
                size=t.size,
            )
            for t in p4info.tables
        }
        self.counters = {
            c.preamble.name: Sized(c.preamble.id, c.preamble.name, c.size) for c in p4info.counters
        }
        self.registers = {
            r.preamble.name: Sized(r.preamble.id, r.preamble.name, r.size, r.type_spec.bitstring.bit.bitwidth)
            for r in p4info.registers
        }
        self._by_id: dict[int, object] = {}
        for group in (self.actions, self.tables, self.counters, self.registers):
            for entity in group.values():
                self._by_id[entity.id] = entity

    @classmethod
    def from_file(cls, path: Path | str = V1MODEL_P4INFO) -> P4InfoIndex:
        return cls(text_format.Parse(Path(path).read_text(), p4info_pb2.P4Info()))

    def _named(self, group: dict, kind: str, name: str):
        try:
            return group[name]
        except KeyError:
            raise P4InfoError(f"P4Info has no {kind} named {name!r}") from None

    def table(self, name: str) -> Table:
        return self._named(self.tables, "table", name)

    def action(self, name: str) -> Action:
        return self._named(self.actions, "action", name)

    def counter(self, name: str) -> Sized:
        return self._named(self.counters, "counter", name)

    def register(self, name: str) -> Sized:
        return self._named(self.registers, "register", name)

    def by_id(self, entity_id: int) -> object:
        try:
            return self._by_id[entity_id]
        except KeyError:
            raise P4InfoError(f"P4Info has no entity with id {entity_id:#x}") from None
