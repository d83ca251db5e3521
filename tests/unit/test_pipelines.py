"""The example pipelines for a fleet repository only run commands that exist here: make
targets of the Makefile, playbooks of the bundle, and vllm-fleet subcommands that its own
parser accepts. (tests/lab/test_monitoring_lab.py runs the drift job's commands against
the lab.)"""

from __future__ import annotations

import re
import shlex

import pytest
import yaml

from tests.support.paths import ROOT
from vllm_fleet.cli import build_parser

PIPELINES = ROOT / "examples/pipelines"
MAKE_TARGETS = set(re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M))


def github_commands() -> dict[str, list[str]]:
    workflow = yaml.safe_load((PIPELINES / "github-actions.yml").read_text())
    return {
        name: [line for step in job["steps"] for line in step.get("run", "").splitlines()]
        for name, job in workflow["jobs"].items()
    }


def gitlab_commands() -> dict[str, list[str]]:
    config = yaml.safe_load((PIPELINES / "gitlab-ci.yml").read_text())
    before = config["default"]["before_script"]
    return {
        name: [*before, *job["script"]]
        for name, job in config.items()
        if isinstance(job, dict) and "script" in job
    }


ALL = [(f"github:{j}", c) for j, c in github_commands().items()] + [
    (f"gitlab:{j}", c) for j, c in gitlab_commands().items()
]


def words(command: str) -> list[str]:
    """The command's words before any shell operator, variables given sample values."""
    expanded = command.replace('"$FLEET_INVENTORY"', "inventories/lab")
    expanded = re.sub(r'"\$[A-Z_]+"', "0123abc", expanded)
    return shlex.split(expanded.split("||")[0])


@pytest.mark.parametrize(("job", "commands"), ALL, ids=[j for j, _ in ALL])
def test_every_command_exists_in_the_bundle(job, commands):
    checked = 0
    for command in commands:
        argv = words(command)
        if argv[0] == "make":
            assert set(argv[1:]) <= MAKE_TARGETS, command
        elif argv[0].endswith("vllm-fleet"):
            build_parser().parse_args(argv[1:])  # exits (fails the test) when it does not parse
        elif argv[0].endswith("ansible-playbook"):
            playbook = next(a for a in argv[1:] if a.endswith(".yml"))
            assert (ROOT / playbook).is_file(), command
        else:
            continue
        checked += 1
    assert checked, f"{job} runs none of the bundle's commands"


@pytest.mark.parametrize("source", [github_commands, gitlab_commands])
def test_each_pipeline_reviews_drift_applies_on_main_and_checks_drift(source):
    jobs = {name: " ".join(commands) for name, commands in source().items()}
    review, apply_, drift = jobs["review"], jobs["apply"], jobs["drift"]
    assert "playbooks/preflight.yml" in review and "vllm-fleet drift" in review
    # On review, drift (exit 2) is the point of the review, not a failure.
    assert "|| test $? -eq 2" in review
    # The base is what each host records as deployed, not the previous push.
    assert "vllm-fleet apply --inventory" in apply_ and "--since" not in apply_
    assert "vllm-fleet drift" in drift and "||" not in drift
