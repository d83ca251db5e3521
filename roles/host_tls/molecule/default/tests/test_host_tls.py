"""A real TLS server with the role's key and certificate, and a client that trusts only the
fleet CA: it accepts this host at its address, and refuses a certificate from any other CA."""

from __future__ import annotations

import pytest
from tests.molecule_hosts import podman_host

SERVER, PEER = "vf-tls", "vf-tls-peer"
TLS = "/etc/vllm-fleet/tls"


@pytest.fixture(scope="module")
def server():
    return podman_host(SERVER)


@pytest.fixture(scope="module")
def peer():
    return podman_host(PEER)


@pytest.fixture(scope="module")
def address(server):
    return server.check_output("hostname -I").split()[0]


def test_the_key_is_the_hosts_own_and_root_only(server):
    key = server.file(f"{TLS}/host.key")
    assert (key.user, key.group, key.mode) == ("root", "root", 0o600)
    # The certificate is for that key (the side effect's foreign certificate was replaced).
    from_key = server.check_output(f"openssl pkey -in {TLS}/host.key -pubout")
    from_cert = server.check_output(f"openssl x509 -in {TLS}/host.crt -noout -pubkey")
    assert from_key == from_cert
    # No other private key on the host: the CA's stays on the controller.
    holders = server.check_output("grep -rl 'PRIVATE KEY' /etc/vllm-fleet || true").split()
    assert holders == [f"{TLS}/host.key"]


def test_the_certificate_is_the_fleet_cas_for_the_hosts_name_and_address(server, address):
    verified = server.run(f"openssl verify -CAfile {TLS}/ca.crt {TLS}/host.crt")
    assert verified.rc == 0 and verified.stdout.strip().endswith(": OK"), verified.stderr
    names = server.check_output(f"openssl x509 -in {TLS}/host.crt -noout -ext subjectAltName")
    assert f"DNS:{SERVER}" in names and f"IP Address:{address}" in names
    assert server.file(f"{TLS}/host.crt").mode == 0o644


def serve(server, port: int, cert: str, key: str) -> None:
    server.check_output(
        f"systemd-run --unit vf-tls-server-{port} openssl s_server -accept {port} "
        f"-cert {cert} -key {key} -www"
    )
    server.check_output(f"timeout 10 sh -c 'until ss -ltnH | grep -q :{port}; do sleep 0.2; done'")


def connect(peer, address: str, port: int, ca_file: str):
    return peer.run(
        f"echo | openssl s_client -connect {address}:{port} -CAfile {ca_file} "
        f"-verify_return_error -verify_ip {address} -brief"
    )


def test_a_client_trusting_the_fleet_ca_reaches_the_host_and_refuses_any_other(
    server, peer, address
):
    serve(server, 8443, f"{TLS}/host.crt", f"{TLS}/host.key")
    good = connect(peer, address, 8443, f"{TLS}/ca.crt")
    assert good.rc == 0 and "Verification: OK" in good.stderr, good.stderr
    # The same host and key, but a certificate from a CA the fleet does not trust.
    server.check_output(
        f"openssl req -x509 -key {TLS}/host.key -subj /CN={SERVER} -days 1 "
        f"-addext subjectAltName=IP:{address} -out /tmp/rogue.crt"
    )
    serve(server, 8444, "/tmp/rogue.crt", f"{TLS}/host.key")
    rogue = connect(peer, address, 8444, f"{TLS}/ca.crt")
    assert rogue.rc != 0 and "verify error" in rogue.stderr, rogue.stderr
    # The fleet's certificate, checked for another address: refused too.
    wrong = peer.run(
        f"echo | openssl s_client -connect {address}:8443 -CAfile {TLS}/ca.crt "
        "-verify_return_error -verify_ip 10.255.255.1 -brief"
    )
    assert wrong.rc != 0 and "IP address mismatch" in wrong.stderr, wrong.stderr
