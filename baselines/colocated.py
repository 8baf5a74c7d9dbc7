"""RLinf's Colocated mode as a scheduler over ebrl's stages; see docs/README.md, "The code".

What it reproduces (RLinf v0.3):

- placement ``cluster.component_placement: {actor,env,rollout: all}``: every component on every
  device, taking turns (``rlinf/scheduler/placement/placement.py``, ``ComponentPlacement``);
- ``rollout.pipeline_stage_num: 1``: all of a worker's envs step together, one env worker per
  device (``rlinf/workers/env/env_worker.py``, ``EnvWorker.interact``);
- ``actor.enable_offload / rollout.enable_offload: True``: the rollout model leaves the device
  after generating (``MultiStepRolloutWorker.generate`` -> ``offload_model``) and the weights are
  synchronised from the actor at the start of every step (``EmbodiedRunner.run``, timer
  ``sync_weights`` -> ``update_rollout_weights``), in ``rlinf/workers/rollout/hf/
  huggingface_worker.py`` and ``rlinf/runners/embodied_runner.py``;
- the step order of ``EmbodiedRunner.run``: sync weights, rollout (env and rollout in lock step),
  advantages, actor training; nothing overlaps.

On CPU the device is the set of cores: generation and training each get every thread during their
turn (``threads``), and "offload" drops the generator's weights after the rollout (its memory is
freed) so that they are reloaded from the learner before the next one. The drop is an ``offload``
span nested in the rollout's last ``gen`` span (RLinf's ``rollout/generate`` timer includes its
``offload_model``); the reload falls inside the ``sync`` span. The learner's own offload has no CPU
analogue (host memory is the device memory), so it is not reproduced.

The loop is :class:`ebrl.schedulers.sync.SyncScheduler`'s, unchanged: this class only gives its
stages all threads and puts an offloading wrapper around the generator.

Over N devices (``ranks`` >= 2; ``conf/scheduler/colocated.yaml`` takes it from the scale point,
one rank per GPU) RLinf's placement ``all`` puts every component on every device: N processes
(``baselines/colocated_ranks.py``), each with num_envs/N of the envs, a generator of its own
and a data-parallel learner rank, running this same loop in lock step; the update trains on
every rank's rollout with the gradients summed over the ranks (``ebrl.runtime.dist``), so every
rank ends each update with the same weights. ``ranks=1`` is the one-process path above.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ebrl.policies.base import Policy
from ebrl.schedulers.base import IterationReport, RunContext, Stages
from ebrl.schedulers.sync import SyncScheduler
from ebrl.stages import GenStage
from ebrl.timeline import Timeline
from ebrl.types import ActionChunk, Observation


def all_cores() -> int:
    """Cores this process may run on: the CPU analogue of "all devices"."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --- offload ----------------------------------------------------------------------------------
@dataclass
class Parked:
    """What survives a policy's offload: where it lived and the buffers no state dict carries."""

    device: torch.device
    # non-persistent buffers (e.g. an attention mask) are not in the learner's state dict
    buffers: dict[str, torch.Tensor]


def offload(policy: Policy) -> Parked:
    """Drop the policy's weights: its tensors move to the ``meta`` device, their memory is freed."""
    device = next(policy.parameters()).device
    persistent = set(policy.state_dict())
    keep = {n: b.clone() for n, b in policy.named_buffers() if n not in persistent}
    policy.to("meta")
    return Parked(device=device, buffers=keep)


def reload(policy: Policy, parked: Parked, version: int, weights: dict[str, torch.Tensor]) -> None:
    """Undo :func:`offload` with the learner's weights: allocate, fill, stamp the version."""
    policy.to_empty(device=parked.device)
    for name, buf in parked.buffers.items():
        owner, _, leaf = name.rpartition(".")
        setattr(policy.get_submodule(owner), leaf, buf.to(parked.device))
    # set_weights, not GenStage.load: load skips a version it already holds, but the memory that
    # held it is gone
    policy.set_weights(version, weights)


