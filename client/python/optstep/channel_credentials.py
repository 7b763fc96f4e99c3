"""The credentials of the client's channels: plaintext, TLS (with a client certificate for mutual
TLS) and the bearer token. Internal to the client."""

from __future__ import annotations

import os
from typing import Optional

import grpc

from optstep.errors import InvalidArgumentError, NotFoundError

__all__ = ["channel_credentials"]


def channel_credentials(tls: bool, ca: Optional[str], cert: Optional[str], key: Optional[str],
                         token: Optional[str]) -> Optional[grpc.ChannelCredentials]:
    """None for a plaintext channel; else TLS credentials, with the bearer token if any."""
    if not tls:
        if token:
            raise InvalidArgumentError("Client: a token needs tls (the server checks tokens only "
                                       "on TLS connections)")
        if key:
            raise InvalidArgumentError("Client: tls_key given without tls_cert")
        return None
    if bool(cert) != bool(key):
        raise InvalidArgumentError(f"Client: a client certificate needs both tls_cert and "
                                   f"tls_key; got {cert!r} and {key!r}")
    if token is None:
        token = os.environ.get("OPTSTEP_TOKEN") or None

    def read(path: Optional[str], what: str) -> Optional[bytes]:
        if not path:
            return None
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as e:
            raise NotFoundError(f"Client: cannot read {what} '{path}': {e.strerror}") from None

    credentials = grpc.ssl_channel_credentials(root_certificates=read(ca, "tls_ca"),
                                               private_key=read(key, "tls_key"),
                                               certificate_chain=read(cert, "tls_cert"))
    if token:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.access_token_call_credentials(token))
    return credentials
