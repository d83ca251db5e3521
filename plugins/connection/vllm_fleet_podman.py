# The lab's and the Molecule scenarios' connection: containers.podman.podman with modules piped
# to one exec per task. The collection's plugin copies each module into the container and runs
# it with separate execs (a temporary directory, the module, its cleanup) after a `podman mount`,
# about four podman calls a task; a converged site.yml is mostly that.
#
# Where the container runs under runc as root (the lab, every scenario), the exec goes to runc
# itself, the runtime podman started the container with: `podman exec` adds its own start, its
# database and a conmon per exec session, about 0.2 s a call here, three times runc's. runc
# joins the same namespaces and cgroups (so `podman update --cpus` still slows the modules) and
# gives the process the container's environment. Anything else goes through podman.
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from typing import BinaryIO

from ansible.errors import AnsibleError
from ansible.module_utils.common.text.converters import to_bytes, to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
from ansible.utils.display import Display
from ansible_collections.containers.podman.plugins.connection.podman import (
    Connection as PodmanConnection,
)

# The collection's options, as its podman plugin documents them (Ansible reads a literal).
DOCUMENTATION = """
    author: vllm-fleet (the collection's podman plugin by Tomas Tomecek)
    name: vllm_fleet_podman
    short_description: podman connection that pipes modules to podman exec -i
    description:
        - Run commands or put/fetch files to an existing container using podman tool.
    options:
      remote_addr:
        description:
          - The ID of the container you want to access.
        default: inventory_hostname
        vars:
          - name: ansible_host
          - name: inventory_hostname
          - name: ansible_podman_host
      remote_user:
        description:
            - User specified via name or UID which is used to execute commands inside the container. If you
              specify the user via UID, you must set C(ANSIBLE_REMOTE_TMP) to a path that exits
               inside the container and is writable by Ansible.
        ini:
          - section: defaults
            key: remote_user
        env:
          - name: ANSIBLE_REMOTE_USER
        vars:
          - name: ansible_user
      podman_extra_args:
        description:
          - Extra arguments to pass to the podman command line.
        default: ''
        ini:
          - section: defaults
            key: podman_extra_args
        vars:
          - name: ansible_podman_extra_args
        env:
          - name: ANSIBLE_PODMAN_EXTRA_ARGS
      podman_executable:
        description:
          - Executable for podman command.
        default: podman
        vars:
          - name: ansible_podman_executable
        env:
          - name: ANSIBLE_PODMAN_EXECUTABLE
      exec_via:
        description:
          - C(runc) execs through runc itself where the container runs under runc as root (else
            through podman); C(podman) always through C(podman exec) (bench/connection_bench.py
            compares the two).
        default: runc
        choices: [runc, podman]
        vars:
          - name: ansible_vllm_fleet_podman_exec_via
"""

display = Display()

# podman's state root for runc when it runs as root (runc's own default).
RUNC_ROOT = "/run/runc"
# How runc reports that it could not exec at all (the container stopped or is gone), as
# opposed to a command that ran and failed: podman then answers with its own error.
RUNC_FAILED = re.compile(rb'level=error msg="exec failed')
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _id_cache_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), f"vllm-fleet-podman-{os.geteuid()}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    if os.stat(path).st_uid != os.geteuid():
        raise AnsibleError(f"{path} belongs to another user: remove it")
    return path


def _running_under_runc(container_id: str) -> bool:
    # runc keeps a running container's state here; `podman stop` removes it, `start` restores it.
    return os.path.isfile(os.path.join(RUNC_ROOT, container_id, "state.json"))


