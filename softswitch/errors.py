"""The one error type of the control plane: a P4Runtime failure with its canonical code.

Table, PRE and counter operations raise ``SwitchError`` with the ``google.rpc.Code`` that BMv2's
P4Runtime server (p4lang/PI) gives for the same mistake; the gRPC layer turns it into a status.
"""

from __future__ import annotations

from google.rpc import code_pb2


class SwitchError(Exception):
    """A request the switch refuses; ``code`` is a ``google.rpc.Code`` value, the message says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{code_pb2.Code.Name(self.code)}: {self.message}"


def invalid(message: str) -> SwitchError:
    return SwitchError(code_pb2.INVALID_ARGUMENT, message)


#: Clone sessions are a PRE entity v1model programs may use; the lhc program clones nothing.
NO_CLONE_SESSIONS = ("clone sessions (PacketReplicationEngineEntry.clone_session_entry) are not served by "
                     "softswitch: the lhc program clones no packets")