class OffloadingGen:
    """A :class:`GenStage` whose weights are dropped after each rollout and reloaded by ``load``.

    Args:
        gen: the generator stage.
        timeline: where the ``offload`` spans go.
        decisions_per_env: T; the T-th ``generate`` of an iteration ends its rollout.
    """

    def __init__(self, gen: GenStage, timeline: Timeline, decisions_per_env: int) -> None:
        self.gen = gen
        self.timeline = timeline
        self.decisions_per_env = decisions_per_env
        self.calls = 0
        self.parked: Parked | None = None

    @property
    def version(self) -> int:
        return self.gen.version

    def generate(self, batch: Observation) -> ActionChunk:
        if self.parked is not None:
            raise RuntimeError("the generator's weights are offloaded: load() them first")
        chunk = self.gen.generate(batch)
        self.calls += 1
        if self.calls % self.decisions_per_env == 0:
            # RLinf offloads when its rollout worker has acted for the last time this step
            with self.timeline.span("offload", "gen"):
                self.parked = offload(self.gen.policy)
        return chunk

    def load(self, version: int, weights: dict[str, torch.Tensor]) -> None:
        if self.parked is None:
            self.gen.load(version, weights)
            return
        reload(self.gen.policy, self.parked, version, weights)
        self.parked = None


# --- the scheduler ----------------------------------------------------------------------------
@dataclass
class ColocatedScheduler(SyncScheduler):
    """RLinf Colocated: every stage on all resources, strictly in turn, weights reloaded per step.

    Config: ``conf/scheduler/colocated.yaml``. Staleness is 0 by construction.

    Args:
        threads: torch threads generation and training each get during their turn (None: every
            core this process may use).
        offload: drop the generator's weights after each rollout and reload them from the
            learner (RLinf's ``enable_offload``); off, the weights are only synchronised.
        ranks: processes, one per device (RLinf's placement over N GPUs): each holds
            num_envs/ranks envs, a generator and a data-parallel learner rank (1: every
            stage in this process, as before).
        device: where the ranks compute (ranks >= 2): null, the run's device (a GPU of its own
            per rank where gpu is not cpu); ``cpu``: on the cores (a dry run of a GPU
            configuration).
        ray_address: the Ray cluster the ranks start on (ranks >= 2): ``local`` starts a
            private one; ``auto`` joins a running cluster.
    """

    threads: int | None = None
    offload: bool = True
    ranks: int = 1
    device: str | None = None
    ray_address: str = "local"

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"scheduler.threads={self.threads}: must be >= 1 (or null: all)")
        if self.ranks < 1:
            raise ValueError(
                f"scheduler.ranks={self.ranks}: must be >= 1 (one Colocated process per device)"
            )
        if self.device not in (None, "cuda", "cpu"):
            raise ValueError(
                f"scheduler.device={self.device!r}: null (the run's device), 'cuda' or 'cpu'"
            )
        if self.device is not None and self.ranks == 1:
            raise ValueError(
                f"scheduler.device={self.device} places the ranks of a Colocated run over "
                "several devices, and scheduler.ranks=1 runs every stage in this process on the "
                "run's device: unset scheduler.device (gpu=cpu computes on the cores), or set "
                "scheduler.ranks >= 2 (+axis/scale=g2 ...)"
            )

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        if self.ranks == 1:
            yield from super().run(ctx)
            return
        from baselines.colocated_ranks import run_ranks  # Ray is imported only where used

        yield from run_ranks(self, ctx)

    def _loop(self, st: Stages, ctx, builder, episodes) -> Iterator[IterationReport]:
        n = self.threads or all_cores()
        st.gen.threads = n
        st.train.threads = n
        gen = OffloadingGen(st.gen, ctx.timeline, ctx.decisions_per_env) if self.offload else st.gen
        yield from super()._loop(
            Stages(sims=st.sims, gen=gen, train=st.train), ctx, builder, episodes
        )
