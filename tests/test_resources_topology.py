"""Topology discovery (sysfs, psutil, NVML) on fake trees and a fake NVML, and the fake builders."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from ebrl.resources import topology as topo_mod
from ebrl.resources.topology import (
    Core,
    Topology,
    discover,
    discover_cores,
    discover_gpus,
    fake_topology,
    parse_cpulist,
    sms_from_name,
    sysfs_bus_id,
)


def test_parse_cpulist():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist("5") == [5]
    assert parse_cpulist("") == []


def test_sysfs_bus_id_matches_sysfs_naming():
    assert sysfs_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert sysfs_bus_id("00000001:C1:00.0") == "0001:c1:00.0"


def test_sms_from_name_prefers_the_longest_match():
    assert sms_from_name("NVIDIA H100 PCIe") == 114
    assert sms_from_name("NVIDIA H100 80GB HBM3") == 132
    assert sms_from_name("NVIDIA A10G") == 80
    assert sms_from_name("Some Future GPU") == 0


def test_discover_this_machine():
    t = discover()
    assert set(t.core_ids) == os.sched_getaffinity(0)
    assert all(c.id in c.siblings for c in t.cores)
    # no GPU / no NVML library is normal: the topology simply has none
    assert all(g.sms >= 0 and g.index >= 0 for g in t.gpus)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> Path:
    """Two NUMA nodes of four logical CPUs, SMT pairs (0,2), (1,3), (4,6), (5,7); one GPU's PCI
    slot on node 1 and one whose slot has no NUMA information."""
    root = tmp_path / "sys"
    _write(root / "devices/system/node/node0/cpulist", "0-3\n")
    _write(root / "devices/system/node/node1/cpulist", "4-7\n")
    for a, b in [(0, 2), (1, 3), (4, 6), (5, 7)]:
        for c in (a, b):
            _write(root / f"devices/system/cpu/cpu{c}/topology/thread_siblings_list", f"{a},{b}\n")
    _write(root / "bus/pci/devices/0000:3b:00.0/numa_node", "1\n")
    _write(root / "bus/pci/devices/0000:5e:00.0/numa_node", "-1\n")
    return root


def test_discover_cores_reads_numa_and_siblings(fake_sysfs: Path):
    cores = discover_cores(fake_sysfs, allowed=[0, 1, 2, 5, 6])
    assert [c.id for c in cores] == [0, 1, 2, 5, 6]
    by_id = {c.id: c for c in cores}
    assert by_id[0].numa == 0 and by_id[6].numa == 1
    assert by_id[0].siblings == (0, 2) and by_id[5].siblings == (5, 7)


def test_discover_cores_without_numa_dirs(tmp_path: Path):
    cores = discover_cores(tmp_path, allowed=[0, 1])
    assert cores == [Core(0, 0, (0,)), Core(1, 0, (1,))]


class FakeNVMLError(Exception):
    pass


class FakeNVML:
    """Two GPUs: 0 an H100 whose driver does not report SMs for a whole GPU (table fallback),
    on a slot on NUMA node 1; 1 an A100 in MIG mode with two instances and an empty slot."""

    NVMLError = FakeNVMLError

    def __init__(self, init_error: Exception | None = None) -> None:
        self.init_error = init_error
        self.shutdown_called = False

    def nvmlInit(self):
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self):
        self.shutdown_called = True

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return ("gpu", i)

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H100 80GB HBM3" if h[1] == 0 else "NVIDIA A100-SXM4-40GB"

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h[1]}" if h[0] == "gpu" else f"MIG-{h[1]}-{h[2]}"

    def nvmlDeviceGetMigMode(self, h):
        return [1, 1] if h[1] == 1 else [0, 0]

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0) if h[1] == 0 else (8, 0)

    def nvmlDeviceGetAttributes(self, h):
        if h[0] == "gpu":
            raise FakeNVMLError("Not Supported")
        sms, mem = {0: (42, 20_000), 1: (14, 5_000)}[h[2]]
        return SimpleNamespace(multiprocessorCount=sms, memorySizeMB=mem)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=80 * 2**30 if h[1] == 0 else 40 * 2**30)

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=b"00000000:3B:00.0" if h[1] == 0 else b"00000000:5E:00.0")

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, i):
        if i == 2:
            raise FakeNVMLError("Not Found")
        return ("mig", h[1], i)

    def nvmlDeviceGetGpuInstanceId(self, h):
        return 10 + h[2]

    def nvmlDeviceGetComputeInstanceId(self, h):
        return 0


def test_discover_gpus_from_fake_nvml(fake_sysfs: Path, monkeypatch):
    monkeypatch.setattr(topo_mod.shutil, "which", lambda name: f"/usr/bin/{name}")
    nvml = FakeNVML()
    gpus = discover_gpus(nvml, sysfs=fake_sysfs)
    assert nvml.shutdown_called
    h100, a100 = gpus
    assert (h100.name, h100.sms, h100.numa, h100.uuid) == ("NVIDIA H100 80GB HBM3", 132, 1, "GPU-0")
    assert h100.mps_supported and not h100.mig_enabled and h100.mig_instances == ()
    assert a100.sms == 108  # from the name table
    assert a100.numa is None  # the slot says -1
    assert a100.mig_enabled
    assert [(m.uuid, m.sms, m.memory_bytes) for m in a100.mig_instances] == [
        ("MIG-1-0", 42, 20_000 * 2**20),
        ("MIG-1-1", 14, 5_000 * 2**20),
    ]
    assert a100.mig_instances[1].gpu_instance == 11


def test_no_mps_binary_means_no_mps(fake_sysfs: Path, monkeypatch):
    monkeypatch.setattr(topo_mod.shutil, "which", lambda name: None)
    assert not any(g.mps_supported for g in discover_gpus(FakeNVML(), sysfs=fake_sysfs))


def test_nvml_library_missing_means_no_gpus():
    err = FakeNVMLError("NVML Shared Library Not Found")
    assert discover_gpus(FakeNVML(init_error=err)) == []


def test_real_pynvml_without_a_driver_gives_no_gpus():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        assert discover_gpus(pynvml) == []
    else:  # a machine with a driver
        pynvml.nvmlShutdown()
        assert len(discover_gpus(pynvml)) >= 1


def test_fake_topology_shape():
    t = fake_topology()
    assert len(t.cores) == 64 and t.numa_nodes == (0, 1)
    assert len(t.cores_on(0)) == 32
    assert [g.numa for g in t.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert all(g.mps_supported and not g.mig_enabled for g in t.gpus)


def test_fake_topology_smt_siblings_are_symmetric_and_node_local():
    t = fake_topology(numa_nodes=2, cores_per_node=8, smt=True, gpus=0)
    for c in t.cores:
        assert len(c.siblings) == 2
        other = next(s for s in c.siblings if s != c.id)
        assert t.core(other).siblings == c.siblings
        assert t.core(other).numa == c.numa


def test_fake_topology_mig():
    t = fake_topology(gpus=2, mig=True)
    for g in t.gpus:
        assert g.mig_enabled
        assert sum(m.sms for m in g.mig_instances) <= g.sms
        assert len({m.uuid for m in g.mig_instances}) == len(g.mig_instances)


def test_topology_round_trip_and_describe():
    t = fake_topology(numa_nodes=2, cores_per_node=4, smt=True, gpus=2, mig=True)
    assert Topology.from_dict(t.to_dict()) == t
    assert "MIG" in t.describe() and "SMT" in t.describe()


def test_duplicate_core_ids_rejected():
    with pytest.raises(ValueError, match="duplicate"):
        Topology((Core(0, 0), Core(0, 1)))