class Connection(PodmanConnection):
    transport = "vllm_fleet_podman"
    # Ansible pipes a module to the remote interpreter's stdin; `podman exec -i` forwards
    # it. The collection turned pipelining off because its exec never passed -i.
    has_pipelining = True
    always_pipeline_modules = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._mounted_once = False
        self._runc_id: str | None = None

    def _connect(self) -> PodmanConnection:
        # The mount is only needed to copy files (template, copy, fetch): a pipelined module
        # task never asks for it, so it is made on the first put_file or fetch_file.
        ConnectionBase._connect(self)
        self._connected = True
        return self

    def _mounted(self) -> None:
        if not self._mounted_once:
            PodmanConnection._connect(self)
            self._mounted_once = True

    def _runc_target(self, fresh: bool = False) -> str | None:
        """The container's ID when runc can exec into it directly, else None (use podman).

        fresh: ask podman again instead of trusting the cached ID (runc could not exec with it).
        """
        if self._runc_id is not None and not fresh:
            return self._runc_id
        self._runc_id = None
        name = str(self._container_id)
        runc_can = (
            self.get_option("exec_via") == "runc"
            and not self.user
            and os.geteuid() == 0
            and shutil.which("runc") is not None
            and SAFE_NAME.match(name) is not None
        )
        if not runc_can:
            return None
        cache = os.path.join(_id_cache_dir(), name)
        container_id = ""
        if not fresh:
            try:
                with open(cache, encoding="ascii") as cached:
                    container_id = cached.read().strip()
            except OSError:
                pass
        # A state file alone does not prove the ID current: a container removed without
        # runc's cleanup leaves one behind, and a new one under the same name has a new ID.
        if not (container_id and _running_under_runc(container_id)):
            # A new container under the same name (the lab rebuilt), or the first call.
            rc, out, _ = self._podman(
                ["inspect", "--format", "{{.ID}} {{.OCIRuntime}}"], use_container_id=True
            )
            fields = to_native(out).split()
            if rc != 0 or len(fields) != 2 or fields[1] != "runc":
                return None
            container_id = fields[0]
            if not _running_under_runc(container_id):
                return None
            fd, staging = tempfile.mkstemp(dir=os.path.dirname(cache))
            with os.fdopen(fd, "w", encoding="ascii") as staged:
                staged.write(container_id)
            os.replace(staging, cache)
        self._runc_id = container_id
        return container_id

    def _runc(
        self, container_id: str, argv: list[str], stdin: object = None, in_data: bytes | None = None
    ) -> tuple[int, bytes, bytes]:
        local_cmd = ["runc", "--root", RUNC_ROOT, "exec", container_id, *argv]
        display.vvv(f"RUN {local_cmd}", host=str(self._container_id))
        proc = subprocess.Popen(
            local_cmd,
            stdin=subprocess.PIPE if stdin is None else stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        stdout, stderr = proc.communicate(input=in_data)
        return proc.returncode, stdout, stderr

    def _via_runc(
        self, argv: list[str], in_data: bytes | None = None, source: BinaryIO | None = None
    ) -> tuple[int, bytes, bytes] | None:
        """Run argv through runc; None when runc cannot exec into the container (use podman).

        A failed exec with the cached ID asks podman for the current ID once and tries again:
        the cache can name a container that was removed and recreated under the same name.
        """
        for fresh in (False, True):
            container_id = self._runc_target(fresh=fresh)
            if container_id is None:
                return None
            if source is not None:
                source.seek(0)
            rc, stdout, stderr = self._runc(container_id, argv, stdin=source, in_data=in_data)
            if not (rc != 0 and RUNC_FAILED.search(stderr)):
                return rc, stdout, stderr
            display.vvv(
                f"runc could not exec: {to_native(stderr).strip()}", host=str(self._container_id)
            )
        # The container stopped: let podman run it and say so, as it would have.
        self._runc_id = None
        return None

    @ensure_connect
    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = False
    ) -> tuple[int, bytes, bytes]:
        argv = shlex.split(to_native(cmd, errors="surrogate_or_strict"))
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        result = self._via_runc(argv, in_data=in_data or b"")
        if result is not None:
            return result
        if in_data is None:
            return super().exec_command(cmd, in_data=None, sudoable=sudoable)
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        args = ["exec", "-i"]
        if self.user:
            args.extend(("--user", self.user))
        return self._podman(args, argv, in_data)

    def put_file(self, in_path: str, out_path: str) -> None:
        ConnectionBase.put_file(self, in_path, out_path)
        with open(to_bytes(in_path, errors="surrogate_or_strict"), "rb") as source:
            display.vvv(f"PUT {in_path} TO {out_path}", host=str(self._container_id))
            result = self._via_runc(["/bin/sh", "-c", 'cat > "$1"', "sh", out_path], source=source)
        if result is None:
            self._mounted()
            super().put_file(in_path, out_path)
            return
        rc, _, stderr = result
        if rc != 0:
            raise AnsibleError(
                f"Failed to copy {in_path} to {out_path} in {self._container_id}: "
                f"{to_native(stderr).strip()}"
            )

    def fetch_file(self, in_path: str, out_path: str) -> None:
        ConnectionBase.fetch_file(self, in_path, out_path)
        display.vvv(f"FETCH {in_path} TO {out_path}", host=str(self._container_id))
        result = self._via_runc(["cat", "--", in_path])
        if result is None:
            self._mounted()
            super().fetch_file(in_path, out_path)
            return
        rc, stdout, stderr = result
        if rc != 0:
            raise AnsibleError(
                f"Failed to fetch {in_path} from {self._container_id}: {to_native(stderr).strip()}"
            )
        with open(to_bytes(out_path, errors="surrogate_or_strict"), "wb") as target:
            target.write(stdout)
