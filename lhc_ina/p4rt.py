"""A small P4Runtime client: entities built from P4Info names, one primary connection, clean errors.

The PTF suite and the controller both configure the switch through this module, so neither ever handles
numeric P4Info ids or byte strings. It follows p4runtime-shell's idea (entities named by P4Info names)
without its dependency pins, directly over the ``p4runtime`` protos and grpcio.

Three layers, each usable alone:

- **Values**: ``encode_value`` turns ints, dotted IPv4 and colon MAC strings into the canonical byte strings
  P4Runtime requires (big-endian, shortest form, zero as one byte), checking the P4Info width;
  ``decode_value`` goes back.
- **Entities**: ``EntityBuilder`` builds ``TableEntry`` (exact/lpm/ternary/range/optional by field name,
  action and params by name, priority, default action) and ``CounterEntry`` messages from a
  ``P4InfoIndex``; ``multicast_group_entry`` builds PRE groups; ``decode_table_entry`` reads an entry back
  into names and ints.
- **Client**: ``P4RuntimeClient`` opens the channel, wins master arbitration on the StreamChannel (which
  must stay open for as long as the client writes), pushes the pipeline, writes in batches and reads.
  Every failure is a ``P4RuntimeError`` that carries the gRPC status and the per-update P4Runtime errors.
"""

from __future__ import annotations

import ipaddress
import queue
import re
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import code_pb2, status_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from lhc_ina.p4info import P4InfoError, P4InfoIndex

__all__ = [
    "CounterValue",
    "DecodedTableEntry",
    "EntityBuilder",
    "P4RuntimeClient",
    "P4RuntimeError",
    "P4RuntimeValueError",
    "UpdateError",
    "decode_table_entry",
    "decode_value",
    "encode_value",
    "multicast_group_entry",
    "to_entity",
]

#: What a caller may pass where a P4 value is expected: an int, "10.0.0.1", "02:00:00:00:00:01", or bytes.
Value = int | str | bytes | ipaddress.IPv4Address

_MAC = re.compile(r"^[0-9a-fA-F]{1,2}(:[0-9a-fA-F]{1,2}){5}$")


class P4RuntimeValueError(ValueError):
    """A value that cannot be encoded for a field or parameter (too wide, wrong form)."""


# --- Values ----------------------------------------------------------------------------------------
def value_to_int(value: Value) -> int:
    """An int from an int, bytes (big-endian), an IPv4 address or a MAC address string."""
    if isinstance(value, bool):
        raise P4RuntimeValueError(f"a P4 value cannot be a bool ({value!r})")
    if isinstance(value, int):
        return value
    if isinstance(value, ipaddress.IPv4Address):
        return int(value)
    if isinstance(value, bytes):
        return int.from_bytes(value, "big")
    if isinstance(value, str):
        if _MAC.match(value):
            return int("".join(f"{int(part, 16):02x}" for part in value.split(":")), 16)
        try:
            return int(ipaddress.IPv4Address(value))
        except ipaddress.AddressValueError:
            pass
        raise P4RuntimeValueError(f"{value!r} is neither an IPv4 address nor a MAC address")
    raise P4RuntimeValueError(f"cannot encode {value!r} ({type(value).__name__}) as a P4 value")


