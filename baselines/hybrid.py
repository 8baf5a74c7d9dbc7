"""RLinf's Hybrid (disaggregated) mode as a scheduler over ebrl's workers (README.md).

The baselines are listed in docs/README.md, "The code".

What it reproduces (RLinf v0.3, e.g. ``examples/embodiment/config/maniskill_ppo_openvla.yaml``):

- placement ``cluster.component_placement: {env: 0-3, rollout: 4-7, actor: 0-7}``: simulation
  and generation on disjoint devices, training on all of them (``rlinf/utils/placement.py``,
  ``HybridComponentPlacement``);
- ``rollout.pipeline_stage_num: 2``: each env worker splits its envs into two stages; while one
  stage simulates, the other's observations are on the rollout worker (``rlinf/workers/env/
  env_worker.py``, ``EnvWorker.interact`` over ``stage_id``; ``rlinf/workers/rollout/hf/
  huggingface_worker.py``, ``generate_one_epoch``);
- the step order of ``rlinf/runners/embodied_runner.py``, ``EmbodiedRunner.run``: training starts
  after the whole rollout, then the rollout waits for the new weights (staleness 0).

Here that is :class:`ebrl.schedulers.ebrl.EBRLScheduler` with level 1 off (no overlap, k = 0),
level 2 on with exactly two env groups, level 3 off (whole groups in lock step). The sims run in
their own processes, the generator in its own with ``threads.gen`` threads (its device share);
the learner, alone while it trains, gets every core (``train_threads``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from baselines.colocated import all_cores
from ebrl.schedulers.base import IterationReport, RunContext
from ebrl.schedulers.ebrl import EBRLScheduler

#: RLinf's rollout.pipeline_stage_num in its hybrid configurations
GROUPS = 2


def with_threads(ctx: RunContext, **threads: int) -> RunContext:
    """The same run with some of ``threads.gen`` / ``threads.train`` replaced."""
    cfg = dict(ctx.factory.cfg)
    cfg["threads"] = {**cfg["threads"], **threads}
    return dataclasses.replace(ctx, factory=dataclasses.replace(ctx.factory, cfg=cfg))


@dataclass
class HybridScheduler:
    """RLinf Hybrid: disaggregated sim and gen pipelined over 2 env groups, then training.

    Config: ``conf/scheduler/hybrid.yaml``; needs ``env_groups=2``.

    Args:
        backend: ``ray`` (one process per worker) or ``inprocess`` (threads; tests).
        sim_workers: env worker processes (RLinf's env world size); each needs >= 2 envs.
        train_threads: the learner's torch threads (None: every core; it trains alone).
        ray_address: see :class:`EBRLScheduler`.
        resources: see :class:`EBRLScheduler`.
        gen_replicas: see :class:`EBRLScheduler` (the same roles as EBRL, for a fair comparison
            at scale).
        learner_ranks: see :class:`EBRLScheduler`.
        weight_board: see :class:`EBRLScheduler`.
        gen_gpus: see :class:`EBRLScheduler`.
        learner_gpus: see :class:`EBRLScheduler`.
        learner_strategy: see :class:`EBRLScheduler` (``ddp`` or ``fsdp``).
    """

    backend: str = "ray"
    sim_workers: int = 2
    train_threads: int | None = None
    ray_address: str = "local"
    resources: dict[str, dict[str, float]] | None = None
    gen_replicas: int = 1
    learner_ranks: int = 1
    weight_board: bool = True
    gen_gpus: float = 0.0
    learner_gpus: float = 0.0
    learner_strategy: str = "ddp"

    def __post_init__(self) -> None:
        if self.train_threads is not None and self.train_threads < 1:
            raise ValueError(f"scheduler.train_threads={self.train_threads}: must be >= 1")
        self.engine = EBRLScheduler(
            backend=self.backend,
            sim_workers=self.sim_workers,
            overlap=False,
            staleness=0,
            pipeline=True,
            step_level=False,
            ray_address=self.ray_address,
            resources=self.resources,
            gen_replicas=self.gen_replicas,
            learner_ranks=self.learner_ranks,
            weight_board=self.weight_board,
            gen_gpus=self.gen_gpus,
            learner_gpus=self.learner_gpus,
            learner_strategy=self.learner_strategy,
        )

    def check(self, ctx: RunContext) -> None:
        """Refuse a run on which this schedule would be something other than Hybrid."""
        if ctx.env_groups != GROUPS:
            raise ValueError(
                f"env_groups={ctx.env_groups}: Hybrid pipelines exactly {GROUPS} env groups "
                "(RLinf rollout.pipeline_stage_num: 2); set env_groups=2"
            )
        n = int(ctx.factory.cfg["num_envs"])
        if n < GROUPS * self.sim_workers:
            raise ValueError(
                f"num_envs={n} < {GROUPS} x scheduler.sim_workers={self.sim_workers}: every env "
                f"worker needs an env in each of the {GROUPS} groups"
            )

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        self.check(ctx)
        ctx = with_threads(ctx, train=self.train_threads or all_cores())
        yield from self.engine.run(ctx)
