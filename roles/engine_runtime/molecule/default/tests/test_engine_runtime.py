"""The stack and the agent that engine_runtime installed really work."""

import hashlib
import json

from tests.molecule_hosts import podman_hosts

testinfra_hosts = podman_hosts()

STACK = "/opt/vllm-fleet/stacks/cpu-vllm-0.32.0"


def test_vllm_cli_reports_the_stack_version(host):
    out = host.check_output(f"{STACK}/bin/vllm --version 2>/dev/null")
    assert out.strip().endswith("0.32.0+cpu")


def test_torch_is_the_cpu_build_and_the_cuda_addons_are_absent(host):
    code = (
        "import importlib.util, json, torch;"
        "print(json.dumps({'torch': torch.__version__, 'cuda': torch.cuda.is_available(),"
        "'addons': [m for m in ('torchvision', 'torchaudio', 'torchcodec', 'triton')"
        " if importlib.util.find_spec(m)]}))"
    )
    info = json.loads(host.check_output(f'{STACK}/bin/python -c "{code}" 2>/dev/null'))
    assert info == {"torch": "2.13.0+cpu", "cuda": False, "addons": []}


def test_installed_wheels_are_exactly_the_lock(host):
    lock = host.file("/opt/vllm-fleet/locks/cpu-vllm-0.32.0.lock").content_string
    locked = {
        line.split(" ")[0].lower()
        for line in lock.splitlines()
        if line and not line.startswith("#")
    }
    frozen = host.check_output(f"{STACK}/bin/pip freeze --all --disable-pip-version-check")
    installed = {
        line.lower().replace("_", "-")
        for line in frozen.splitlines()
        if "==" in line and not line.lower().startswith("pip==")
    }
    # The dist-info alias (vllm==0.32.0+cpu) is the only addition, by design.
    assert installed - {"vllm==0.32.0+cpu"} == {n.replace("_", "-") for n in locked}


def test_stack_marker_matches_the_lock(host):
    lock = host.file("/opt/vllm-fleet/locks/cpu-vllm-0.32.0.lock").content_string
    marker = host.file(f"{STACK}/.vllm-fleet-stack").content_string.strip()
    # The role hashes the lock as Ansible's file lookup reads it (trailing whitespace cut).
    assert marker == hashlib.sha256(lock.rstrip().encode()).hexdigest()
    assert not host.file(STACK).mode & 0o022
    assert host.file(STACK).user == "root"


def test_agent_cli_runs_from_path(host):
    assert host.check_output("vllm-fleet --version").strip() == "0.1.0"
    assert (
        host.file("/usr/local/bin/vllm-fleet").linked_to == "/opt/vllm-fleet/agent/bin/vllm-fleet"
    )


def test_system_packages_present(host):
    for name in ("python3-venv", "libnuma1", "g++", "python3-dev"):
        assert host.package(name).is_installed, name
