"""Which file each library really resolves to, by the real dynamic loader (ld.so.cache, ldconfig).

Run on the host by ascend_stack (ansible.builtin.script). Arguments: ENV_FILE LIB...
Each library is dlopen()ed in a child process twice: with a plain environment ("plain": what any
process gets from ld.so.cache) and in a transient systemd service that reads ENV_FILE as its
EnvironmentFile= ("service"), as the engine units do: systemd itself parses the file, so the
child sees what an engine would, quoting and all. The path comes from /proc/self/maps. Prints
one JSON object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

CHILD = r"""
import ctypes, json, sys
out = {}
for name in sys.argv[1:]:
    try:
        ctypes.CDLL(name)
    except OSError as err:
        out[name] = "not loaded: " + str(err)
with open("/proc/self/maps") as maps:
    paths = {line.split()[-1] for line in maps if "/" in line}
for name in sys.argv[1:]:
    if name not in out:
        hits = sorted(p for p in paths if p.rsplit("/", 1)[-1] == name)
        out[name] = hits[0] if len(hits) == 1 else "ambiguous: " + " ".join(hits)
print(json.dumps(out))
"""


def loaded(libs: list[str], argv_prefix: list[str], env: dict[str, str]) -> dict[str, str]:
    run = subprocess.run(
        [*argv_prefix, sys.executable, "-c", CHILD, *libs],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if run.returncode != 0:
        return {lib: "loader check failed: " + run.stderr.strip()[-300:] for lib in libs}
    return json.loads(run.stdout)


def as_a_service(env_file: str) -> list[str]:
    """systemd-run's prefix for a child that gets its environment as an engine unit does."""
    return [
        "systemd-run", "--wait", "--pipe", "--quiet", "--collect",
        f"--property=EnvironmentFile={env_file}",
    ]  # fmt: skip


def main() -> None:
    env_file, libs = sys.argv[1], sys.argv[2:]
    plain = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    result = {"plain": loaded(["libascend_hal.so"], [], plain), "service": None}
    if os.path.exists(env_file):
        result["service"] = loaded(libs, as_a_service(env_file), plain)
    print(json.dumps(result))


main()
