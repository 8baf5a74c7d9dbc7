"""RLinf's Colocated mode over N devices: N data-parallel ranks, one process each.

RLinf's placement ``{actor,env,rollout: all}`` over N GPUs puts every component on every GPU:
each GPU's worker steps its share of the envs, generates for them with its own copy of the
rollout model, and trains as one rank of the data-parallel actor (``rlinf/scheduler/placement/
placement.py``; the actor is FSDP over all N GPUs). Here each rank is a Ray actor
(:class:`ColocatedRank`, placed like the roles of EBRL's workers: ``ebrl.runtime.placement``,
rank i on GPU slot i where the run asks for GPUs) that runs
:class:`~baselines.colocated.ColocatedScheduler`'s one-process loop on num_envs/N envs, with
one difference: its learner (:class:`GatheredTrain`) trains on every rank's segment.

Per iteration, in lock step (the driver asks every rank for one iteration, then merges):

1. rollout: each rank steps its envs with its own generator (offloaded after the rollout and
   reloaded at the sync, per rank, as in one process);
2. update: the ranks all-gather their segments into the whole segment (in rank order: the env
   ids' order) and train on it as the data-parallel learner of ``ebrl.runtime.dist`` (each rank
   computes its shard of every minibatch, the gradients summed over the ranks: the update of one
   process on the union of the ranks' data, and every rank applies the same step);
3. sync: each rank reloads its own generator from its own learner rank (the weights are the
   same on every rank: each reports a checksum of them, and the driver stops a run whose ranks
   disagree).

Env steps are counted per rank (its segment's, its step-ledger file ``colocated<r>``) and summed;
episode statistics are merged over the ranks' finished episodes; the leader (rank 0) writes the
learner's checkpoints, which every rank resumes from.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines.colocated import ColocatedScheduler, all_cores
from ebrl.rollout import EpisodeStats, SegmentBuilder
from ebrl.runtime.dist import DataParallel
from ebrl.runtime.dist_group import destroy, free_port, init_group
from ebrl.runtime.placement import Placement, describe
from ebrl.runtime.placement_asks import colocated_asks
from ebrl.runtime.placement_nodes import placement_groups
from ebrl.runtime.placement_ray import SLOTS_VAR, pin_planned_gpus
from ebrl.schedulers.base import IterationReport, RunContext, StageError, Stages, UpdateBudget
from ebrl.stages.factory import StageFactory
from ebrl.stages.train import TrainStage
from ebrl.timeline import Span, Timeline
from ebrl.types import Segment
from ebrl.utilisation import ray_local_gpus

log = logging.getLogger(__name__)


def rank_name(rank: int) -> str:
    """A rank's worker name: its Ray actor's, its timeline tracks' prefix, its ledger writer's."""
    return f"colocated{rank}"


def weights_checksum(module: torch.nn.Module) -> float:
    """A sum of every parameter (float64): equal on ranks holding the same weights."""
    with torch.no_grad():
        return float(sum(p.detach().double().sum().item() for p in module.parameters()))


# --- the learner of a rank ----------------------------------------------------------------------
class GatheredTrain:
    """One rank's learner: trains on the whole segment, every rank's part gathered.

    Args:
        stage: this rank's learner stage, joined to ``dp`` (:meth:`TrainStage.join`).
        dp: the ranks' data-parallel group (``ebrl.runtime.dist``).
    """

    def __init__(self, stage: TrainStage, dp: DataParallel) -> None:
        self.stage = stage
        self.dp = dp

    @property
    def threads(self) -> int | None:
        return self.stage.threads

    @threads.setter
    def threads(self, n: int | None) -> None:
        self.stage.threads = n

    @property
    def version(self) -> int:
        return self.stage.version

    def gather(self, seg: Segment) -> Segment:
        """Every rank's segment, concatenated along the envs in rank order (a collective)."""
        if self.dp.solo:
            return seg
        parts: list[Any] = [None] * self.dp.world
        torch.distributed.all_gather_object(parts, seg, group=self.dp.group)
        return Segment.cat_envs(parts)

    def train(self, seg: Segment) -> dict[str, float]:
        return self.stage.train(self.gather(seg))

    def weights(self, changing_only: bool = False) -> tuple[int, dict[str, torch.Tensor]]:
        return self.stage.weights(changing_only)


