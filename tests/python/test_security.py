"""The Python client against a server with mutual TLS and bearer tokens: certificates made with
`openssl` for this test, a user token steps and closes its own session, a missing or unknown token
is refused, an admin call needs an admin token, and the token may come from $OPTSTEP_TOKEN."""

from __future__ import annotations

import pathlib
import subprocess
import time
from typing import Dict, Iterator

import numpy as np
import pytest

import optstep
from optstep import pb

USER = "python-user-token-8c1d2e"
ADMIN = "python-admin-token-5b7f90"


def _make_pki(root: pathlib.Path) -> Dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (P-256 keys)."""
    ext = root / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n")
    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=root, check=True, capture_output=True)

    openssl("req", "-x509", *key, "-days", "2", "-subj", "/CN=py-test-ca", "-keyout", "ca.key",
            "-out", "ca.pem")
    for who in ("server", "client"):
        openssl("req", *key, "-subj", f"/CN=py-{who}", "-keyout", f"{who}.key", "-out",
                f"{who}.csr")
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", str(ext), "-out", f"{who}.pem")
    return {name: str(root / name) for name in
            ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    return _make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_server(server_binary: str, pki: Dict[str, str],
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[optstep.LocalServer]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"trainer user {USER}\nroot admin {ADMIN}\n")
    flags = [f"--tls_cert={pki['server.pem']}", f"--tls_key={pki['server.key']}",
             f"--tls_client_ca={pki['ca.pem']}", f"--auth_tokens_file={tokens}"]
    with optstep.LocalServer(server_binary, flags=flags) as local:
        yield local


def _client(server: optstep.LocalServer, pki: Dict[str, str], **kwargs) -> optstep.Client:
    return optstep.Client(server.address, tls_ca=pki["ca.pem"], tls_cert=pki["client.pem"],
                          tls_key=pki["client.key"], **kwargs)


def _serving(client: optstep.Client) -> bool:
    """Health turns SERVING shortly after the server starts."""
    deadline = time.monotonic() + 10
    while not client.check_health() and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.check_health()


def _spec(name: str) -> pb.SessionSpec:
    spec = pb.SessionSpec(name=name, num_trainers=1,
                                      gradient_mode=pb.GRADIENT_MODE_SHARDED)
    spec.parameters.add(name="w", shape=[4, 3])
    spec.optimizer.preset = "adam"
    return spec


def test_user_token_steps_and_closes_its_own_admin_token_closes_any(secure_server, pki):
    with _client(secure_server, pki, token=USER) as user:
        assert _serving(user)
        session = user.create_session(_spec("py-secure")).info
        reply = user.step(session.session_id, 1, {"w": np.full((4, 3), 0.5, np.float32)})
        assert reply.step == 1
        with pytest.raises(optstep.PermissionDeniedError, match="admin"):
            user.save_checkpoint(session.session_id, "py-secure")
        user.close_session(session.session_id)
        other = user.create_session(_spec("py-other")).info
    with _client(secure_server, pki, token=ADMIN) as admin:
        admin.close_session(other.session_id)
        assert not admin.list_sessions()


def test_missing_or_unknown_token_is_unauthenticated(secure_server, pki, monkeypatch):
    monkeypatch.delenv("OPTSTEP_TOKEN", raising=False)
    with _client(secure_server, pki) as anonymous:
        assert _serving(anonymous)  # health stays open for probes
        with pytest.raises(optstep.UnauthenticatedError):
            anonymous.list_sessions()
    with _client(secure_server, pki, token="python-unknown-token-000") as stranger:
        with pytest.raises(optstep.UnauthenticatedError):
            stranger.list_sessions()


def test_token_from_environment(secure_server, pki, monkeypatch):
    monkeypatch.setenv("OPTSTEP_TOKEN", USER)
    with _client(secure_server, pki) as user:
        assert isinstance(user.list_sessions(), list)


def test_token_needs_tls():
    with pytest.raises(optstep.InvalidArgumentError, match="needs tls"):
        optstep.Client("127.0.0.1:1", token=USER, connect_timeout=0)
