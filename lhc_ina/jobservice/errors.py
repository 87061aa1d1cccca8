"""The controller's one error type: a gRPC status code and a message that names the problem.

Admission, the store and the job service raise it; the service turns it into the RPC's status, and the
CLI into an exit code, so a refusal reads the same wherever it surfaces.
"""

from __future__ import annotations

import grpc


class ControllerError(Exception):
    """A refused request or a failed operation; ``code`` is the gRPC status the job service answers."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


def not_found(message: str) -> ControllerError:
    return ControllerError(grpc.StatusCode.NOT_FOUND, message)


def invalid(message: str) -> ControllerError:
    return ControllerError(grpc.StatusCode.INVALID_ARGUMENT, message)


def exists(message: str) -> ControllerError:
    return ControllerError(grpc.StatusCode.ALREADY_EXISTS, message)


def exhausted(message: str) -> ControllerError:
    return ControllerError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def precondition(message: str) -> ControllerError:
    return ControllerError(grpc.StatusCode.FAILED_PRECONDITION, message)
