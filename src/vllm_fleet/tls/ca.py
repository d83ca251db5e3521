"""The fleet's certificate authority, kept on the controller.

``vllm-fleet ca init DIR`` creates one (an EC P-256 key, 0600, and a self-signed CA
certificate); an operator with a CA of their own (from Vault, say) puts its ``ca.crt`` and
``ca.key`` in DIR instead. Hosts make their own private keys, which never leave them, and
send a certificate signing request; the CA signs the request's public key for the names and
addresses the inventory gives the host, never the ones the request asks for, so a host cannot
obtain a certificate for another host's name. A certificate is issued again only when it is
missing, was not issued by this CA, no longer matches the host's key, names or addresses, or
expires within the renewal window (``renewal_reason``).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
CA_DAYS = 3650
HOST_DAYS = 397
RENEW_BEFORE_DAYS = 30


# A CA certificate signs certificates (and revocation lists), nothing else.
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=False,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


class CaError(Exception):
    """A CA directory, request or certificate that cannot be used; the message says why."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _write_private(path: Path, data: bytes) -> None:
    """Create path 0600 from the start (never briefly readable), refusing to replace a file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def init_ca(directory: Path, name: str = "vllm-fleet CA", days: int = CA_DAYS) -> Path:
    """Create a CA in directory (made 0700 if absent); refuses one that already holds a CA."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if (directory / CA_KEY).exists() or (directory / CA_CERT).exists():
        raise CaError(f"{directory}: already holds a CA ({CA_KEY}, {CA_CERT}); not replaced")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_private(
        directory / CA_KEY,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    (directory / CA_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return directory / CA_CERT


@dataclass(frozen=True)
class FleetCa:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        csr_pem: bytes,
        names: list[str],
        addresses: list[str],
        days: int = HOST_DAYS,
    ) -> bytes:
        """A host certificate (PEM) for the request's key, valid for names and addresses."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem)
        except ValueError as err:
            raise CaError(f"not a PEM certificate signing request: {err}") from err
        if not csr.is_signature_valid:
            raise CaError("the signing request's signature does not verify: refused")
        if not names and not addresses:
            raise CaError("a host certificate needs at least one name or address")
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (names or addresses)[0])])
        now = _now()
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(csr.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(
                min(now + datetime.timedelta(days=days), self.cert.not_valid_after_utc)
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .add_extension(x509.SubjectAlternativeName(_sans(names, addresses)), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
                critical=False,
            )
        )
        return builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def _sans(names: list[str], addresses: list[str]) -> list[x509.GeneralName]:
    general: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    for address in addresses:
        try:
            general.append(x509.IPAddress(ipaddress.ip_address(address)))
        except ValueError as err:
            raise CaError(f"{address!r} is not an IP address") from err
    return general


def load_ca(directory: Path) -> FleetCa:
    """The CA in directory, checked: its key private to its owner and matching the certificate,
    the certificate a CA's and still valid."""
    key_path, cert_path = directory / CA_KEY, directory / CA_CERT
    for path in (key_path, cert_path):
        if not path.is_file():
            raise CaError(f"{path}: missing (create a CA with `vllm-fleet ca init {directory}`)")
    mode = stat.S_IMODE(key_path.stat().st_mode)
    if mode & 0o077:
        raise CaError(f"{key_path}: mode {mode:04o} lets others read the CA key; chmod 0600 it")
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CaError(f"{key_path}: not an EC private key")
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    if cert.public_key() != key.public_key():
        raise CaError(f"{cert_path}: its public key is not {key_path}'s")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CaError(f"{cert_path}: not a CA certificate (BasicConstraints CA:TRUE)")
    if cert.not_valid_after_utc <= _now():
        raise CaError(f"{cert_path}: expired on {cert.not_valid_after_utc:%Y-%m-%d}")
    return FleetCa(cert, key)


def renewal_reason(
    cert_pem: bytes | None,
    ca: FleetCa,
    public_key_pem: bytes,
    names: list[str],
    addresses: list[str],
    *,
    renew_before_days: int = RENEW_BEFORE_DAYS,
) -> str | None:
    """Why a host's certificate must be issued again, or None when it is still good."""
    if not cert_pem:
        return "no certificate yet"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return "the certificate does not parse"
    mismatch = _mismatch(cert, ca, public_key_pem, names, addresses)
    if mismatch:
        return mismatch
    left = cert.not_valid_after_utc - _now()
    if left < datetime.timedelta(days=renew_before_days):
        return f"it expires in {max(left.days, 0)} days"
    return None


def _mismatch(
    cert: x509.Certificate,
    ca: FleetCa,
    public_key_pem: bytes,
    names: list[str],
    addresses: list[str],
) -> str | None:
    try:
        cert.verify_directly_issued_by(ca.cert)
    except (InvalidSignature, TypeError, ValueError):
        return "not issued by the fleet CA"
    if cert.public_key() != serialization.load_pem_public_key(public_key_pem):
        return "the host's key changed"
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "it names no host"
    have_names = set(sans.get_values_for_type(x509.DNSName))
    have_addresses = set(sans.get_values_for_type(x509.IPAddress))
    if have_names != set(names) or have_addresses != {ipaddress.ip_address(a) for a in addresses}:
        return "the host's names or addresses changed"
    return None