class RankEpisodes(EpisodeStats):
    """Episode statistics a rank hands to the driver raw: ``drain`` keeps what it took (for
    :meth:`EpisodeStats.merge` over the ranks) and returns nothing of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.taken: list[dict[str, list]] = []

    def drain(self) -> dict[str, float]:
        self.taken.append(self.take())
        return {}


# --- one rank -----------------------------------------------------------------------------------
class ColocatedRank:
    """One Colocated process (a Ray actor): its envs, its generator and its learner rank.

    Args:
        rank: this rank (0: the leader, which checkpoints).
        world: N, the ranks.
        factory: the run's stage recipe.
        env_ids: this rank's envs (a contiguous block of the run's).
        env_groups: G; the rank's envs step in G groups (one sim stage each), as in one process.
        decisions_per_env: T.
        device: where its generator and learner compute (``cuda``: its planned GPU).
        threads: torch threads of each stage in its turn (None: this node's cores shared by
            its ``node_ranks`` ranks).
        offload: RLinf's ``enable_offload`` (:class:`~baselines.colocated.OffloadingGen`).
        budget: where the learner stops by itself.
        ledger: the attempt's step-ledger folder (None: nothing recorded).
    """

    def __init__(
        self,
        rank: int,
        world: int,
        factory: StageFactory,
        env_ids: list[int],
        env_groups: int,
        decisions_per_env: int,
        device: str,
        threads: int | None,
        offload: bool,
        budget: UpdateBudget,
        ledger: str | None = None,
        node_ranks: int = 1,
    ) -> None:
        pin_planned_gpus()  # before anything starts CUDA: the GPU the placement planned
        self.rank, self.world = rank, world
        self.factory = factory
        self.env_ids = [int(e) for e in env_ids]
        self.env_groups = env_groups
        self.T = decisions_per_env
        self.device = device
        self.threads = threads or max(1, all_cores() // max(1, node_ranks))
        self.offload = offload
        self.budget = budget
        self.ledger_dir = ledger
        self.dp: DataParallel | None = None
        self.sims: list = []
        self.ledger = None
        self._sent = 0

    def rendezvous(self) -> tuple[str, int]:
        """The leader's rendezvous address for the ranks' process group (its node's address)."""
        from ebrl.runtime.channel import node_ip

        host = node_ip()
        return host, free_port(host)

    def start(self, address: tuple[str, int]) -> dict[str, Any]:
        """Join the ranks' group, build the stages; returns what this process runs with. Every
        rank calls it at once (the group's rendezvous waits for all of them)."""
        self.dp = init_group(self.rank, self.world, address, device=self.device)
        factory = self.factory
        self.sims = [
            factory.sim([int(e) for e in ids])
            for ids in np.array_split(np.array(self.env_ids), self.env_groups)
        ]
        factory = factory.with_spec(self.sims[0].group.spec)
        train = factory.train(self.device)
        train.join(self.dp)
        self.train = GatheredTrain(train, self.dp)
        stages = Stages(sims=self.sims, gen=factory.gen(self.device), train=self.train)  # type: ignore[arg-type]
        self.timeline = Timeline()
        ctx = RunContext(
            factory=factory,
            decisions_per_env=self.T,
            env_groups=self.env_groups,
            timeline=self.timeline,
            budget=self.budget,
        )
        if self.ledger_dir is not None:
            from ebrl.ledger import StepLedger, writer_path

            self.ledger = StepLedger(writer_path(Path(self.ledger_dir), rank_name(self.rank)))
        builder = SegmentBuilder(stages.env_ids, self.T, self.ledger)
        self.episodes = RankEpisodes()
        one = ColocatedScheduler(threads=self.threads, offload=self.offload)
        self.loop = one._loop(stages, ctx, builder, self.episodes)
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "env_ids": self.env_ids,
            "device": self.device,
            "threads": self.threads,
            "backend": self.dp.backend,
            "backend_why": self.dp.why,
            "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
            SLOTS_VAR: os.environ.get(SLOTS_VAR),
        }

    def step(self) -> dict[str, Any]:
        """One iteration (rollout, update on every rank's data, sync), in lock step with the
        other ranks; returns its report, its episodes, its new spans and its weights' sum."""
        report = next(self.loop)
        spans = self.timeline.spans[self._sent :]
        self._sent += len(spans)
        taken, self.episodes.taken = self.episodes.taken, []
        return {
            "report": report,
            "episodes": taken,
            "spans": list(spans),
            "checksum": weights_checksum(self.train.stage.algo.policy),
            "backend": self.dp.backend if self.dp is not None else "none",
        }

    def close(self) -> None:
        """Close the envs, the ledger and the process group."""
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.close()
        for s in self.sims:
            with contextlib.suppress(Exception):
                s.close()
        if self.ledger is not None:
            self.ledger.close()
        destroy()


# --- the driver ---------------------------------------------------------------------------------
def rank_envs(factory: StageFactory, ranks: int, env_groups: int) -> list[list[int]]:
    """Each rank's envs: num_envs in ``ranks`` contiguous blocks, each of at least
    ``env_groups`` envs (a rank steps them in that many groups)."""
    n = int(factory.cfg["num_envs"])
    if n < ranks * env_groups:
        raise ValueError(
            f"scheduler.ranks={ranks} Colocated ranks of env_groups={env_groups} groups each "
            f"need num_envs >= {ranks * env_groups}, got num_envs={n}: raise num_envs, or lower "
            "scheduler.ranks (the scale point's scale.learner_ranks) or env_groups"
        )
    return factory.env_partition(ranks)


