"""What the machine has: CPU cores (with NUMA node and SMT siblings) and GPUs (SMs, memory, MIG).

:func:`discover` reads it from sysfs, psutil and NVML; everything else in ``ebrl.resources`` works
on the plain dataclasses below, so plans and allocations are tested on fake topologies
(:func:`fake_topology`: several NUMA nodes, eight GPUs, MIG) that no test machine has.

A machine without a GPU, or without the NVML library, is normal: it has ``gpus=()``.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

#: SMs by product name, for drivers whose NVML cannot report the multiprocessor count of a whole
#: (non-MIG) GPU. Matched as a substring of the NVML name, longest key first.
SMS_BY_NAME: dict[str, int] = {
    "GH200": 132,
    "H200": 132,
    "H100 PCIe": 114,
    "H100": 132,
    "H800": 132,
    "B200": 148,
    "A100": 108,
    "A800": 108,
    "A30": 56,
    "A10G": 80,
    "A10": 72,
    "L40S": 142,
    "L40": 142,
    "L4": 58,
    "V100": 80,
    "T4": 40,
    "RTX 6000 Ada": 142,
    "RTX A6000": 84,
    "RTX 4090": 128,
    "RTX 3090": 82,
}

#: MPS needs Volta (compute capability 7.0) or newer
MPS_MIN_CC = (7, 0)


@dataclass(frozen=True)
class Core:
    """One logical CPU.

    Attributes:
        id: the kernel's CPU number (what ``os.sched_setaffinity`` takes).
        numa: its NUMA node.
        siblings: logical CPUs sharing its physical core, itself included (SMT threads).
    """

    id: int
    numa: int
    siblings: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "siblings", tuple(sorted(set(self.siblings) | {self.id})))


@dataclass(frozen=True)
class MigInstance:
    """One MIG device (a GPU instance with its compute instance).

    Attributes:
        uuid: ``MIG-...``, what ``CUDA_VISIBLE_DEVICES`` takes to select it.
        sms: its streaming multiprocessors.
        memory_bytes: its memory.
        gpu_instance: NVML GPU instance id (None when unknown).
        compute_instance: NVML compute instance id (None when unknown).
    """

    uuid: str
    sms: int
    memory_bytes: int
    gpu_instance: int | None = None
    compute_instance: int | None = None


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML enumerates it (PCI bus order).

    Attributes:
        index: NVML index.
        name: product name, e.g. ``NVIDIA H100 80GB HBM3``.
        sms: streaming multiprocessors (0 when unknown).
        memory_bytes: total memory.
        numa: NUMA node of its PCI slot (None when the platform does not say).
        mig_enabled: MIG mode is on (processes can then only use its MIG instances).
        mig_instances: the MIG devices currently configured on it.
        mps_supported: an MPS SM quota can be applied (Volta or newer and the MPS control
            binary present).
        uuid: ``GPU-...`` (empty when unknown); stable across CUDA's and NVML's orderings.
    """

    index: int
    name: str
    sms: int
    memory_bytes: int
    numa: int | None
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    mps_supported: bool = False
    uuid: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "mig_instances", tuple(self.mig_instances))


@dataclass(frozen=True)
class Topology:
    """The cores this process may use and the GPUs it can see.

    Attributes:
        cores: allowed logical CPUs, by id.
        gpus: GPUs, by NVML index.
    """

    cores: tuple[Core, ...]
    gpus: tuple[Gpu, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "cores", tuple(sorted(self.cores, key=lambda c: c.id)))
        object.__setattr__(self, "gpus", tuple(sorted(self.gpus, key=lambda g: g.index)))
        ids = [c.id for c in self.cores]
        if len(set(ids)) != len(ids):
            raise ValueError(f"Topology: duplicate core ids in {ids}")

    @property
    def core_ids(self) -> tuple[int, ...]:
        return tuple(c.id for c in self.cores)

    @property
    def numa_nodes(self) -> tuple[int, ...]:
        return tuple(sorted({c.numa for c in self.cores}))

    def cores_on(self, numa: int) -> tuple[int, ...]:
        """Core ids on one NUMA node."""
        return tuple(c.id for c in self.cores if c.numa == numa)

    def core(self, core_id: int) -> Core:
        for c in self.cores:
            if c.id == core_id:
                return c
        raise KeyError(f"core {core_id} is not in this topology ({self.core_ids})")

    def gpu(self, index: int) -> Gpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(f"GPU {index} is not in this topology ({[g.index for g in self.gpus]})")

    def describe(self) -> str:
        """One line for logs and result provenance."""
        nodes = ", ".join(f"node{n}: {len(self.cores_on(n))}" for n in self.numa_nodes)
        smt = any(len(c.siblings) > 1 for c in self.cores)
        gpus = "; ".join(
            f"{g.index}: {g.name} {g.sms} SMs numa={g.numa}"
            + (f" MIG x{len(g.mig_instances)}" if g.mig_enabled else "")
            + (" MPS" if g.mps_supported else "")
            for g in self.gpus
        )
        return f"{len(self.cores)} cores ({nodes}{', SMT' if smt else ''}); GPUs: [{gpus}]"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Topology:
        cores = [Core(c["id"], c["numa"], tuple(c["siblings"])) for c in d["cores"]]
        gpus = [
            Gpu(**{**g, "mig_instances": [MigInstance(**m) for m in g["mig_instances"]]})
            for g in d["gpus"]
        ]
        return cls(tuple(cores), tuple(gpus))


