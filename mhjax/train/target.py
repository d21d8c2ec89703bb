"""Compile targets: a GPU that is not in this machine, described by its XLA target config.

``mhjax train --dry-run --target h200`` compiles a sweep for an H200 on a CPU machine: JAX
builds a compile-only device from an XLA ``GpuTargetConfig`` (protobuf text) and runs XLA's
whole GPU pipeline for it, Triton and ptxas included, with the GPU compiler that ships in
``jax[cuda13]`` (jax-cuda13-plugin). Nothing runs; the executables say what the GPU would
be given: memory per device, the kernels in the program.

Bundled targets are the files in ``targets/`` (``h200``, ``h100``, ``a100``); any other
value is the path of such a file, e.g. the exact text a real device gives
(``device_target_config()``, run on that machine).
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


def bundled() -> list[str]:
    return sorted(f[: -len(SUFFIX)] for f in os.listdir(TARGETS_DIR) if f.endswith(SUFFIX))


def load(name_or_path: str) -> Target:
    """A bundled target by name, or a target config file; ConfigError naming both otherwise."""
    path = os.path.join(TARGETS_DIR, f"{name_or_path}{SUFFIX}")
    if not os.path.isfile(path):
        path = name_or_path
    if not os.path.isfile(path):
        raise ConfigError(
            f"--target: must be one of {', '.join(bundled())} or a GpuTargetConfig text file; got {name_or_path!r}"
        )
    with open(path) as f:
        text = f.read()
    device = re.search(r'device_description_str:\s*"([^"]*)"', text)
    memory = re.search(r"device_memory_size:\s*(\d+)", text)
    if "gpu_device_info" not in text or memory is None:
        raise ConfigError(
            f"--target: {path} is not a GpuTargetConfig text proto (no gpu_device_info/device_memory_size)"
        )
    return Target(name_or_path, text, device.group(1) if device else name_or_path, int(memory.group(1)))


def install_hint() -> str:
    return f'pip install "jax[cuda13]=={jax.__version__}"'


def compiler_available() -> bool:
    """Whether JAX's CUDA 13 plugin (the GPU compiler) is installed."""
    import importlib.util

    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda13") is not None
    except ImportError:  # no jax_plugins namespace at all
        return False


def devices(target: Target, count: int = 1) -> list:
    """``count`` compile-only devices of ``target`` (one host). Needs the CUDA plugin, which
    registers even where JAX_PLATFORMS=cpu (it then skips its runtime checks)."""
    from jax.experimental import topologies

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