def _wait_all(refs: list) -> list:
    """Every result of ``refs``; raises as soon as one fails (a rank's error, or its death),
    without waiting for the others (they may wait for it in a collective)."""
    import ray

    pending = list(refs)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            ray.get(done)
    except ray.exceptions.RayActorError as e:
        raise StageError("colocated", f"a Colocated rank's process died: {e}") from None
    except ray.exceptions.RayTaskError as e:
        raise e.as_instanceof_cause() from None
    return ray.get(refs)


def merge(outs: list[dict[str, Any]], iteration: int) -> IterationReport:
    """One report from the ranks' reports of one iteration: env steps summed, the learner's
    metrics (the same on every rank) from the leader, episodes merged, the envs' gauges joined
    (their cumulative totals summed), and the ranks' weight sums, which must be equal."""
    reports = [o["report"] for o in outs]
    metrics: dict[str, float] = dict(reports[0].metrics)
    for key in ("sim/steps_total", "sim/step_s_total"):
        if key in metrics:
            metrics[key] = sum(float(r.metrics.get(key, 0.0)) for r in reports)
    for r in reports[1:]:
        for k, v in r.metrics.items():
            if k.startswith("sim/env"):
                metrics[k] = v
    metrics.update(EpisodeStats.merge([e for o in outs for e in o["episodes"]]))
    sums = [float(o["checksum"]) for o in outs]
    if len(set(sums)) > 1:
        raise StageError(
            "colocated",
            f"the ranks' weights differ after update {iteration} (parameter sums by rank: "
            f"{sums}); data-parallel ranks must apply the same step",
        )
    for r, s in enumerate(sums):
        metrics[f"colocated/weights_sum_rank{r}"] = s
    metrics["colocated/ranks"] = float(len(outs))
    metrics["train/dist_nccl"] = float(outs[0]["backend"] == "nccl")
    return IterationReport(
        iteration=iteration,
        env_steps=sum(int(r.env_steps) for r in reports),
        metrics=metrics,
    )


def run_ranks(sched: ColocatedScheduler, ctx: RunContext) -> Iterator[IterationReport]:
    """The driver of a Colocated run over ``sched.ranks`` processes (the module docstring)."""
    from ebrl.runtime.backend import RayBackend
    from ebrl.runtime.placement import place
    from ebrl.runtime.placement_nodes import cluster_nodes
    from ebrl.runtime.placement_ray import ray_options

    factory, world = ctx.factory, sched.ranks
    blocks = rank_envs(factory, world, ctx.env_groups)
    on_gpu = str((factory.cfg.get("gpu") or {}).get("name", "cpu")) != "cpu"
    gpus = 1.0 if on_gpu else 0.0
    device = sched.device or ("cuda" if on_gpu else "cpu")
    backend = RayBackend(sched.ray_address, num_gpus=ray_local_gpus(sched.ray_address, gpus > 0))
    handles: list = []
    try:
        group = placement_groups(factory.cfg).get("colocated")
        placed: list[Placement] = place(
            colocated_asks(world, gpus, group), cluster_nodes(), gpu_setting={"colocated": "gpu"}
        )
        table = describe(placed)
        log.info("placement:\n%s", table)
        if ctx.run_dir is not None:
            ctx.run_dir.mkdir(parents=True, exist_ok=True)
            (ctx.run_dir / "placement.txt").write_text(table + "\n")
        per_node = Counter(p.node.node_id for p in placed)
        for p in placed:
            handles.append(
                backend.spawn(
                    rank_name(p.index),
                    ColocatedRank,
                    p.index,
                    world,
                    factory,
                    blocks[p.index],
                    ctx.env_groups,
                    ctx.decisions_per_env,
                    device,
                    sched.threads,
                    sched.offload,
                    ctx.budget,
                    str(ctx.ledger) if ctx.ledger is not None else None,
                    per_node[p.node.node_id],  # the node's cores are shared by its ranks
                    options=ray_options(p, mps=False),
                )
            )
        actors = [h.actor for h in handles]
        (address,) = _wait_all([actors[0].rendezvous.remote()])
        infos = _wait_all([a.start.remote(address) for a in actors])
        for info in infos:
            log.info("Colocated rank %s", info)
        if ctx.run_dir is not None:
            with open(ctx.run_dir / "colocated_ranks.jsonl", "w") as f:
                for info in infos:
                    f.write(json.dumps(info) + "\n")
        params = {"colocated/ranks": world, "colocated/backend": infos[0]["backend"]}
        it = 0
        while True:
            outs = _wait_all([a.step.remote() for a in actors])
            for r, o in enumerate(outs):
                for s in o["spans"]:
                    ctx.timeline.add(
                        Span(s.stage, f"{rank_name(r)}/{s.track}", s.start, s.end, s.args)
                    )
            report = merge(outs, it)
            if it == 0:
                report.params = dict(params)
            yield report
            it += 1
    finally:
        import ray

        with contextlib.suppress(Exception):  # a rank stuck in a collective is killed below
            closing = [h.actor.close.remote() for h in handles]
            ray.wait(closing, num_returns=len(closing), timeout=30)
        backend.shutdown()
