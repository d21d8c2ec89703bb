"""Compile targets: a GPU that is not in this machine, described by its XLA target config.

``mhjax train --dry-run --target h200`` compiles a sweep for an H200 on a CPU machine: JAX
builds a compile-only device from an XLA ``GpuTargetConfig`` (protobuf text) and runs XLA's
whole GPU pipeline for it, Triton and ptxas included, with the GPU compiler that ships in
``jax[cuda13]`` (jax-cuda13-plugin). Nothing runs; the executables say what the GPU would
be given: memory per device, the kernels in the program.

Bundled targets are the files in ``targets/`` (``h200``, ``h100``, ``a100``), each also as
``NAMExN``: N such devices on one host (``h200x8``, an 8-GPU node), the sweep planned and
compiled for N compile-only devices with the member axis split over them; any other value is
the path of such a file, e.g. the exact text a real device gives (``device_target_config()``,
run on that machine).
"""

from __future__ import annotations

import os
import re
from typing import NamedTuple

import jax

from mhjax.config import ConfigError

TARGETS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "targets")
SUFFIX = ".textproto"


class Target(NamedTuple):
    name: str  # the bundled name or the file's path
    text: str  # GpuTargetConfig text proto
    device: str  # device_description_str
    memory_bytes: int  # device_memory_size
    backend: str = "gpu"  # what mhjax plans for (experiments' programs, attention)
    count: int = 1  # devices on the host (NAMExN), the member axis split over them


def bundled() -> list[str]:
    return sorted(f[: -len(SUFFIX)] for f in os.listdir(TARGETS_DIR) if f.endswith(SUFFIX))


MANY = re.compile(r"^(?P<name>[\w\-]+)x(?P<count>\d+)$")  # NAMExN: N devices of a bundled target


def load(name_or_path: str) -> Target:
    """A bundled target by name (NAMExN: N of them), or a target config file; ConfigError naming
    what is allowed otherwise."""
    name, count = name_or_path, 1
    many = MANY.match(name_or_path)
    if many and many.group("name") in bundled() and not os.path.isfile(name_or_path):
        name, count = many.group("name"), int(many.group("count"))
        if count < 1:
            raise ConfigError(f"--target: {name_or_path!r} needs N >= 1 devices (e.g. {name}x8)")
    path = os.path.join(TARGETS_DIR, f"{name}{SUFFIX}")
    if not os.path.isfile(path):
        path = name_or_path
    if not os.path.isfile(path):
        names = ", ".join(bundled())
        raise ConfigError(
            f"--target: must be one of {names} (NAMExN for N of them, e.g. h200x8) or a GpuTargetConfig text file; "
            f"got {name_or_path!r}"
        )
    with open(path) as f:
        text = f.read()
    device = re.search(r'device_description_str:\s*"([^"]*)"', text)
    memory = re.search(r"device_memory_size:\s*(\d+)", text)
    if "gpu_device_info" not in text or memory is None:
        raise ConfigError(
            f"--target: {path} is not a GpuTargetConfig text proto (no gpu_device_info/device_memory_size)"
        )
    return Target(name_or_path, text, device.group(1) if device else name_or_path, int(memory.group(1)), count=count)


def install_hint() -> str:
    return f'pip install "jax[cuda13]=={jax.__version__}"'


def compiler_available() -> bool:
    """Whether JAX's CUDA 13 plugin (the GPU compiler) is installed."""
    import importlib.util

    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
    except ImportError:  # no jax_plugins namespace at all
        return False


def devices(target: Target, count: int | None = None) -> list:
    """``count`` (default: the target's) compile-only devices of ``target`` (one host). Needs
    the CUDA plugin, which registers even where JAX_PLATFORMS=cpu (it then skips its runtime
    checks)."""
    from jax.experimental import topologies

    count = target.count if count is None else count
    if not compiler_available():
        raise ConfigError(f"--target: the GPU compiler is not installed; {install_hint()}")
    try:
        topology = topologies.get_topology_desc(platform="cuda", target_config=target.text, topology=f"1x1x{count}")
    except Exception as exc:  # a plugin that failed to load, or a malformed config
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--target: no compile-only {target.device} ({first}); {install_hint()}") from None
    return list(topology.devices)


def device_target_config() -> str:
    """The exact target config of this machine's first GPU (run on the machine you rent, keep
    the text as a --target file)."""
    from jax._src.lib import xla_client

    return xla_client.get_topology_for_devices(jax.devices()[:1]).target_config
