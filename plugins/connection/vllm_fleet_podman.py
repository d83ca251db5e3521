# The lab's and the Molecule scenarios' connection: containers.podman.podman with modules piped
# to one `podman exec -i` per task. The collection's plugin copies each module into the
# container and runs it with separate execs (a temporary directory, the module, its cleanup)
# after a `podman mount`, about four podman calls a task; a converged site.yml is mostly that.
from __future__ import annotations

import shlex

from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.connection import ConnectionBase, ensure_connect
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
"""


class Connection(PodmanConnection):
    transport = "vllm_fleet_podman"
    # Ansible pipes a module to the remote interpreter's stdin; `podman exec -i` forwards
    # it. The collection turned pipelining off because its exec never passed -i.
    has_pipelining = True
    always_pipeline_modules = True

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self._mounted_once = False

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

    @ensure_connect
    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = False
    ) -> tuple[int, bytes, bytes]:
        if in_data is None:
            return super().exec_command(cmd, in_data=None, sudoable=sudoable)
        ConnectionBase.exec_command(self, cmd, in_data=in_data, sudoable=sudoable)
        args = ["exec", "-i"]
        if self.user:
            args.extend(("--user", self.user))
        return self._podman(
            args, shlex.split(to_native(cmd, errors="surrogate_or_strict")), in_data
        )

    def put_file(self, in_path: str, out_path: str) -> None:
        self._mounted()
        super().put_file(in_path, out_path)

    def fetch_file(self, in_path: str, out_path: str) -> None:
        self._mounted()
        super().fetch_file(in_path, out_path)
