"""A small P4Runtime client: entities built from P4Info names, one primary connection, clean errors.

The PTF suite and the controller both configure the switch through this package, so neither ever
handles numeric P4Info ids or byte strings. It follows p4runtime-shell's idea (entities named by P4Info
names) without its dependency pins, directly over the ``p4runtime`` protos and grpcio.

Four modules, each usable alone (everything is importable from ``lhc_ina.p4rt``):

- **Values**: ``encode_value`` turns ints, dotted IPv4 and colon MAC strings into the canonical byte strings
  P4Runtime requires (big-endian, shortest form, zero as one byte), checking the P4Info width;
  ``decode_value`` goes back.
- **Entities**: ``EntityBuilder`` builds ``TableEntry`` (exact/lpm/ternary/range/optional by field name,
  action and params by name, priority, default action) and ``CounterEntry`` messages from a
  ``P4InfoIndex``; ``multicast_group_entry`` builds PRE groups; ``decode_table_entry`` reads an entry back
  into names and ints (hashable).
- **Errors**: every failure is a ``P4RuntimeError`` that carries the gRPC status and the per-update
  P4Runtime errors, indexed into the caller's whole list of updates.
- **Client**: ``P4RuntimeClient`` opens the channel, wins master arbitration on the StreamChannel (which
  must stay open for as long as the client writes), pushes or reads the pipeline (with cookies), writes
  in batches and reads; ``on_stream_lost`` and ``on_arbitration`` tell its owner when the device goes away
  or primaryship changes.
"""

from __future__ import annotations

from lhc_ina.p4rt.client import P4RuntimeClient, Writable
from lhc_ina.p4rt.entities import (
    CounterValue,
    DecodedTableEntry,
    EntityBuilder,
    decode_table_entry,
    multicast_group_entry,
    to_entity,
)
from lhc_ina.p4rt.errors import P4RuntimeError, UpdateError
from lhc_ina.p4rt.values import P4RuntimeValueError, Value, decode_value, encode_value, value_to_int

__all__ = [
    "CounterValue",
    "DecodedTableEntry",
    "EntityBuilder",
    "P4RuntimeClient",
    "P4RuntimeError",
    "P4RuntimeValueError",
    "UpdateError",
    "Value",
    "Writable",
    "decode_table_entry",
    "decode_value",
    "encode_value",
    "multicast_group_entry",
    "to_entity",
    "value_to_int",
]
