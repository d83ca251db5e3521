"""The weights model_weights installed are complete, verified, read-only and detectably intact;
an hf model reached the engine host through the cache host only."""

import json
from pathlib import Path

import pytest
import yaml
from tests.molecule_hosts import podman_host

testinfra_hosts = ["podman://vf-model-weights"]

ROOT = Path(__file__).resolve().parents[5]
SCENARIO = yaml.safe_load((Path(__file__).resolve().parents[1] / "molecule.yml").read_text())
TOKEN = SCENARIO["provisioner"]["inventory"]["group_vars"]["all"]["fleet_model_cache_token"]
REVISION = yaml.safe_load((ROOT / "inventories/lab/group_vars/all/models.yml").read_text())[
    "fleet_models"
]["smollm2-135m"]["revision"]
MODEL_DIR = f"/srv/models/smollm2-135m/{REVISION}"


def manifest(host):
    return json.loads(host.file(f"{MODEL_DIR}/.vllm-fleet-manifest.json").content_string)


def test_every_manifest_file_is_installed_read_only(host):
    data = manifest(host)
    assert data["revision"] == REVISION
    assert {f["path"] for f in data["files"]} >= {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    }
    for entry in data["files"]:
        f = host.file(f"{MODEL_DIR}/{entry['path']}")
        assert f.size == entry["size"]
        assert f.user == "root"
        assert f.mode == 0o444
    assert host.file(MODEL_DIR).mode == 0o555


def test_current_points_at_the_pinned_revision(host):
    assert host.file("/srv/models/smollm2-135m/current").linked_to == MODEL_DIR


def test_no_staging_left_behind(host):
    leftovers = host.check_output("ls -A /srv/models/smollm2-135m").split()
    assert sorted(leftovers) == sorted(["current", REVISION])


def test_full_verify_passes(host):
    out = host.check_output(f"vllm-fleet weights verify --full {MODEL_DIR}")
    assert out.endswith("verified")


def test_a_flipped_byte_is_found_with_both_hashes(host):
    expected = next(
        f["sha256"] for f in manifest(host)["files"] if f["path"] == "model.safetensors"
    )
    host.check_output(
        "rm -rf /tmp/tamper && cp -a %s /tmp/tamper && chmod -R u+w /tmp/tamper", MODEL_DIR
    )
    # Flip one byte in the middle of the weights.
    host.check_output(
        "python3 -c \"f=open('/tmp/tamper/model.safetensors','r+b'); f.seek(1<<20); b=f.read(1);"
        ' f.seek(1<<20); f.write(bytes([b[0]^1]))"'
    )
    result = host.run("vllm-fleet weights verify --full /tmp/tamper")
    assert result.rc == 1
    assert f"model.safetensors: sha256 mismatch: expected {expected}, got " in result.stdout
    # The stamp path must not trust a file whose mtime changed either.
    assert host.run("vllm-fleet weights verify /tmp/tamper").rc == 1


# --- the hf model, fetched once by the cache host -------------------------------------------

HF_ROOT = "/srv/models/smollm2-hf"


@pytest.fixture(scope="module")
def cache():
    return podman_host("vf-model-cache")


@pytest.fixture(scope="module")
def commit(cache):
    return cache.file("/run/vf-test-hub.commit").content_string.strip()


def test_the_hf_model_came_from_the_cache_host_with_its_hub_provenance(host, commit):
    data = json.loads(host.file(f"{HF_ROOT}/{commit}/.vllm-fleet-manifest.json").content_string)
    assert data["source"] == "hf"
    assert data["repo"] == "lab/smollm2"
    assert data["revision"] == commit
    assert data["via"] == f"https://vf-model-cache:8090/smollm2-hf/{commit}"
    assert host.file(f"{HF_ROOT}/current").linked_to == f"{HF_ROOT}/{commit}"
    # The same bytes as the mirror's copy: both verified against their own hashes.
    mirrored = {f["path"]: f["sha256"] for f in manifest(host)["files"]}
    for entry in data["files"]:
        assert mirrored[entry["path"]] == entry["sha256"]
    out = host.check_output(f"vllm-fleet weights verify --full {HF_ROOT}/{commit}")
    assert out.endswith("verified")


def address_of(node):
    out = node.check_output("ip -4 -o addr show scope global | awk '{print $4}'")
    return out.split("/")[0]