def encode_value(value: Value, bitwidth: int, what: str = "value") -> bytes:
    """The canonical P4Runtime byte string of ``value``: big-endian, no leading zero bytes, zero as b"\\0".

    P4Runtime (since 1.3) reads values in this shortest form and servers answer reads in it, so entries
    written and read back compare equal. ``what`` names the field in the error when the value does not fit.
    """
    number = value_to_int(value)
    if number < 0:
        raise P4RuntimeValueError(f"{what}: {value!r} is negative")
    if number >= 1 << bitwidth:
        raise P4RuntimeValueError(f"{what}: {value!r} does not fit in {bitwidth} bits")
    return number.to_bytes(max(1, (number.bit_length() + 7) // 8), "big")


def decode_value(data: bytes) -> int:
    """The unsigned int a P4Runtime byte string encodes (any length, leading zeros allowed)."""
    return int.from_bytes(data, "big")


# --- Entities --------------------------------------------------------------------------------------
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
    p4runtime_pb2.RegisterEntry: "register_entry",
    p4runtime_pb2.DirectCounterEntry: "direct_counter_entry",
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


# --- Errors ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class UpdateError:
    """The P4Runtime error of one update of a failed Write (``index`` into the batch as sent)."""

    index: int
    code: int  # google.rpc.Code
    message: str

    def __str__(self) -> str:
        return f"update #{self.index}: {code_pb2.Code.Name(self.code)}: {self.message}"


class P4RuntimeError(Exception):
    """A failed P4Runtime call: the gRPC status and, for Write, each failing update's error."""

    def __init__(
        self, operation: str, code: grpc.StatusCode | None, details: str, errors: Iterable[UpdateError] = ()
    ) -> None:
        self.operation = operation
        self.code = code
        self.details = details
        self.errors = tuple(errors)
        super().__init__(str(self))

    def __str__(self) -> str:
        status = self.code.name if self.code is not None else "ERROR"
        lines = [f"{self.operation} failed: {status}: {self.details}"]
        lines += [f"  {error}" for error in self.errors]
        return "\n".join(lines)

    @classmethod
    def from_rpc(cls, operation: str, error: grpc.RpcError) -> P4RuntimeError:
        """Decode the per-update ``p4.v1.Error`` details that P4Runtime servers put in the
        ``grpc-status-details-bin`` trailer."""
        code = error.code() if hasattr(error, "code") else None
        details = error.details() if hasattr(error, "details") else str(error)
        updates: list[UpdateError] = []
        trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
        for key, value in trailers or ():
            if key != "grpc-status-details-bin":
                continue
            status = status_pb2.Status.FromString(value)
            for index, detail in enumerate(status.details):
                p4_error = p4runtime_pb2.Error()
                unpacked = detail.Is(p4runtime_pb2.Error.DESCRIPTOR) and detail.Unpack(p4_error)
                if unpacked and p4_error.canonical_code != code_pb2.OK:
                    updates.append(UpdateError(index, p4_error.canonical_code, p4_error.message))
        return cls(operation, code, details or "", updates)


# --- Client ----------------------------------------------------------------------------------------
Writable = (
    p4runtime_pb2.Entity
    | p4runtime_pb2.TableEntry
    | p4runtime_pb2.CounterEntry
    | p4runtime_pb2.PacketReplicationEngineEntry
    | p4runtime_pb2.MulticastGroupEntry
)

_UPDATE = p4runtime_pb2.Update


class P4RuntimeClient:
    """One controller connection to one device, as primary.

    ``connect`` opens the StreamChannel and sends the arbitration with ``election_id``; the device answers
    OK when this client is primary. Only the primary may write, so the stream stays open until ``close``
    (closing it gives up primaryship). Use as a context manager, or call ``connect`` and ``close``.
    """

    def __init__(
        self,
        address: str,
        device_id: int = 1,
        election_id: int = 1,
        p4info: P4InfoIndex | None = None,
        *,
        timeout: float = 10.0,
        batch_size: int = 256,
    ) -> None:
        self.address = address
        self.device_id = device_id
        self.election_id = p4runtime_pb2.Uint128(high=election_id >> 64, low=election_id & (2**64 - 1))
        self.timeout = timeout
        self.batch_size = batch_size
        self.p4info = p4info
        self.entities = EntityBuilder(p4info) if p4info is not None else None
        self._channel: grpc.Channel | None = None
        self._stub: p4runtime_pb2_grpc.P4RuntimeStub | None = None
        self._requests: queue.Queue[p4runtime_pb2.StreamMessageRequest | None] = queue.Queue()
        self._arbitration: queue.Queue[p4runtime_pb2.StreamMessageResponse | BaseException] = queue.Queue()
        self._stream: Any = None
        self._reader: threading.Thread | None = None
        self._primary = False
        #: Called with ``True``/``False`` whenever the device says this client is (no longer) primary.
        self.on_arbitration: Callable[[bool], None] | None = None
        #: Called with the error when the StreamChannel ends without ``close``: the device went away (or
        #: dropped this client), primaryship is lost and a new ``connect`` is needed.
        self.on_stream_lost: Callable[[BaseException], None] | None = None

    # -- connection --
    def __enter__(self) -> P4RuntimeClient:
        """Connect as primary, unless ``connect`` was already called (``with client.connect(...) as c``)."""
        return self if self._channel is not None else self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def connect(self, *, require_primary: bool = True, arbitrate: bool = True) -> P4RuntimeClient:
        """Open the channel and send the arbitration; raises ``P4RuntimeError`` if the device is
        unreachable or, with ``require_primary``, if another controller holds a higher election id.
        Without it the client stays connected as a backup (``is_primary`` tells which; a backup may read
        but not write). With ``arbitrate`` False no stream is opened at all: a read-only observer that
        never takes part in the election."""
        self._requests = queue.Queue()
        self._arbitration = queue.Queue()
        self._primary = False
        self._channel = grpc.insecure_channel(self.address)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            self.close()
            raise P4RuntimeError(
                "connect", grpc.StatusCode.UNAVAILABLE, f"no P4Runtime server at {self.address}"
            ) from None
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        if not arbitrate:
            return self
        self._stream = self._stub.StreamChannel(self._request_iterator())
        self._reader = threading.Thread(target=self._read_stream, name="p4rt-stream", daemon=True)
        self._reader.start()
        self._requests.put(
            p4runtime_pb2.StreamMessageRequest(
                arbitration=p4runtime_pb2.MasterArbitrationUpdate(
                    device_id=self.device_id, election_id=self.election_id
                )
            )
        )
        try:
            reply = self._arbitration.get(timeout=self.timeout)
        except queue.Empty:
            self.close()
            raise P4RuntimeError("arbitration", grpc.StatusCode.DEADLINE_EXCEEDED, "no reply") from None
        if isinstance(reply, BaseException):
            self.close()
            if isinstance(reply, grpc.RpcError):
                raise P4RuntimeError.from_rpc("arbitration", reply) from reply
            raise P4RuntimeError("arbitration", None, str(reply)) from reply
        status = reply.arbitration.status
        if status.code != code_pb2.OK and require_primary:
            self.close()
            raise P4RuntimeError(
                "arbitration",
                None,
                f"not primary for device {self.device_id} "
                f"({code_pb2.Code.Name(status.code)}: {status.message})",
            )
        return self

    def close(self) -> None:
        """End the stream (giving up primaryship) and the channel. Safe to call twice."""
        self._requests.put(None)
        self._primary = False
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.cancel()
        if self._reader is not None:
            self._reader.join(timeout=2)
            self._reader = None
        if self._channel is not None:
            self._channel.close()
            self._channel = None

    def _request_iterator(self) -> Iterator[p4runtime_pb2.StreamMessageRequest]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    @property
    def is_primary(self) -> bool:
        """Whether the device's latest arbitration message to this client said it is primary."""
        return self._primary

    def _read_stream(self) -> None:
        """Track arbitration messages (the device sends one to each client whenever the primary changes);
        other stream messages (packet-in, digests) are not used here. A stream that ends, other than by
        ``close``, takes primaryship with it: ``is_primary`` turns False and ``on_stream_lost`` is told."""
        stream = self._stream
        lost: BaseException = ConnectionError(f"{self.address}: the device ended the stream")
        try:
            for response in stream:
                if response.WhichOneof("update") == "arbitration":
                    primary = response.arbitration.status.code == code_pb2.OK
                    changed = primary != self._primary
                    self._primary = primary
                    self._arbitration.put(response)
                    if changed and self.on_arbitration is not None:
                        self.on_arbitration(primary)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.CANCELLED and self._stream is not stream:
                return  # close() cancelled it
            lost = error
        self._primary = False
        self._arbitration.put(lost)
        if self._stream is stream and self.on_stream_lost is not None:
            self.on_stream_lost(lost)

    @property
    def stub(self) -> p4runtime_pb2_grpc.P4RuntimeStub:
        if self._stub is None:
            raise P4RuntimeError("call", None, "not connected (call connect() first)")
        return self._stub

    def _builder(self) -> EntityBuilder:
        if self.entities is None:
            raise P4RuntimeError("build", None, "no P4Info: pass p4info= or call set_pipeline first")
        return self.entities

    # -- pipeline --
    def set_pipeline(
        self,
        p4info: P4InfoIndex,
        device_config: bytes = b"",
        *,
        cookie: int | None = None,
        action: int = p4runtime_pb2.SetForwardingPipelineConfigRequest.VERIFY_AND_COMMIT,
    ) -> None:
        """Install the program: its P4Info and the target's device config (BMv2: the JSON; softswitch:
        nothing; Tofino: PI's device data, see ``lhc_ina.tofino``). ``cookie`` tags this push, so a later
        ``get_pipeline`` tells whether the device still runs it; RECONCILE_AND_COMMIT keeps the forwarding
        state where the device can. Afterwards entities are built against this P4Info."""
        request = p4runtime_pb2.SetForwardingPipelineConfigRequest(
            device_id=self.device_id, election_id=self.election_id, action=action
        )
        request.config.p4info.CopyFrom(p4info.p4info)
        request.config.p4_device_config = device_config
        if cookie is not None:
            request.config.cookie.cookie = cookie
        try:
            self.stub.SetForwardingPipelineConfig(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise P4RuntimeError.from_rpc("SetForwardingPipelineConfig", error) from error
        self.p4info = p4info
        self.entities = EntityBuilder(p4info)

    def get_p4info(self) -> p4info_pb2.P4Info:
        """The P4Info the device runs now (empty when no pipeline is set)."""
        request = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE,
        )
        try:
            reply = self.stub.GetForwardingPipelineConfig(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise P4RuntimeError.from_rpc("GetForwardingPipelineConfig", error) from error
        return reply.config.p4info

    def get_pipeline(self) -> tuple[p4info_pb2.P4Info, int | None] | None:
        """The device's P4Info and cookie (None when it has none), or None when no pipeline is loaded.

        The spec answers OK with ``config`` unset before the first SetForwardingPipelineConfig; PI (BMv2,
        Tofino) answers FAILED_PRECONDITION. Both mean "no pipeline"."""
        request = p4runtime_pb2.GetForwardingPipelineConfigRequest(
            device_id=self.device_id,
            response_type=p4runtime_pb2.GetForwardingPipelineConfigRequest.P4INFO_AND_COOKIE,
        )
        try:
            reply = self.stub.GetForwardingPipelineConfig(request, timeout=self.timeout)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.FAILED_PRECONDITION:
                return None
            raise P4RuntimeError.from_rpc("GetForwardingPipelineConfig", error) from error
        if not reply.HasField("config") or not reply.config.HasField("p4info"):
            return None
        cookie = reply.config.cookie.cookie if reply.config.HasField("cookie") else None
        return reply.config.p4info, cookie

    # -- writes --
    def write(self, updates: Iterable[p4runtime_pb2.Update]) -> None:
        """Send updates in batches of ``batch_size`` (CONTINUE_ON_ERROR: each batch applies what it can).
        Every batch is sent; one ``P4RuntimeError`` then lists every failing update by its index in the
        caller's whole sequence."""
        updates = list(updates)
        failures: list[P4RuntimeError] = []
        for start in range(0, len(updates), self.batch_size):
            batch = updates[start : start + self.batch_size]
            request = p4runtime_pb2.WriteRequest(
                device_id=self.device_id, election_id=self.election_id, updates=batch
            )
            try:
                self.stub.Write(request, timeout=self.timeout)
            except grpc.RpcError as error:
                failed = P4RuntimeError.from_rpc("Write", error)
                failed.errors = tuple(
                    UpdateError(e.index + start, e.code, e.message) for e in failed.errors
                )
                failures.append(failed)
        if failures:
            first = failures[0]
            errors = [e for f in failures for e in f.errors]
            raise P4RuntimeError("Write", first.code, first.details, errors)

    def insert(self, *entities: Writable) -> None:
        self.write(_UPDATE(type=_UPDATE.INSERT, entity=to_entity(e)) for e in entities)

    def modify(self, *entities: Writable) -> None:
        self.write(_UPDATE(type=_UPDATE.MODIFY, entity=to_entity(e)) for e in entities)

    def delete(self, *entities: Writable) -> None:
        self.write(_UPDATE(type=_UPDATE.DELETE, entity=to_entity(e)) for e in entities)

    # -- reads --
    def read(self, *entities: Writable) -> list[p4runtime_pb2.Entity]:
        """Every entity that matches the given (possibly wildcard) entities."""
        request = p4runtime_pb2.ReadRequest(
            device_id=self.device_id, entities=[to_entity(e) for e in entities]
        )
        try:
            replies = self.stub.Read(request, timeout=self.timeout)
            return [entity for reply in replies for entity in reply.entities]
        except grpc.RpcError as error:
            raise P4RuntimeError.from_rpc("Read", error) from error

    def read_table(self, table: str) -> list[p4runtime_pb2.TableEntry]:
        """All entries of one table (not its default entry)."""
        wildcard = p4runtime_pb2.TableEntry(table_id=self._builder().p4info.table(table).id)
        return [entity.table_entry for entity in self.read(wildcard)]

    def read_multicast_groups(self, group_id: int = 0) -> list[p4runtime_pb2.MulticastGroupEntry]:
        """One multicast group, or all of them with ``group_id`` 0."""
        wildcard = p4runtime_pb2.PacketReplicationEngineEntry(
            multicast_group_entry=p4runtime_pb2.MulticastGroupEntry(multicast_group_id=group_id)
        )
        entities = self.read(wildcard)
        return [entity.packet_replication_engine_entry.multicast_group_entry for entity in entities]

    def read_counter(self, counter: str, index: int | None = None) -> dict[int, CounterValue]:
        """Cells of a counter by index: one cell, or all of them with ``index`` None."""
        cells = [e.counter_entry for e in self.read(self._builder().counter_entry(counter, index))]
        return {c.index.index: CounterValue(c.data.packet_count, c.data.byte_count) for c in cells}
