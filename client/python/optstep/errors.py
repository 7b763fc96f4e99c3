"""Exceptions of the optstep client: one class per gRPC status code.

Every failure the client reports, whether the server answered it or the client found it before
sending anything, is an :class:`OptstepError` carrying the gRPC code (``error.code``, a
``grpc.StatusCode``) and the message (``error.message``), as the C++ client answers
``absl::Status``. The subclasses also derive from the closest built-in exception, so that
``except ValueError`` catches a bad argument and ``except TimeoutError`` a deadline::

    try:
        client.step(session_id, step=3, gradients=grads)
    except optstep.FailedPreconditionError as e:   # step out of sequence
        print(e.code, e.message)
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Type

import grpc

from optstep.v1 import optimizer_service_pb2 as svc_pb2

__all__ = [
    "OptstepError",
    "CancelledError",
    "UnknownError",
    "InvalidArgumentError",
    "DeadlineExceededError",
    "NotFoundError",
    "AlreadyExistsError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "FailedPreconditionError",
    "AbortedError",
    "OutOfRangeError",
    "UnimplementedError",
    "InternalError",
    "UnavailableError",
    "DataLossError",
    "UnauthenticatedError",
    "error_for",
    "from_rpc_error",
    "EXPECTED_STEP_PAYLOAD",
]

# A Step refused FAILED_PRECONDITION as out of sequence carries the step the session expects next.
EXPECTED_STEP_PAYLOAD = "type.optstep.dev/optstep.ExpectedStep"

# The payloads a server sends, and how large each may be (base/status_payload.h,
# wire/grpc_status.h): no other crosses, so that a peer cannot make the client believe, say, that
# its session was rolled back.
_WIRE_PAYLOADS = frozenset({EXPECTED_STEP_PAYLOAD})
_MAX_PAYLOAD_BYTES = 256
_DETAILS_KEY = "grpc-status-details-bin"


class OptstepError(Exception):
    """A failed optstep call: the gRPC status code, the message, and the payloads the server
    attached (``type URL -> bytes``, from the call's status details; see ``StatusDetails`` in
    optimizer_service.proto)."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, code: "grpc.StatusCode | None" = None, *,
                 payloads: Optional[Mapping[str, bytes]] = None) -> None:
        super().__init__(message)
        self.message = message
        self.payloads: Mapping[str, bytes] = dict(payloads or {})
        if code is not None:
            self.code = code

    def payload_number(self, type_url: str) -> Optional[int]:
        """The decimal number in payload `type_url`; None without one."""
        value = self.payloads.get(type_url, b"")
        return int(value) if value.isdigit() else None

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class CancelledError(OptstepError):
    code = grpc.StatusCode.CANCELLED


class UnknownError(OptstepError):
    code = grpc.StatusCode.UNKNOWN


class InvalidArgumentError(OptstepError, ValueError):
    """A malformed request: shape, dtype, range, hyperparameter, unknown optimizer."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class DeadlineExceededError(OptstepError, TimeoutError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class NotFoundError(OptstepError, LookupError):
    """Unknown session, parameter or checkpoint."""

    code = grpc.StatusCode.NOT_FOUND


class AlreadyExistsError(OptstepError):
    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(OptstepError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhaustedError(OptstepError):
    """Too many sessions, parameters or bytes; a message over the limit."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(OptstepError):
    """Step out of sequence, initial values after the first step, attach with another spec."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AbortedError(OptstepError):
    """The step was aborted (deadline, superseded contribution): redo the step."""

    code = grpc.StatusCode.ABORTED


class OutOfRangeError(OptstepError):
    code = grpc.StatusCode.OUT_OF_RANGE


class UnimplementedError(OptstepError, NotImplementedError):
    """A part of the v1 API the server does not provide (yet)."""

    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(OptstepError):
    """A broken invariant on either side (e.g. the server broke the stream protocol)."""

    code = grpc.StatusCode.INTERNAL


class UnavailableError(OptstepError, ConnectionError):
    """A rank cannot be reached, or is shutting down; retry later."""

    code = grpc.StatusCode.UNAVAILABLE


class DataLossError(OptstepError):
    code = grpc.StatusCode.DATA_LOSS


class UnauthenticatedError(OptstepError):
    code = grpc.StatusCode.UNAUTHENTICATED


# What a call to a rank that is away ends with (internal to the client): UNAVAILABLE;
# DEADLINE_EXCEEDED (a rank wedged); CANCELLED, which the client never asks of a unary call, from
# a server shutting down (a stand-in giving way to the rank's own process).
AWAY_ERRORS = (UnavailableError, DeadlineExceededError, CancelledError)

_BY_CODE: Dict[grpc.StatusCode, Type[OptstepError]] = {
    cls.code: cls
    for cls in (CancelledError, UnknownError, InvalidArgumentError, DeadlineExceededError,
                NotFoundError, AlreadyExistsError, PermissionDeniedError,
                ResourceExhaustedError, FailedPreconditionError, AbortedError, OutOfRangeError,
                UnimplementedError, InternalError, UnavailableError, DataLossError,
                UnauthenticatedError)
}


def error_for(code: grpc.StatusCode, message: str, *,
              payloads: Optional[Mapping[str, bytes]] = None) -> OptstepError:
    """The exception for `code` (an :class:`OptstepError` subclass) with `message`."""
    return _BY_CODE.get(code, OptstepError)(message, code, payloads=payloads)


def _public_payloads(error: grpc.RpcError) -> Dict[str, bytes]:
    """The wire payloads of the call's status details, checked as the C++ client checks them;
    details that do not parse, and other payloads, are ignored."""
    trailing = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
    raw = next((item.value for item in trailing or () if item.key == _DETAILS_KEY), None)
    if not isinstance(raw, bytes):
        return {}
    details = svc_pb2.StatusDetails()
    try:
        details.ParseFromString(raw)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError, and garbage of any kind
        return {}
    payloads: Dict[str, bytes] = {}
    for payload in details.payloads:
        if payload.type_url in _WIRE_PAYLOADS and len(payload.value) <= _MAX_PAYLOAD_BYTES:
            payloads[payload.type_url] = payload.value
    return payloads


def from_rpc_error(error: grpc.RpcError) -> OptstepError:
    """Converts an error raised by a gRPC call into the matching :class:`OptstepError`."""
    code = (error.code() if hasattr(error, "code") else None) or grpc.StatusCode.UNKNOWN
    details = error.details() if hasattr(error, "details") else None
    return error_for(code, details or f"the call failed with {code.name} and no message",
                     payloads=_public_payloads(error))
