"""How much host memory an engine group's unit may use: its systemd ``MemoryMax=``.

An engine that outgrows its bound is killed by the kernel inside its own cgroup (systemd
restarts it, the routers retry its requests elsewhere) before the host's other engines, the
watchdog, sshd or systemd run short. systemd applies ``MemoryMax=`` on cgroup v2 (Debian 12's
default) and maps it to v1's ``memory.limit_in_bytes``.

- CPU: the engine holds its weights and its KV cache in host memory; the bound is the weights
  (at the dtype the engine computes in), the KV cache and a fixed overhead for the Python
  processes, torch and activations.
- CUDA / Ascend: weights and KV cache live on the devices; the host memory an engine needs
  (its processes, pinned buffers, the weights passing through while they load) grows with
  its devices, so each group gets the host's memory less the reserve, shared by devices.
"""

from __future__ import annotations

from vllm_fleet.preflight.kv_planner import DTYPE_BYTES

GIB = 1024**3
# Measured on the lab's CPU engine (SmolLM2-135M, float32, 1.5 GiB KV cache): about 2.3 GiB
# beyond weights and KV cache in its three processes; 4 GiB leaves room for long prompts.
DEFAULT_CPU_OVERHEAD = 4 * GIB


def weights_in_memory(weight_bytes: int, stored_dtype: object, served_dtype: str) -> int:
    """The weights' size at the dtype the engine serves (a bfloat16 checkpoint served in
    float32 takes twice its files). ``auto`` serves the stored dtype."""
    stored = DTYPE_BYTES.get(str(stored_dtype).lower()) if stored_dtype else None
    served = DTYPE_BYTES.get(served_dtype.lower())
    if stored is None or served is None or served <= stored:
        return weight_bytes
    return weight_bytes * served // stored


def cpu_engine_bytes(weights: int, kv_cache_bytes: int, overhead: int) -> int:
    """A CPU engine's bound: what it must hold, plus its processes' overhead."""
    return weights + kv_cache_bytes + overhead


def device_engine_share(
    host_memory: int, reserve: int, group_devices: int, host_devices: int
) -> int | None:
    """A device engine's share of host memory: the host less the reserve, by devices.
    None when the host's memory is unknown or the reserve takes it all."""
    usable = host_memory - reserve
    if host_memory <= 0 or usable <= 0 or group_devices <= 0:
        return None
    return usable * group_devices // max(host_devices, group_devices)
