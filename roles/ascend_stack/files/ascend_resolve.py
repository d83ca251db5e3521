"""Which file each library really resolves to, by the real dynamic loader (ld.so.cache, ldconfig).

Run on the host by ascend_stack (ansible.builtin.script). Arguments: ENV_FILE LIB...
Each library is dlopen()ed in a child process twice: with a plain environment ("plain": what any
process gets from ld.so.cache) and with the variables of ENV_FILE, the EnvironmentFile the
engine units read ("service"). The path comes from /proc/self/maps. Prints one JSON object.
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


def read_env_file(path: str) -> dict[str, str]:
    env = {}
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            line = raw.strip()
            if not line or line.startswith("#") or "=" not in line:
                continue
            key, _, value = line.partition("=")
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1].replace('\\"', '"').replace("\\\\", "\\")
            env[key] = value
    return env


def loaded(libs: list[str], env: dict[str, str]) -> dict[str, str]:
    run = subprocess.run(
        [sys.executable, "-c", CHILD, *libs], env=env, capture_output=True, text=True, check=False
    )
    if run.returncode != 0:
        return {lib: "loader check failed: " + run.stderr.strip()[-300:] for lib in libs}
    return json.loads(run.stdout)


def main() -> None:
    env_file, libs = sys.argv[1], sys.argv[2:]
    plain = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    result = {"plain": loaded(["libascend_hal.so"], plain), "service": None}
    if os.path.exists(env_file):
        result["service"] = loaded(libs, {**plain, **read_env_file(env_file)})
    print(json.dumps(result))


main()
