"""What a machine offers, as :func:`ebrl.config.validate` sees it.

:class:`MachineFacts` is plain data (plus two lookups), so the checks that use it stay pure and are
tested on made-up machines: a CPU laptop, an H100 node, a node without a simulator's package.
:func:`local_machine` probes the machine this process runs on; nothing else here touches it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class MachineFacts:
    """A machine as the configuration checks see it.

    Attributes:
        where: how messages name it ("this machine", "a Slurm node with gpu=h100").
        gpus: NVIDIA device names, one per visible device (empty: no NVIDIA GPU).
        cuda: torch can use those devices (False with a CPU build of torch).
        cpus: CPU cores this process may use.
        find_package: import name -> the package's folder, or None when not importable;
            None: packages unknown here (not checked, e.g. a cluster node seen from a laptop).
        path_exists: whether a file or folder exists; None: unknown (not checked).
        env: environment variables; None: unknown (not checked).
    """

    where: str = "this machine"
    gpus: tuple[str, ...] = ()
    cuda: bool = False
    cpus: int = 1
    find_package: Callable[[str], str | None] | None = None
    path_exists: Callable[[str], bool] | None = None
    env: Mapping[str, str] | None = field(default=None, hash=False)

    @staticmethod
    def packages(folders: Mapping[str, str]) -> Callable[[str], str | None]:
        """A ``find_package`` that knows exactly these packages (for tests and fake machines)."""
        return lambda name: folders.get(name)


def _package_folder(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a parent package that fails to import, or no spec
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return str(next(iter(spec.submodule_search_locations)))
    return str(Path(spec.origin).parent) if spec.origin else None


@functools.cache
def _gpus() -> tuple[tuple[str, ...], bool]:
    """(NVIDIA device names, whether torch can use them); probed once per process."""
    try:
        import torch

        if torch.cuda.is_available():
            n = torch.cuda.device_count()
            return tuple(torch.cuda.get_device_name(i) for i in range(n)), True
    except Exception:  # a broken CUDA install reads as "no usable GPU"
        pass
    try:  # a GPU torch cannot use (CPU build of torch): NVML still names it
        import pynvml

        pynvml.nvmlInit()
        try:
            n = pynvml.nvmlDeviceGetCount()
            names = []
            for i in range(n):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                names.append(name.decode() if isinstance(name, bytes) else str(name))
            return tuple(names), False
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library or no driver: the normal CPU case
        return (), False


def local_machine() -> MachineFacts:
    """The machine this process runs on (GPUs probed once; packages and paths looked up lazily)."""
    gpus, cuda = _gpus()
    return MachineFacts(
        where="this machine",
        gpus=gpus,
        cuda=cuda,
        cpus=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        find_package=_package_folder,
        path_exists=os.path.exists,
        env=os.environ,
    )
