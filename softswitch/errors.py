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


def unsupported(kind: str | None, verb: str) -> SwitchError:
    """The refusal of a ``verb`` ("read", "write") of an Entity of ``kind`` that softswitch does not serve
    (None: the request names no entity), as PI words it for registers."""
    if kind == "register_entry":
        return SwitchError(code_pb2.UNIMPLEMENTED, f"Register {verb}s are not supported yet")
    if kind is None:
        return SwitchError(code_pb2.UNKNOWN, f"Incorrect entity type: the {verb} names no entity")
    return SwitchError(code_pb2.UNIMPLEMENTED, f"softswitch does not implement {kind} {verb}s")


#: Clone sessions are a PRE entity v1model programs may use; the lhc program clones nothing.
NO_CLONE_SESSIONS = ("clone sessions (PacketReplicationEngineEntry.clone_session_entry) are not served by "
                     "softswitch: the lhc program clones no packets")
