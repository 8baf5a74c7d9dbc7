"""RLinf's asynchronous PPO as a scheduler over ebrl's workers; see docs/README.md, "The code".

What it reproduces (RLinf v0.3, e.g. ``examples/embodiment/config/
maniskill_async_ppo_openvlaoft.yaml``, launched by ``examples/embodiment/train_async.py``):

- ``algorithm.loss_type: decoupled_actor_critic`` selects the async runner and workers:
  ``rlinf/runners/async_ppo_embodied_runner.py`` (``AsyncPPOEmbodiedRunner.run``: env and rollout
  workers run for the whole job while the actor trains, then pushes weights),
  ``rlinf/workers/rollout/hf/async_huggingface_worker.py`` and
  ``rlinf/workers/actor/async_ppo_fsdp_worker.py`` (``AsyncPPOEmbodiedFSDPActor``);
- ``algorithm.staleness_threshold`` (1 or 2 in every shipped config): the rollout worker waits
  rather than run ahead of the learner by more (``wait_if_stale``), the actor drops older data
  (``_drain_received_trajectories``);
- the loss, ``rlinf/algorithms/losses.py``, ``compute_decoupled_ppo_actor_loss``: the ratio is
  taken to the proximal policy, samples are weighted by exp(proximal - behaviour) and dropped
  above ``behave_weight_threshold`` (code default None; 2 in the ManiSkill async configs, 5 in
  some LIBERO ones), and ``clip_ratio_c`` is the dual clip (code default 3.0, 3.0 everywhere).
  ebrl's PPO has the same loss; its defaults (``behave_weight_threshold: 2.0``,
  ``dual_clip: 3.0``) are the ManiSkill values, and this scheduler refuses a run without them;
- ``rollout.pipeline_stage_num: 1`` and a fixed placement (the async workers refuse offload).

Here that is :class:`ebrl.schedulers.ebrl.EBRLScheduler` with level 1 on (k = ``staleness``),
levels 2 and 3 off. The fixed device split is the run's thread split, ``threads.gen`` for the
generator and ``threads.train`` for the learner, held for the whole run; it must fit the cores.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from baselines.colocated import all_cores
from ebrl.schedulers.base import IterationReport, RunContext
from ebrl.schedulers.ebrl import EBRLScheduler

#: the staleness thresholds RLinf's async PPO configurations use
STALENESS = (1, 2)
PPO_TARGET = "ebrl.algos.ppo.PPO"


@dataclass
class AsyncScheduler:
    """RLinf async PPO: rollout and training at once on a static split, staleness <= k.

    Config: ``conf/scheduler/async.yaml``.

    Args:
        backend: ``ray`` (one process per worker) or ``inprocess`` (threads; tests).
        sim_workers: env worker processes.
        staleness: k, RLinf's ``algorithm.staleness_threshold``: 1 or 2.
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
    staleness: int = 1
    ray_address: str = "local"
    resources: dict[str, dict[str, float]] | None = None
    gen_replicas: int = 1
    learner_ranks: int = 1
    weight_board: bool = True
    gen_gpus: float = 0.0
    learner_gpus: float = 0.0
    learner_strategy: str = "ddp"

    def __post_init__(self) -> None:
        if self.staleness not in STALENESS:
            raise ValueError(
                f"scheduler.staleness={self.staleness}: RLinf's async PPO runs with "
                f"algorithm.staleness_threshold {' or '.join(map(str, STALENESS))}"
            )
        self.engine = EBRLScheduler(
            backend=self.backend,
            sim_workers=self.sim_workers,
            overlap=True,
            staleness=self.staleness,
            pipeline=False,
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
        """Refuse a run that would not be RLinf's async PPO: its loss, its fixed split."""
        cfg = ctx.factory.cfg
        algo = cfg["algo"]
        if algo["_target_"] != PPO_TARGET:
            raise ValueError(
                f"algo={algo['_target_']}: RLinf's async runner trains PPO only "
                "(loss_type: decoupled_actor_critic); use algo=ppo"
            )
        ppo = algo["cfg"]
        for key, rlinf in (("behave_weight_threshold", "2"), ("dual_clip", "clip_ratio_c 3.0")):
            if ppo.get(key) is None:
                raise ValueError(
                    f"algo.cfg.{key}=null: RLinf's decoupled_actor_critic loss uses it "
                    f"({rlinf} in its ManiSkill async configs)"
                )
        gen, train = int(cfg["threads"]["gen"]), int(cfg["threads"]["train"])
        if gen + train > all_cores():
            raise ValueError(
                f"threads.gen={gen} + threads.train={train} > {all_cores()} cores: the async "
                "baseline runs on a fixed split of the cores; lower one of them"
            )

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        self.check(ctx)
        yield from self.engine.run(ctx)
