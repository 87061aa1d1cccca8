"""A failed P4Runtime call as one exception: the gRPC status and, for Write, each failing update's
``p4.v1.Error`` decoded from the ``grpc-status-details-bin`` trailer."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import grpc
from google.rpc import code_pb2, status_pb2
from p4.v1 import p4runtime_pb2


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


