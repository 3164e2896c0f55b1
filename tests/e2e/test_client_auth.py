"""Who may call /validate and /mutate: with ``--client-ca`` only a client whose certificate that
CA signed (and whose common name is allowed), as the API server presents through its
AdmissionConfiguration; the kubelet's probes reach /healthz, /readyz and /metrics without one.

A forged review must not reserve capacity: the answer callback and the bind guard are told
whether the caller was verified.
"""

from __future__ import annotations

import datetime as dt
import json
import socket
import ssl
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.helpers.live_server import live_server
from tests.helpers.paths import EXAMPLES
from webhook.config import ClientAuth, ConfigError, config_from_dict
from webhook.serve.app import create_app
from webhook.serve.worker import certificate_name
from webhook.serve.wsgi import CLIENT_VERIFIED
from webhook.state.snapshot import load_snapshot
from webhook.state.source import FixedState

REVIEW = (EXAMPLES / "admission" / "good-deployment.json").read_bytes()
BINDING = json.dumps(
    {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "b-1",
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "name": "p",
            "namespace": "ml",
            "operation": "CREATE",
            "userInfo": {"username": "system:kube-scheduler"},
            "object": {"metadata": {"name": "p", "namespace": "ml"}, "target": {"name": "gpu-node-1"}},
        },
    }
).encode()


def _name(*common_names: str) -> x509.Name:
    """A subject with one CN attribute per name, in order (each its own RDN)."""
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name) for name in common_names])


def _certificate(subject: x509.Name, issuer: x509.Name, key, signer, *, ca: bool, client: bool = False):
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if client:
        builder = builder.add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
    return builder.sign(signer, hashes.SHA256())


class ClientCA:
    """A CA that signs client certificates, as the cluster's front CA signs the API server's."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.cert = _certificate(_name(name), _name(name), self.key, self.key, ca=True)
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.crt"
        self.path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def client(self, *common_names: str) -> tuple[Path, Path]:
        """A client certificate and key whose subject has these common names, as PEM files."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _certificate(_name(*common_names), self.cert.subject, key, self.key, ca=False, client=True)
        cert_path = self.directory / f"{'+'.join(common_names)}-{id(key)}.crt"
        key_path = cert_path.with_suffix(".key")
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return cert_path, key_path


@pytest.fixture(scope="module")
def cas(tmp_path_factory) -> tuple[ClientCA, ClientCA]:
    directory = tmp_path_factory.mktemp("client-ca")
    return ClientCA(directory, "front-proxy-ca"), ClientCA(directory, "someone-else-ca")


@pytest.fixture(scope="module")
def server(tmp_path_factory, cas):
    trusted, _ = cas
    workdir = tmp_path_factory.mktemp("client-auth")
    with live_server(
        workdir,
        "--cluster", str(EXAMPLES / "cluster"), "--client-ca", str(trusted.path),
        "--client-cn", "kube-apiserver", "--client-cn", "kube-apiserver-2",
        workers=1, threads=2,
    ) as s:  # fmt: skip
        yield s


def _call(server, method: str, path: str, certificate: tuple[Path, Path] | None = None) -> tuple[int, bytes]:
    """One request over a fresh connection, with or without a client certificate."""
    context = server.tls_context()
    if certificate is not None:
        context.load_cert_chain(*map(str, certificate))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with context.wrap_socket(raw, server_hostname="localhost") as conn:
        body = REVIEW if method == "POST" else b""
        conn.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        data = b""
        while chunk := conn.recv(65536):
            data += chunk
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), payload


@pytest.mark.parametrize("path", ["/validate", "/mutate"])
def test_a_review_without_a_client_certificate_gets_403(server, path):
    status, body = _call(server, "POST", path)
    assert status == 403
    assert json.loads(body)["code"] == 403 and "client certificate" in json.loads(body)["error"]


def test_a_review_with_a_certificate_the_client_ca_signed_is_answered(server, cas):
    status, body = _call(server, "POST", "/validate", cas[0].client("kube-apiserver"))
    assert status == 200 and json.loads(body)["response"]["allowed"] is True


def test_a_certificate_from_another_ca_is_refused(server, cas):
    try:
        status, _ = _call(server, "POST", "/validate", cas[1].client("kube-apiserver"))
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
        return  # the handshake failed: the certificate did not verify
    assert status == 403


def test_a_certificate_with_a_common_name_not_allowed_gets_403(server, cas):
    status, _ = _call(server, "POST", "/validate", cas[0].client("system:anonymous"))
    assert status == 403


