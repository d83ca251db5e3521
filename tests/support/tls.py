"""A host's key and certificate from a fleet CA, as host_tls gives them (for tests' servers)."""

from __future__ import annotations

from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from vllm_fleet.tls.ca import FleetCa


def host_certificate(
    ca: FleetCa, directory: Path, names: list[str], addresses: list[str]
) -> tuple[Path, Path]:
    """(host.crt, host.key) in ``directory``: a new key, its certificate from ``ca``."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
        .sign(key, hashes.SHA256())
        .public_bytes(serialization.Encoding.PEM)
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert, key_file = directory / "host.crt", directory / "host.key"
    cert.write_bytes(ca.issue(csr, names, addresses))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert, key_file
