"""A private CA and a serving certificate for the webhook Service, named like a TLS Secret.

The apiserver calls ``https://NAME.NS.svc``, and verifies it against the ``caBundle`` of the
webhook configuration, so the serving certificate must carry every name the Service answers
to (plus loopback names for local runs) and chain to a CA whose certificate is that bundle.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_LIFETIME = dt.timedelta(days=5 * 365)
SERVING_LIFETIME = dt.timedelta(days=365)
CLOCK_SKEW = dt.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class Issued:
    directory: Path
    ca_bundle: str  # base64 of ca.crt, for a webhook configuration's clientConfig.caBundle
    dns_names: tuple[str, ...]


def service_names(service: str, namespace: str) -> tuple[str, ...]:
    return (
        service,
        f"{service}.{namespace}",
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        "localhost",
    )


class CertificateError(ValueError):
    """The existing CA cannot be used (missing, unreadable, or not a CA key pair)."""


def issue(service: str, namespace: str, out: Path, *, now: dt.datetime | None = None) -> Issued:
    """Write ``ca.crt``, ``ca.key``, ``tls.crt``, ``tls.key`` into ``out`` (keys mode 0600).

    ECDSA P-256: what kubeadm and cert-manager default to for serving certificates, and a
    fast handshake for an endpoint on the path of every pod.
    """
    now = now or dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"admit-guard CA ({namespace}/{service})")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now, CA_LIFETIME)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    out.mkdir(parents=True, exist_ok=True)
    _write(out / "ca.key", _pem_key(ca_key), private=True)
    _write(out / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM))
    return _serving(service, namespace, out, ca_key, ca_cert, now)


def renew(service: str, namespace: str, out: Path, *, now: dt.datetime | None = None) -> Issued:
    """A new serving key and certificate from the CA already in ``out``; ``ca.crt`` is kept, so
    the webhooks' caBundle stays valid (the rotation path)."""
    try:
        ca_key = serialization.load_pem_private_key((out / "ca.key").read_bytes(), password=None)
        ca_cert = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    except OSError as err:
        raise CertificateError(f"{err.filename}: cannot read: {err.strerror}") from None
    except ValueError as err:
        raise CertificateError(f"{out}: the CA does not load: {err}") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey) or ca_key.public_key() != ca_cert.public_key():
        raise CertificateError(f"{out}: ca.key is not the key of ca.crt")
    return _serving(service, namespace, out, ca_key, ca_cert, now or dt.datetime.now(dt.UTC))


def _serving(
    service: str,
    namespace: str,
    out: Path,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    now: dt.datetime,
) -> Issued:
    dns_names = service_names(service, namespace)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{service}.{namespace}.svc")])
    cert = (
        _builder(subject, ca_cert.subject, key.public_key(), now, SERVING_LIFETIME)
        .add_extension(
            x509.SubjectAlternativeName(
                [*(x509.DNSName(n) for n in dns_names), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(out / "tls.key", _pem_key(key), private=True)
    # Key first, certificate last: a watcher that sees the new certificate sees its key too.
    _write(out / "tls.crt", cert.public_bytes(serialization.Encoding.PEM))
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    return Issued(out, base64.b64encode(ca_pem).decode(), dns_names)


def _builder(
    subject, issuer, public_key, now: dt.datetime, lifetime: dt.timedelta
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - CLOCK_SKEW)
        .not_valid_after(now + lifetime)
    )


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write through a fresh temporary file and rename, so a reader never sees half a PEM.

    The temporary name is unpredictable and created exclusively without following links
    (``O_EXCL | O_NOFOLLOW``), with its mode set at creation: a symlink or a world-writable file
    planted in the directory can neither receive a private key nor lend it its mode.
    """
    mode = 0o600 if private else 0o644
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    for _ in range(16):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, mode)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(f"{path.parent}: cannot create a temporary file for {path.name}")
    try:
        os.fchmod(fd, mode)  # the umask may have narrowed it; never widened past mode
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