@pytest.mark.parametrize(
    ("common_names", "status"),
    [(("kube-apiserver", "attacker"), 403), (("attacker", "kube-apiserver"), 200)],
    ids=["allowed-name-first", "allowed-name-last"],
)
def test_only_the_last_common_name_of_a_certificate_is_its_name(server, cas, common_names, status):
    """Kubernetes' x509 authenticator reads the user from ``Subject.CommonName``, which Go fills
    from each CN attribute in turn: the last one is the name, and an allowed name before it is
    not the caller's."""
    assert _call(server, "POST", "/validate", cas[0].client(*common_names))[0] == status


def test_a_certificate_is_named_by_the_last_common_name_of_its_subject():
    subject = ((("organizationName", "o"),), (("commonName", "kube-apiserver"), ("commonName", "attacker")))
    assert certificate_name({"subject": subject}) == "attacker"
    assert certificate_name({"subject": ((("organizationName", "o"),),)}) is None
    assert not ClientAuth("ca.crt", ("kube-apiserver",)).allows(None)
    assert ClientAuth("ca.crt").allows(None)  # no names configured: any certificate the CA signed


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics"])
def test_health_and_metrics_need_no_client_certificate(server, path):
    status, _ = _call(server, "GET", path)
    assert status == 200


# -- in-process: what the app does with the server's verdict ---------------------------------


class RecordingBindGuard:
    """Records how the app calls the bind guard."""

    leases = None  # no coordination through the API server

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def review(self, req, source, *, verified=False, target=None):
        from webhook.admission import Outcome

        self.calls.append(("review", verified))
        return Outcome(req, {"uid": req.uid, "allowed": True})

    def review_created(self, req, source, outcome, judged=None, *, verified=False):
        self.calls.append(("review_created", verified))
        return outcome


@pytest.mark.parametrize("verified", [True, False])
def test_the_bind_guard_is_told_whether_the_caller_was_verified(verified):
    guard = RecordingBindGuard()
    state = FixedState(load_snapshot([str(EXAMPLES / "cluster")]))
    client = create_app(config_from_dict({}), state, bind_guard=guard).test_client()
    environ = {CLIENT_VERIFIED: verified}
    for body in (BINDING, REVIEW):
        reply = client.post(
            "/validate", data=body, content_type="application/json", environ_overrides=environ
        )
        assert reply.status_code == 200
    assert guard.calls == [("review", verified), ("review_created", verified)]


def test_with_client_certificates_required_an_unverified_caller_never_reaches_the_bind_guard():
    guard = RecordingBindGuard()
    state = FixedState(load_snapshot([str(EXAMPLES / "cluster")]))
    client = create_app(config_from_dict({}), state, bind_guard=guard, require_client_cert=True).test_client()
    reply = client.post("/validate", data=BINDING, content_type="application/json")
    assert reply.status_code == 403 and guard.calls == []


def test_the_config_file_names_the_client_ca_and_common_names():
    config = config_from_dict({"clientAuth": {"ca": "/etc/ca.crt", "commonNames": ["kube-apiserver"]}})
    assert config.client_auth == ClientAuth("/etc/ca.crt", ("kube-apiserver",))
    assert config_from_dict({}).client_auth is None


@pytest.mark.parametrize(
    ("client_auth", "message"),
    [
        ({"ca": "/etc/ca.crt", "commonName": ["x"]}, "clientAuth.commonName: unknown field"),
        ({"commonNames": ["x"]}, "clientAuth.ca: must be the path"),
        ({"ca": "/etc/ca.crt", "commonNames": "x"}, "clientAuth.commonNames: must be a list"),
        ("/etc/ca.crt", "clientAuth: must be a mapping"),
    ],
)
def test_client_auth_config_errors_name_the_field(client_auth, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"clientAuth": client_auth})


def test_the_flags_override_the_config_file(tmp_path, cas):
    from webhook.cli.serve import _client_auth

    config = config_from_dict({"clientAuth": {"ca": str(cas[1].path), "commonNames": ["a"]}})
    assert _client_auth(config, None, ()) == ClientAuth(str(cas[1].path), ("a",))
    assert _client_auth(config, cas[0].path, ("b",)) == ClientAuth(str(cas[0].path), ("b",))


def test_a_client_ca_that_does_not_load_is_an_input_error(tmp_path):
    from webhook.cli.options import InputError
    from webhook.cli.serve import _client_auth

    (tmp_path / "ca.crt").write_text("not a certificate")
    with pytest.raises(InputError, match="cannot load the client CA"):
        _client_auth(config_from_dict({}), tmp_path / "ca.crt", ())
