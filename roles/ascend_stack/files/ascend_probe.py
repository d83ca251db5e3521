"""Read what is installed, without changing anything: the version files, npu-smi, reboot marker.

Run on the host by ascend_stack (ansible.builtin.script). Argument: a JSON object
{"versions": {kind: path}, "npu_smi": path, "marker": path}. Prints one JSON object with each
version file's text as it is: the role parses it on the controller with the one parser of
those files (vllm_fleet.preflight.facts.parse_version_info).
"""

from __future__ import annotations

import json
import os
import sys

# A version file is a few lines; more than this is not one.
LIMIT = 16384


def text_of(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(LIMIT)
    except OSError:
        return ""


def main() -> None:
    spec = json.loads(sys.argv[1])
    marker = spec["marker"]
    pending = []
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as handle:
            pending = [line.strip() for line in handle if line.strip()]
    print(
        json.dumps(
            {
                "version_files": {kind: text_of(path) for kind, path in spec["versions"].items()},
                "npu_smi": os.access(spec["npu_smi"], os.X_OK),
                "reboot_pending": pending,
            }
        )
    )


main()
