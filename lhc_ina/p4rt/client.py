"""``P4RuntimeClient``: one controller connection to one device (arbitration on the StreamChannel, which
must stay open while the client writes; pipeline push and check with cookies; batched writes; reads).
A lost stream or lost primaryship is noticed and reported through callbacks. TLS (and mutual TLS) come
from ``tls`` (``lhc_ina.tls``); a refused handshake is reported as such, not as an absent server."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc
from google.rpc import code_pb2
from p4.config.v1 import p4info_pb2
from p4.v1 import p4runtime_pb2, p4runtime_pb2_grpc

from lhc_ina.p4info import P4InfoIndex
from lhc_ina.p4rt.entities import CounterValue, EntityBuilder, to_entity
from lhc_ina.p4rt.errors import P4RuntimeError, UpdateError
from lhc_ina.tls import TlsConfig, client_channel, explain_refusal, last_error

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
        tls: TlsConfig | None = None,
    ) -> None:
        self.address = address
        self.tls = tls
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
        self._channel = client_channel(self.address, self.tls)
        self._stub = p4runtime_pb2_grpc.P4RuntimeStub(self._channel)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=self.timeout)
        except grpc.FutureTimeoutError:
            why = self._why_unreachable()
            self.close()
            raise P4RuntimeError("connect", grpc.StatusCode.UNAVAILABLE, why) from None
        if not arbitrate:
            return self
        self._stream = self._stub.StreamChannel(self._request_iterator(self._requests))
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

    def answers(self, timeout: float) -> bool:
        """Whether the server answers one cheap call (Capabilities) within ``timeout`` s: a process that
        is stopped keeps its connection open but answers nothing."""
        try:
            self.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=timeout)
        except grpc.RpcError as error:
            return error.code() not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        return True

    def _why_unreachable(self) -> str:
        """Why the channel never became ready, as the transport says it: one cheap call brings back the
        last connection error, so that a refused TLS handshake is not reported as an absent server."""
        absent = f"no P4Runtime server at {self.address}"
        try:
            self.stub.Capabilities(p4runtime_pb2.CapabilitiesRequest(), timeout=min(2.0, self.timeout))
        except grpc.RpcError as error:
            details = error.details() or ""
            if error.code() == grpc.StatusCode.UNAVAILABLE and details:
                return explain_refusal(self.address, self.tls, details) or f"{absent} ({last_error(details)})"
        return absent

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

    @staticmethod
    def _request_iterator(
        requests: queue.Queue[p4runtime_pb2.StreamMessageRequest | None],
    ) -> Iterator[p4runtime_pb2.StreamMessageRequest]:
        """What gRPC sends on the stream; ends at the None that ``close`` or a lost stream queues."""
        while (request := requests.get()) is not None:
            yield request

    @property
    def is_primary(self) -> bool:
        """Whether the device's latest arbitration message to this client said it is primary."""
        return self._primary

    def _read_stream(self) -> None:
        """Track arbitration messages (the device sends one to each client whenever the primary changes);
        other stream messages (packet-in, digests) are not used here. A stream that ends, other than by
        ``close``, takes primaryship with it: ``is_primary`` turns False and ``on_stream_lost`` is told."""
        stream, requests = self._stream, self._requests
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
        requests.put(None)  # the request iterator ends with its stream
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
    def read(self, *entities: Writable, timeout: float | None = None) -> list[p4runtime_pb2.Entity]:
        """Every entity that matches the given (possibly wildcard) entities (``timeout``: the client's
        unless given)."""
        request = p4runtime_pb2.ReadRequest(
            device_id=self.device_id, entities=[to_entity(e) for e in entities]
        )
        try:
            replies = self.stub.Read(request, timeout=self.timeout if timeout is None else timeout)
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

    def read_counter(self, counter: str, index: int | None = None,
                     timeout: float | None = None) -> dict[int, CounterValue]:
        """Cells of a counter by index: one cell, or all of them with ``index`` None."""
        entities = self.read(self._builder().counter_entry(counter, index), timeout=timeout)
        cells = [e.counter_entry for e in entities]
        return {c.index.index: CounterValue(c.data.packet_count, c.data.byte_count) for c in cells}
