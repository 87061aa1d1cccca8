"""Master arbitration: which StreamChannel client is primary, as p4lang/PI's server decides it.

Every StreamChannel that sends a MasterArbitrationUpdate becomes a connection with an election id; the
highest id is primary. Whenever the primary changes, every connection is told (the primary gets status
OK "Is primary", the others ALREADY_EXISTS "Is backup", each with the primary's election id); otherwise only
the connection that sent the update is answered. A second connection with an election id already in use
is refused with INVALID_ARGUMENT, more than 16 connections with RESOURCE_EXHAUSTED.

Write access (PI's rule, which clients rely on when testing with grpc_cli): with no connection open, a
request without an election id is accepted and one with an id is refused; with connections open, only the
primary's election id is accepted. Roles are not distinguished (PI ignores them too).
"""

from __future__ import annotations

import queue
import threading

from google.rpc import code_pb2
from p4.v1 import p4runtime_pb2 as p4v1

from softswitch.errors import SwitchError

MAX_CONNECTIONS = 16


def election_id(value: p4v1.Uint128) -> int:
    return (value.high << 64) | value.low


class Connection:
    """One StreamChannel: its election id (None before its first arbitration) and its outgoing queue."""

    def __init__(self) -> None:
        self.election_id: int | None = None
        self.role = ""
        self.outbox: queue.Queue[p4v1.StreamMessageResponse | SwitchError | None] = queue.Queue()


class Arbitration:
    """The connections of one device and who among them is primary."""

    def __init__(self, device_id: int) -> None:
        self.device_id = device_id
        self._lock = threading.Lock()
        self._connections: list[Connection] = []

    def _primary(self) -> Connection | None:
        return max(self._connections, key=lambda conn: conn.election_id, default=None)  # type: ignore[arg-type]

    def update(self, conn: Connection, request: p4v1.MasterArbitrationUpdate) -> None:
        """Handle one MasterArbitrationUpdate from ``conn``; SwitchError ends the stream."""
        if request.device_id != self.device_id:
            if conn.election_id is None:
                raise SwitchError(code_pb2.NOT_FOUND, f"no device {request.device_id}: this softswitch is "
                                  f"device {self.device_id}")
            raise SwitchError(code_pb2.FAILED_PRECONDITION, "invalid device id: a stream arbitrates for "
                              "one device only")
        new_id = election_id(request.election_id)
        with self._lock:
            if any(other is not conn and other.election_id == new_id for other in self._connections):
                raise SwitchError(code_pb2.INVALID_ARGUMENT, f"election id {new_id} already exists")
            was_primary = self._primary() is conn
            if conn.election_id is None:
                if len(self._connections) >= MAX_CONNECTIONS:
                    raise SwitchError(code_pb2.RESOURCE_EXHAUSTED, "too many connections")
                self._connections.append(conn)
            elif conn.election_id == new_id:
                self._notify(conn)
                return
            conn.election_id = new_id
            conn.role = request.role.name
            is_primary = self._primary() is conn
            if is_primary != was_primary:
                for other in self._connections:
                    self._notify(other)
            else:
                self._notify(conn)

    def leave(self, conn: Connection) -> None:
        """A stream ended; if it was the primary, everyone left learns the new state."""
        with self._lock:
            if conn not in self._connections:
                return
            was_primary = self._primary() is conn
            self._connections.remove(conn)
            if was_primary:
                for other in self._connections:
                    self._notify(other)

    def is_primary(self, conn: Connection) -> bool:
        with self._lock:
            return self._primary() is conn

    def may_write(self, has_election_id: bool, value: p4v1.Uint128) -> bool:
        """PI's rule for Write and SetForwardingPipelineConfig (see the module docstring)."""
        with self._lock:
            primary = self._primary()
            if primary is None:
                return not has_election_id
            return primary.election_id == election_id(value)

    def _notify(self, conn: Connection) -> None:
        primary = self._primary()
        assert primary is not None and primary.election_id is not None
        response = p4v1.StreamMessageResponse()
        update = response.arbitration
        update.device_id = self.device_id
        if conn.role:
            update.role.name = conn.role
        update.election_id.high = primary.election_id >> 64
        update.election_id.low = primary.election_id & ((1 << 64) - 1)
        if conn is primary:
            update.status.code = code_pb2.OK
            update.status.message = "Is primary"
        else:
            update.status.code = code_pb2.ALREADY_EXISTS
            update.status.message = "Is backup"
        conn.outbox.put(response)
