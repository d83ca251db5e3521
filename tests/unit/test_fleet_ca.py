"""The fleet CA: created private, signs only what the inventory names, and real TLS clients
that trust it accept its hosts and refuse others."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vllm_fleet.cli import main
from vllm_fleet.tls.ca import CA_CERT, CA_KEY, CaError, init_ca, load_ca, renewal_reason


def host_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def csr_for(key: ec.EllipticCurvePrivateKey, asked: str = "engine01") -> bytes:
    """What a host sends: its public key, signed by it, asking for a name of its choosing."""
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, asked)]))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(asked)]), critical=False)
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM)


def public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


@pytest.fixture
def ca(tmp_path: Path):
    init_ca(tmp_path / "ca")
    return load_ca(tmp_path / "ca")


def test_init_makes_a_private_key_and_a_ca_certificate_and_never_replaces_them(tmp_path):
    directory = tmp_path / "ca"
    init_ca(directory)
    assert (directory / CA_KEY).stat().st_mode & 0o777 == 0o600
    assert directory.stat().st_mode & 0o777 == 0o700
    before = (directory / CA_KEY).read_bytes()
    with pytest.raises(CaError, match="already holds a CA"):
        init_ca(directory)
    assert (directory / CA_KEY).read_bytes() == before
    loaded = load_ca(directory)
    constraints = loaded.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca


def test_a_ca_key_others_can_read_or_a_mismatched_pair_is_refused(tmp_path):
    init_ca(tmp_path / "a")
    init_ca(tmp_path / "b")
    (tmp_path / "a" / CA_KEY).chmod(0o640)
    with pytest.raises(CaError, match="lets others read the CA key; chmod 0600 it"):
        load_ca(tmp_path / "a")
    (tmp_path / "a" / CA_KEY).chmod(0o600)
    (tmp_path / "a" / CA_CERT).write_bytes((tmp_path / "b" / CA_CERT).read_bytes())
    with pytest.raises(CaError, match="its public key is not"):
        load_ca(tmp_path / "a")
    with pytest.raises(CaError, match="missing"):
        load_ca(tmp_path / "none")


def test_the_certificate_names_what_the_inventory_says_not_what_the_host_asked(ca):
    key = host_key()
    pem = ca.issue(csr_for(key, asked="router01"), ["engine01"], ["10.0.0.21"])
    cert = x509.load_pem_x509_certificate(pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["engine01"]
    assert [str(a) for a in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.21"]
    assert cert.public_key() == key.public_key()
    cert.verify_directly_issued_by(ca.cert)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_request_whose_signature_does_not_verify_is_refused(ca):
    tampered = csr_for(host_key()).replace(b"MI", b"MJ", 1)
    with pytest.raises(CaError):
        ca.issue(tampered, ["engine01"], [])
    with pytest.raises(CaError, match="not an IP address"):
        ca.issue(csr_for(host_key()), ["engine01"], ["engine01"])


def test_a_certificate_is_issued_again_only_when_something_changed(ca, tmp_path):
    key = host_key()
    names, addresses = ["engine01"], ["10.0.0.21"]
    pem = ca.issue(csr_for(key), names, addresses)
    assert renewal_reason(pem, ca, public_pem(key), names, addresses) is None
    assert renewal_reason(None, ca, public_pem(key), names, addresses) == "no certificate yet"
    assert renewal_reason(pem, ca, public_pem(host_key()), names, addresses) == (
        "the host's key changed"
    )
    assert renewal_reason(pem, ca, public_pem(key), names, ["10.0.0.22"]) == (
        "the host's names or addresses changed"
    )
    short = ca.issue(csr_for(key), names, addresses, days=10)
    assert renewal_reason(short, ca, public_pem(key), names, addresses) == "it expires in 9 days"
    init_ca(tmp_path / "other")
    foreign = load_ca(tmp_path / "other").issue(csr_for(key), names, addresses)
    assert renewal_reason(foreign, ca, public_pem(key), names, addresses) == (
        "not issued by the fleet CA"
    )


def serve_once(cert_pem: bytes, key: ec.EllipticCurvePrivateKey, tmp_path: Path) -> int:
    """A TLS server on 127.0.0.1 that answers one handshake; returns its port."""
    (tmp_path / "host.crt").write_bytes(cert_pem)
    (tmp_path / "host.key").write_bytes(key_pem(key))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "host.crt", tmp_path / "host.key")
    listener = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        with listener:
            conn, _ = listener.accept()
            try:
                with context.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def handshake(port: int, ca_pem: bytes) -> bytes:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        return tls.recv(2)


def test_a_client_trusting_the_fleet_ca_accepts_its_host_and_refuses_any_other(ca, tmp_path):
    key = host_key()
    good = ca.issue(csr_for(key), ["engine01"], ["127.0.0.1"])
    assert handshake(serve_once(good, key, tmp_path), ca.cert_pem) == b"ok"
    # The same name and address, signed by a CA that is not the fleet's.
    init_ca(tmp_path / "rogue-ca")
    rogue = load_ca(tmp_path / "rogue-ca").issue(csr_for(key), ["engine01"], ["127.0.0.1"])
    with pytest.raises(ssl.SSLCertVerificationError, match="unable to get local issuer"):
        handshake(serve_once(rogue, key, tmp_path), ca.cert_pem)
    # The fleet's CA, but for another host's address.
    elsewhere = ca.issue(csr_for(key), ["engine02"], ["10.0.0.22"])
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        handshake(serve_once(elsewhere, key, tmp_path), ca.cert_pem)


def test_the_cli_creates_and_shows_a_ca(tmp_path, capsys):
    assert main(["ca", "init", str(tmp_path / "ca"), "--name", "test fleet CA"]) == 0
    out = capsys.readouterr().out
    assert "CN=test fleet CA" in out and "sha256 " in out
    assert main(["ca", "init", str(tmp_path / "ca")]) == 1
    assert "already holds a CA" in capsys.readouterr().err
    assert main(["ca", "show", str(tmp_path / "ca")]) == 0
    expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=3650)
    assert f"valid until {expires:%Y}" in capsys.readouterr().out
