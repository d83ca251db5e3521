"""The weights model_weights installed are complete, verified, read-only and detectably intact."""

import json
from pathlib import Path

import yaml
from tests.molecule_hosts import podman_hosts

testinfra_hosts = podman_hosts()

ROOT = Path(__file__).resolve().parents[5]
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