def test_only_the_cache_host_can_reach_the_hub(host, cache):
    probe = "python3 -c \"import urllib.request as u; u.urlopen('http://127.0.0.1:8089/api/models/lab/smollm2')\""
    assert host.run(probe).rc != 0
    assert cache.run(probe).rc == 0


def test_the_engine_host_downloaded_the_weights_from_the_cache(host, cache, commit):
    log = cache.file("/var/log/nginx/vllm-fleet-model-cache.access.log").content_string
    address = address_of(host)
    wanted = f'GET /smollm2-hf/{commit}/model.safetensors HTTP/1.1" 200 '
    assert any(line.startswith(address) and wanted in line for line in log.splitlines()), log


def test_the_cache_serves_on_its_own_address_only(cache):
    listeners = cache.check_output("ss -Hltn | awk '{print $4}'").split()
    ours = [sock for sock in listeners if sock.rsplit(":", 1)[1] in ("8090", "80")]
    assert ours == [f"{address_of(cache)}:8090"]  # never nginx's default site on :80


CA = "/etc/vllm-fleet/tls/ca.crt"


def status(node, url, *args):
    """The HTTP status curl gets trusting the fleet CA only; the token goes in a header file."""
    node.check_output(f"umask 077 && printf 'Authorization: Bearer %s\\n' {TOKEN} > /root/vf-auth")
    return node.check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' --cacert {CA} {' '.join(args)} {url}"
    )


def test_the_cache_serves_only_installed_revisions(cache, commit):
    staged = "/srv/model-cache/smollm2-hf/.staging-x"
    cache.check_output(f"mkdir -p {staged} && echo t > {staged}/f")
    base = f"https://{address_of(cache)}:8090/smollm2-hf"
    try:
        assert status(cache, f"{base}/.staging-x/f", "-H @/root/vf-auth") == "404"
        assert status(cache, f"{base}/{commit}/config.json", "-H @/root/vf-auth") == "200"
        assert status(cache, f"{base}/{commit}/x", "-X PUT -H @/root/vf-auth") == "403"
    finally:
        cache.check_output(f"rm -rf {staged}")


def test_the_cache_serves_no_one_without_its_token(host, cache, commit):
    """From the engine host: no token, another token, the token in the query string, the
    token as Basic auth: 401 for every file, the manifest and the gated model's weights."""
    url = f"https://vf-model-cache:8090/smollm2-hf/{commit}"
    for path in (".vllm-fleet-manifest.json", "model.safetensors", "", "../"):
        assert status(host, f"{url}/{path}") == "401", path
        assert status(host, f"{url}/{path}", "-H 'Authorization: Bearer wrong'") == "401"
        assert status(host, f"'{url}/{path}?token={TOKEN}'") == "401"
        assert status(host, f"{url}/{path}", f"-u reader:{TOKEN}") == "401"
    assert status(host, f"{url}/model.safetensors", "-H @/root/vf-auth") == "200"


def test_the_token_is_root_only_on_the_cache_and_nowhere_in_its_site(cache):
    readers = cache.file("/etc/nginx/vllm-fleet-model-cache-readers.conf")
    assert (readers.user, readers.group, readers.mode) == ("root", "root", 0o600)
    site = cache.file("/etc/nginx/sites-enabled/vllm-fleet-model-cache")
    assert TOKEN not in site.content_string
    assert (
        TOKEN not in cache.file("/var/log/nginx/vllm-fleet-model-cache.access.log").content_string
    )


def test_the_cache_speaks_only_tls_with_a_certificate_from_the_fleet_ca(host, commit):
    """From the engine host: plain HTTP on the port is refused (400), a client trusting the
    system's CAs (not the fleet's) fails the handshake, the fleet CA's passes."""
    url = f"vf-model-cache:8090/smollm2-hf/{commit}/config.json"
    assert status(host, f"http://{url}", "-H @/root/vf-auth") == "400"
    system_trust = host.run(
        f"curl -s -o /dev/null -H @/root/vf-auth --capath /etc/ssl/certs https://{url}"
    )
    assert system_trust.rc == 60, system_trust  # curl: peer certificate cannot be authenticated
    assert status(host, f"https://{url}", "-H @/root/vf-auth") == "200"
