"""Read what is installed, without changing anything: the version files, npu-smi, reboot marker.

Run on the host by ascend_stack (ansible.builtin.script). Argument: a JSON object
{"versions": {kind: path}, "npu_smi": path, "marker": path}. Prints one JSON object.
"""

from __future__ import annotations

import json
import os
import sys


def first_version(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() == "version":
                    return value.strip()
    except OSError:
        pass
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
                "versions": {kind: first_version(path) for kind, path in spec["versions"].items()},
                "npu_smi": os.access(spec["npu_smi"], os.X_OK),
                "reboot_pending": pending,
            }
        )
    )


main()