# --- discovery ---------------------------------------------------------------------------------
def parse_cpulist(text: str) -> list[int]:
    """Parse the kernel's CPU list format (``0-3,8,10-11``); empty text gives ``[]``."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def _allowed_cores() -> list[int]:
    # psutil and os agree on Linux; psutil also covers platforms without sched_getaffinity
    try:
        import psutil

        return sorted(psutil.Process().cpu_affinity())
    except (ImportError, AttributeError):
        return sorted(os.sched_getaffinity(0))


def discover_cores(sysfs: Path = Path("/sys"), allowed: Iterable[int] | None = None) -> list[Core]:
    """Allowed logical CPUs with NUMA node and SMT siblings, from sysfs.

    Args:
        sysfs: sysfs root (a fake tree in tests).
        allowed: CPU ids this process may run on (default: its affinity mask, via psutil).
    """
    ids = sorted(allowed) if allowed is not None else _allowed_cores()
    numa_of: dict[int, int] = {}
    for node_dir in sorted((sysfs / "devices/system/node").glob("node[0-9]*")):
        cpulist = node_dir / "cpulist"
        if cpulist.exists():
            node = int(node_dir.name.removeprefix("node"))
            for cpu in parse_cpulist(cpulist.read_text()):
                numa_of[cpu] = node
    cores = []
    for cpu in ids:
        sib_file = sysfs / f"devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"
        siblings = parse_cpulist(sib_file.read_text()) if sib_file.exists() else [cpu]
        # a kernel without NUMA support has no node directories: everything is node 0
        cores.append(Core(cpu, numa_of.get(cpu, 0), tuple(siblings)))
    return cores


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` as sysfs names it: ``0000:3b:00.0``."""
    domain, rest = nvml_bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _gpu_numa(nvml: Any, handle: Any, sysfs: Path) -> int | None:
    try:
        bus = sysfs_bus_id(_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        node = int((sysfs / "bus/pci/devices" / bus / "numa_node").read_text().strip())
    except (OSError, ValueError, nvml.NVMLError):
        return None
    return node if node >= 0 else None  # -1: the platform does not say


def sms_from_name(name: str) -> int:
    """SM count of a product by name (0 when unknown)."""
    for key in sorted(SMS_BY_NAME, key=len, reverse=True):
        if key in name:
            return SMS_BY_NAME[key]
    return 0


def _gpu_sms(nvml: Any, handle: Any, name: str) -> int:
    try:
        sms = int(nvml.nvmlDeviceGetAttributes(handle).multiprocessorCount)
        if sms > 0:
            return sms
    except (nvml.NVMLError, AttributeError):
        pass  # many drivers answer only for MIG devices: fall back to the table
    return sms_from_name(name)


def _mig_instances(nvml: Any, handle: Any) -> list[MigInstance]:
    out = []
    for i in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError:
            continue  # an empty slot
        attrs = nvml.nvmlDeviceGetAttributes(mig)
        out.append(
            MigInstance(
                uuid=_text(nvml.nvmlDeviceGetUUID(mig)),
                sms=int(attrs.multiprocessorCount),
                memory_bytes=int(attrs.memorySizeMB) * 2**20,
                gpu_instance=int(nvml.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance=int(nvml.nvmlDeviceGetComputeInstanceId(mig)),
            )
        )
    return out


def discover_gpus(
    nvml: ModuleType | Any | None = None,
    sysfs: Path = Path("/sys"),
    mps_control: str = "nvidia-cuda-mps-control",
) -> list[Gpu]:
    """GPUs from NVML; ``[]`` when there is no NVML library or no GPU.

    Args:
        nvml: the ``pynvml`` module (a fake in tests); imported when None.
        sysfs: sysfs root, for each GPU's NUMA node.
        mps_control: the MPS control binary whose presence makes MPS usable.
    """
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError:
            log.info("no GPUs: nvidia-ml-py (pynvml) is not installed")
            return []
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as e:  # NVMLError_LibraryNotFound on machines without a driver
        log.info("no GPUs: NVML unavailable (%s)", e)
        return []
    has_mps_binary = shutil.which(mps_control) is not None
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(index)
            name = _text(nvml.nvmlDeviceGetName(h))
            try:
                mig_on = nvml.nvmlDeviceGetMigMode(h)[0] == 1
            except nvml.NVMLError:  # not a MIG-capable GPU
                mig_on = False
            try:
                cc = tuple(nvml.nvmlDeviceGetCudaComputeCapability(h))
            except nvml.NVMLError:
                cc = (0, 0)
            gpus.append(
                Gpu(
                    index=index,
                    name=name,
                    sms=_gpu_sms(nvml, h, name),
                    memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).total),
                    numa=_gpu_numa(nvml, h, sysfs),
                    mig_enabled=mig_on,
                    mig_instances=tuple(_mig_instances(nvml, h)) if mig_on else (),
                    mps_supported=has_mps_binary and cc >= MPS_MIN_CC,
                    uuid=_text(nvml.nvmlDeviceGetUUID(h)),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def discover(
    sysfs: Path = Path("/sys"),
    nvml: ModuleType | Any | None = None,
    allowed: Iterable[int] | None = None,
) -> Topology:
    """This machine's topology: allowed cores (sysfs + psutil) and GPUs (NVML).

    Args:
        sysfs: sysfs root (a fake tree in tests).
        nvml: the ``pynvml`` module or a fake; imported when None.
        allowed: CPU ids to consider (default: this process's affinity mask).
    """
    return Topology(tuple(discover_cores(sysfs, allowed)), tuple(discover_gpus(nvml, sysfs=sysfs)))


# --- fakes for tests ---------------------------------------------------------------------------
#: (sms, memory GiB) of the MIG instances of a fake H100 split as 3g + 2g + 1g + 1g (7 slices)
FAKE_MIG_LAYOUT: tuple[tuple[int, int], ...] = ((60, 40), (32, 20), (16, 10), (16, 10))


def fake_topology(
    numa_nodes: int = 2,
    cores_per_node: int = 32,
    smt: bool = False,
    gpus: int = 8,
    mig: bool = False,
    mps: bool = True,
    sms: int = 132,
    mig_layout: Sequence[tuple[int, int]] = FAKE_MIG_LAYOUT,
) -> Topology:
    """A made-up machine shaped like a GPU server (H100s spread evenly over NUMA nodes).

    Args:
        numa_nodes: NUMA nodes.
        cores_per_node: logical CPUs per node; with ``smt`` they pair up as siblings, like Linux
            numbers them within a node (``j`` and ``j + cores_per_node / 2``).
        smt: two hardware threads per physical core.
        gpus: GPUs; GPU ``i`` sits on node ``i * numa_nodes // gpus``.
        mig: every GPU is in MIG mode with the instances of ``mig_layout``.
        mps: MPS usable on the GPUs.
        sms: SMs per GPU.
        mig_layout: ``(sms, memory GiB)`` of each MIG instance.
    """
    if smt and cores_per_node % 2:
        raise ValueError("fake_topology: smt needs an even cores_per_node")
    cores = []
    for n in range(numa_nodes):
        base = n * cores_per_node
        half = cores_per_node // 2
        for j in range(cores_per_node):
            cid = base + j
            sib = (cid, base + (j + half) % cores_per_node) if smt else (cid,)
            cores.append(Core(cid, n, sib))
    out = []
    for i in range(gpus):
        instances = (
            tuple(
                MigInstance(f"MIG-fake-{i}-{k}", s, mem * 2**30, k, 0)
                for k, (s, mem) in enumerate(mig_layout)
            )
            if mig
            else ()
        )
        out.append(
            Gpu(
                index=i,
                name="NVIDIA H100 80GB HBM3",
                sms=sms,
                memory_bytes=80 * 2**30,
                numa=i * numa_nodes // gpus if gpus else 0,
                mig_enabled=mig,
                mig_instances=instances,
                mps_supported=mps,
                uuid=f"GPU-fake-{i}",
            )
        )
    return Topology(tuple(cores), tuple(out))
