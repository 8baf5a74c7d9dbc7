"""A real-RLinf job in the dry run: checked for the machine that runs it, translated, described.

``python -m ebrl.launch --dry-run <sweep>`` composes and validates each job where it is typed.
For a job on :class:`~baselines.rlinf.launch.RLinfScheduler` it also needs:

- the check of the machine that will run it: a Slurm job's node, not the machine the dry run
  runs on, whose GPUs, packages and RLinf checkout say nothing about the node (while the job's
  config is checked, :data:`~baselines.rlinf.launch.ELSEWHERE` is set; the node's GPUs come from
  the job's gpu group and launcher);
- the translation itself (:meth:`RLinfScheduler.translate`, the one the run calls), so a pair
  RLinf cannot run fails in the dry run with the reason, not on the node;
- a line per job: the GPUs RLinf gets (launcher nodes x GPUs per node), its placement, the
  actor's global batch and micro-batch, compile and CUDA graphs, and the Ray cluster of a job of
  several nodes.

``ebrl.launch`` wraps its check of a job in what the scheduler class's ``dry_run_check`` returns
(ebrl never imports baselines): here :class:`JobCheck`, a context manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from omegaconf import DictConfig, OmegaConf

from baselines.rlinf.launch import ELSEWHERE, RLinfScheduler, RLinfUnavailable
from baselines.rlinf.translate import world_sizes

TARGET = f"{RLinfScheduler.__module__}.{RLinfScheduler.__qualname__}"


def is_rlinf(job: Mapping[str, Any]) -> bool:
    """Whether ``job`` (a composed config) runs real RLinf."""
    sched = job.get("scheduler") or {}
    return str(sched.get("_target_", "")) == TARGET


def describe(job: Mapping[str, Any], on_slurm: bool) -> str:
    """Translate the RLinf job ``job`` (resolved, plain containers) as its run would; return
    what RLinf gets. Raises what the translation raises (``TranslationError``: the reason), or
    :class:`RLinfUnavailable` where the node cannot run RLinf."""
    sched = dict(job["scheduler"])
    sched.pop("_target_", None)
    lau = job.get("launcher") or {}
    gpu = job.get("gpu") or {}
    nodes, per_task = int(lau.get("nodes", 1) or 1), int(lau.get("tasks_per_node", 1) or 1)
    if on_slurm:
        if not gpu.get("device_name") or not int(lau.get("gpus_per_node", 0) or 0):
            raise RLinfUnavailable(
                f"scheduler=rlinf_{sched['mode']} runs RLinf's FSDP actor and HF rollout worker "
                f"on CUDA GPUs, but the job asks for none (gpu={gpu.get('name')}, "
                f"launcher.gpus_per_node={lau.get('gpus_per_node')}): set gpu=h100 (or a100, ...) "
                "and launcher.gpus_per_node"
            )
        if nodes > 1 and per_task != 1:
            raise RLinfUnavailable(
                f"launcher.tasks_per_node={per_task} with {nodes} nodes: RLinf counts Ray nodes "
                "as machines (cluster.num_nodes), and the job starts one Ray node per task; set "
                "launcher.tasks_per_node=1"
            )
    token = ELSEWHERE.set(on_slurm)
    try:
        scheduler = RLinfScheduler(**sched)
    finally:
        ELSEWHERE.reset(token)
    if not scheduler.gpus and on_slurm:
        raise RLinfUnavailable("launcher.gpus_per_node=0: RLinf needs the job's GPUs")
    rl = scheduler.translate(job)
    actor, rollout = rl["actor"], rl["rollout"]
    place = rl["cluster"]["component_placement"]
    actors = world_sizes(place)["actor"]
    gb, mb = int(actor["global_batch_size"]), int(actor["micro_batch_size"])
    gpus = scheduler.gpus_per_node()
    line = (
        f"RLinf {scheduler.mode}: {nodes} node(s) x {gpus} GPU(s) = {nodes * gpus} GPUs, "
        f"placement {', '.join(f'{k}: {v}' for k, v in place.items())}; "
        f"model/{rl['defaults'][1].split('/', 1)[1].split('@')[0]}: global batch {gb}, "
        f"micro-batch {mb} ({actors} actor process(es) x {gb // (mb * actors)} micro-batches "
        f"each); torch.compile {'on' if rollout['enable_torch_compile'] else 'off'}, "
        f"CUDA graphs {'on' if rollout['enable_cuda_graph'] else 'off'}"
    )
    if on_slurm and nodes * per_task > 1:
        from ebrl.runtime.slurm_cluster import describe_job

        line += f"; {describe_job(nodes, per_task, sched)}"
    return line


@dataclass
class JobCheck:
    """Around the dry run's check of one job: a real-RLinf job is checked for the node a Slurm
    job gets (not this machine) and, once the job validates, translated (:func:`describe`; its
    error leaves the block). Other jobs pass through untouched.

    Attributes:
        job: the job's composed config (without the hydra node).
        on_slurm: the job is a Slurm job (else it runs here, and is checked here).
        line: after a clean exit, what RLinf gets (None: not an RLinf job).
    """

    job: DictConfig
    on_slurm: bool
    line: str | None = None

    def __post_init__(self) -> None:
        sched = self.job.get("scheduler")
        self._rlinf = sched is not None and str(sched.get("_target_", "")) == TARGET
        self._token: Any = None

    def __enter__(self) -> JobCheck:
        if self._rlinf:
            self._token = ELSEWHERE.set(self.on_slurm)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if not self._rlinf:
            return
        ELSEWHERE.reset(self._token)
        if exc_type is None:
            resolved = OmegaConf.to_container(self.job, resolve=True)
            self.line = describe(resolved, self.on_slurm)  # type: ignore[arg-type]
