"""``admit-guard certs``: a CA and a serving certificate the apiserver will accept."""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
import stat

import pytest
from click.testing import CliRunner
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from webhook.certs import issue
from webhook.cli import main


def load(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_serving_certificate_covers_every_service_name_and_loopback(tmp_path):
    issue("guard", "platform", tmp_path)
    san = load(tmp_path / "tls.crt").extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {
        "guard",
        "guard.platform",
        "guard.platform.svc",
        "guard.platform.svc.cluster.local",
        "localhost",
    }
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_serving_certificate_is_signed_by_the_ca_for_server_auth_only(tmp_path):
    issue("guard", "platform", tmp_path)
    ca, cert = load(tmp_path / "ca.crt"), load(tmp_path / "tls.crt")
    cert.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usages) == [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]


def test_lifetimes_are_a_year_for_serving_and_five_for_the_ca_with_p256_keys(tmp_path):
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    issue("guard", "platform", tmp_path, now=now)
    ca, cert = load(tmp_path / "ca.crt"), load(tmp_path / "tls.crt")
    assert cert.not_valid_before_utc < now < cert.not_valid_after_utc <= now + dt.timedelta(days=366)
    assert ca.not_valid_after_utc - now >= dt.timedelta(days=5 * 365)
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.key_size >= 256


def test_private_keys_are_readable_by_the_owner_only(tmp_path):
    issue("guard", "platform", tmp_path)
    for name in ("ca.key", "tls.key"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600


def test_cli_prints_the_ca_bundle_on_stdout(tmp_path):
    result = CliRunner().invoke(
        main, ["certs", "--service", "guard", "--namespace", "ns", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0
    assert base64.b64decode(result.stdout.strip()) == (tmp_path / "ca.crt").read_bytes()


def test_serve_without_certificates_says_how_to_make_them(tmp_path):
    result = CliRunner().invoke(main, ["serve", "--cert-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "admit-guard certs" in result.output


def test_a_symlink_planted_at_the_old_temporary_name_does_not_receive_the_ca_key(tmp_path):
    out = tmp_path / "certs"
    out.mkdir()
    stolen = tmp_path / "stolen"
    (out / ".ca.key.tmp").symlink_to(stolen)
    issue("admit-guard", "admit-guard", out)
    assert not stolen.exists()
    assert not (out / "ca.key").is_symlink()
    assert stat.S_IMODE((out / "ca.key").stat().st_mode) == 0o600


def test_a_world_writable_file_in_the_directory_does_not_lend_its_mode_to_a_key(tmp_path):
    out = tmp_path / "certs"
    out.mkdir()
    for name in ("ca.key", ".ca.key.tmp", "tls.key", ".tls.key.tmp"):
        (out / name).write_bytes(b"old")
        (out / name).chmod(0o666)
    issue("admit-guard", "admit-guard", out)
    for name in ("ca.key", "tls.key"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert not list(out.glob(".*.key.*.tmp"))


def _certs(*args):
    return CliRunner().invoke(main, ["certs", *args])


def test_an_existing_ca_is_not_replaced_without_force(tmp_path):
    out = tmp_path / "certs"
    assert _certs("--out", str(out)).exit_code == 0
    ca = (out / "ca.crt").read_bytes()
    refused = _certs("--out", str(out))
    assert refused.exit_code == 2 and "holds a CA (ca.crt ca.key)" in refused.stderr
    assert "--renew" in refused.stderr
    assert (out / "ca.crt").read_bytes() == ca
    assert _certs("--out", str(out), "--force").exit_code == 0
    assert (out / "ca.crt").read_bytes() != ca


def test_renew_issues_a_new_serving_certificate_from_the_same_ca(tmp_path):
    out = tmp_path / "certs"
    first = _certs("--out", str(out))
    ca, serving = (out / "ca.crt").read_bytes(), (out / "tls.crt").read_bytes()
    renewed = _certs("--out", str(out), "--renew")
    assert renewed.exit_code == 0 and renewed.stdout == first.stdout  # same caBundle
    assert (out / "ca.crt").read_bytes() == ca and (out / "tls.crt").read_bytes() != serving
    cert = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600


def test_renew_without_a_ca_says_how_to_make_one(tmp_path):
    result = _certs("--out", str(tmp_path / "none"), "--renew")
    assert result.exit_code == 2 and "create a CA first" in result.stderr


@pytest.mark.parametrize("present", ["ca.crt", "ca.key"])
def test_either_half_of_a_ca_is_not_replaced_without_force(tmp_path, present):
    (tmp_path / present).write_bytes(b"kept")
    refused = _certs("--out", str(tmp_path))
    assert refused.exit_code == 2 and f"holds a CA ({present})" in refused.stderr
    assert [p.name for p in tmp_path.iterdir()] == [present]
    assert (tmp_path / present).read_bytes() == b"kept"
    assert _certs("--out", str(tmp_path), "--force").exit_code == 0


@pytest.mark.parametrize("out", ["/proc/nope", "/dev/null", "/proc/self/ns"])
@pytest.mark.parametrize("renew", [[], ["--renew"]])
def test_an_unwritable_out_is_an_error_naming_it(out, renew):
    result = _certs("--out", out, *renew)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert out in result.stderr and "Traceback" not in result.output
