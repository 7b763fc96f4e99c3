"""The messages the client sends and reads without generated stubs, encoded by hand: grpc.health.v1
Health.Check and AdminService.Shutdown, each a request of one string field. Internal to the
client."""

from __future__ import annotations

HEALTH_CHECK = "/grpc.health.v1.Health/Check"
ADMIN_SHUTDOWN = "/optstep.v1.AdminService/Shutdown"
_SERVING = 1  # HealthCheckResponse.ServingStatus


def varint(value: int) -> bytes:
    """`value` (>= 0) as a protobuf varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def string_message(value: str) -> bytes:
    """A message whose only field, number 1, is the string `value` (empty: no field)."""
    encoded = value.encode()
    return (b"\x0a" + varint(len(encoded)) + encoded) if encoded else b""


def serving(answer: bytes) -> bool:
    """Whether a HealthCheckResponse says SERVING."""
    return answer == b"\x08" + varint(_SERVING)
