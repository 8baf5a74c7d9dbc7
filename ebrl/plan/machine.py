"""The machine a plan is for: nodes, their GPUs, cores and NUMA domains, and the links between
them; read from the project's configs (``conf/experiment/cluster.yaml``, ``conf/axis/scale/``,
the ``gpu`` group) or given by hand."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from ebrl.runtime.placement_nodes import Node

#: the repository's config folder
CONF = Path(__file__).resolve().parents[2] / "conf"


@dataclass(frozen=True)
class MachineSpec:
    """What the plan runs on.

    Attributes:
        nodes: machines.
        gpus_per_node: GPUs of each (0: a CPU machine: generation and training on cores).
        cores_per_node: cores of each (a Slurm job's ``cpus_per_task``).
        numa_per_node: NUMA domains of each: its cores are that many pools, and its env
            workers are spread over them (a process stays on its domain's cores).
        cores_effective: the fraction of a node's cores that compute-bound processes sharing
            it really get together (1: ideal; below 1 where they slow each other down through
            caches, memory bandwidth or hardware threads; ``fit_cores`` measures it on a run).
        gpu: the GPU's name (``conf/gpu/<name>.yaml``), for the report.
        intra_node_gbps: GB/s between two GPUs of a node (all-reduce, weights).
        inter_node_gbps: GB/s between two nodes (per GPU).
    """

    nodes: int = 1
    gpus_per_node: int = 0
    cores_per_node: float = 2.0
    numa_per_node: int = 1
    cores_effective: float = 1.0
    gpu: str = "cpu"
    intra_node_gbps: float = 200.0
    inter_node_gbps: float = 25.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 0 or self.cores_per_node <= 0:
            raise ValueError(f"machine: {self}: needs nodes >= 1, gpus >= 0, cores > 0")
        if self.numa_per_node < 1 or not 0 < self.cores_effective <= 1.5:
            raise ValueError(f"machine: numa_per_node >= 1 and 0 < cores_effective <= 1.5: {self}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def ray_nodes(self) -> list[Node]:
        """The nodes as ``ebrl.runtime.placement_nodes`` sees a Ray cluster (the head first)."""
        return [
            Node(
                f"{n:08x}" + "0" * 48,
                f"10.0.0.{n + 1}",
                float(self.cores_per_node),
                float(self.gpus_per_node),
                head=n == 0,
            )
            for n in range(self.nodes)
        ]

    def cpu_pool(self, node: int, domain: int = 0) -> str:
        return f"cpu{node}" if self.numa_per_node == 1 else f"cpu{node}.{domain}"

    @staticmethod
    def gpu_pool(node: int, slot: int) -> str:
        return f"gpu{node}.{slot}"

    def pools(self) -> dict[str, float]:
        """Every pool and its capacity: a NUMA domain's effective cores, 1.0 a GPU."""
        out: dict[str, float] = {}
        per = self.cores_per_node * self.cores_effective / self.numa_per_node
        for n in range(self.nodes):
            for d in range(self.numa_per_node):
                out[self.cpu_pool(n, d)] = per
            for g in range(self.gpus_per_node):
                out[self.gpu_pool(n, g)] = 1.0
        return out

    def nominal_pools(self) -> dict[str, float]:
        """Every CPU pool's nominal cores (what one job alone gets)."""
        per = self.cores_per_node / self.numa_per_node
        return {
            self.cpu_pool(n, d): per for n in range(self.nodes) for d in range(self.numa_per_node)
        }

    def describe(self) -> str:
        gpu = f"{self.gpus_per_node} x {self.gpu}" if self.gpus_per_node else "no GPU"
        return (
            f"{self.nodes} node(s) x ({gpu}, {self.cores_per_node:g} cores"
            f"{f', {self.numa_per_node} NUMA' if self.numa_per_node > 1 else ''}"
            f"{f', {self.cores_effective:.2f} effective' if self.cores_effective != 1 else ''})"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> MachineSpec:
        known = set(MachineSpec.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"machine: unknown fields {sorted(unknown)} (known: {sorted(known)})")
        return MachineSpec(**raw)


def _yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def from_conf(name: str, **overrides: Any) -> tuple[MachineSpec, dict[str, Any]]:
    """A machine and the roles it runs from the project's configs.

    Args:
        name: ``cluster`` (``conf/experiment/cluster.yaml``: one 8-GPU node), ``scale/g<N>``
            (``conf/axis/scale/g<N>.yaml``: its nodes, GPUs, cores and roles), ``cpu`` (this
            project's 2-core machine), or a JSON file with :class:`MachineSpec`'s fields (and
            optionally ``roles``).
        overrides: fields of :class:`MachineSpec` to set.

    Returns:
        the machine, and the roles the config sets (``scale``: sim_workers, gen_replicas,
        learner_ranks, gen_gpus, learner_gpus; empty if it sets none) with ``num_envs`` when
        the config sets it.
    """
    roles: dict[str, Any] = {}
    if name == "cpu":
        spec: dict[str, Any] = {"cores_per_node": 2.0}
    elif name == "cluster" or name.startswith("scale/"):
        base = _yaml(CONF / "experiment" / "cluster.yaml")
        launcher = dict(base.get("launcher") or {})
        gpu = next(
            (
                str(d["override /gpu"])
                for d in base.get("defaults") or []
                if isinstance(d, dict) and "override /gpu" in d
            ),
            "h100",
        )
        if name.startswith("scale/"):
            path = CONF / "axis" / "scale" / f"{name.removeprefix('scale/')}.yaml"
            if not path.exists():
                have = sorted(p.stem for p in (CONF / "axis" / "scale").glob("*.yaml"))
                raise ValueError(f"machine {name!r}: no {path.name}; scale points: {have}")
            point = _yaml(path)
            launcher.update(point.get("launcher") or {})
            roles = dict(point.get("scale") or {})
            if "num_envs" in point:
                roles["num_envs"] = int(point["num_envs"])
        elif "num_envs" in base:
            roles["num_envs"] = int(base["num_envs"])
        spec = {
            "nodes": int(launcher.get("nodes", 1)),
            "gpus_per_node": int(launcher.get("gpus_per_node", 0)),
            "cores_per_node": float(launcher.get("cpus_per_task") or 1),
            "gpu": gpu,
        }
    else:
        path = Path(name)
        if not path.exists():
            raise ValueError(
                f"machine {name!r}: not cpu, cluster, scale/g<N> or a JSON file of MachineSpec"
            )
        raw = json.loads(path.read_text())
        roles = dict(raw.pop("roles", {}) or {})
        spec = raw
    spec.update(overrides)
    return MachineSpec.from_dict(spec), roles
