"""Building stages from a config, anywhere: in the driver, in a Ray actor, in a thread.

A :class:`StageFactory` is a picklable recipe (the resolved config); each worker process calls the
method for its own stage, so simulators and policies are built where they run, never shipped.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from ebrl.envs.base import EnvGroup, EnvSpec
from ebrl.policies.base import Policy, PolicySpec
from ebrl.stages.gen import GenStage
from ebrl.stages.sim import SimStage
from ebrl.stages.train import TrainStage, load_checkpoint


@dataclass(frozen=True)
class StageFactory:
    """Recipe for the stages of one run.

    Attributes:
        cfg: the resolved run config as plain containers (picklable).
        env_spec: the simulator's spec, once known (sim workers report it).
    """

    cfg: dict[str, Any]
    env_spec: EnvSpec | None = None
    #: learner checkpoint file: saved to by the learner, resumed from by learner and generator
    checkpoint: str | None = None
    checkpoint_every: int = 1
    #: folder the learner keeps weight snapshots in, every ``snapshot_every`` updates
    snapshots: str | None = None
    snapshot_every: int = 1
    #: the learner version the run (re)starts at: 0 for a fresh run, the checkpoint's version
    #: for a resumed one. Env resets and sampling noise draw from streams of their own per
    #: attempt, so a resumed run does not replay the first attempt's episodes and noise
    start_version: int = 0

    @classmethod
    def from_config(cls, cfg: DictConfig) -> StageFactory:
        return cls(cfg=OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]

    @property
    def node(self) -> DictConfig:
        return OmegaConf.create(self.cfg)

    def with_spec(self, spec: EnvSpec) -> StageFactory:
        return replace(self, env_spec=spec)

    def local_device(self) -> str:
        """Where a scheduler that runs every stage in the driver (sync, Colocated) computes the
        policy: the GPU where the run asks for one (``gpu`` other than ``cpu``; ``validate``
        refuses that on a machine without), as RLinf's Colocated puts every stage on it; else
        the CPU cores."""
        gpu = self.cfg.get("gpu") or {}
        return "cpu" if str(gpu.get("name", "cpu")) == "cpu" else "cuda"

    # -- sim ------------------------------------------------------------------------------------
    def env_partition(self, parts: int) -> list[list[int]]:
        """Global env ids split into ``parts`` contiguous blocks (one per sim worker)."""
        return [[int(i) for i in p] for p in np.array_split(np.arange(self.cfg["num_envs"]), parts)]

    #: a simulator's fault-injection settings, off in the envs the resource manager times
    #: (a probe runs in the driver: an injected exit there would end the whole run)
    FAULTS = ("fail_after_steps",)

    def make_env(self, env_id: int, probe: bool = False):
        """Env ``env_id`` of the run's simulator; ``probe``: a copy for timing, its fault
        injection off (its injected slowdowns kept: they are its costs)."""
        sim = self.node.simulator
        cls = get_class(sim._target_)
        params = inspect.signature(cls).parameters
        kwargs: dict[str, Any] = {"env_id": env_id} if "env_id" in params else {}
        if probe:
            kwargs.update({k: None for k in self.FAULTS if k in params})
        return instantiate(sim, **kwargs)

    def group(
        self, env_ids: list[int], stream: int = 0, probe: bool = False, seed: int | None = None
    ) -> Any:
        """The env group of ``env_ids`` (resets from ``seed``, default the run's, on
        ``stream``): an :class:`~ebrl.envs.base.EnvGroup` of one env per id, or, for a
        vectorised simulator (RLinf's GPU envs, BEHAVIOR), ONE instance for all of them
        (:class:`~ebrl.envs.rlinf_env.RLinfVecEnvGroup`, the same surface). ``probe``: a copy
        for timing (:meth:`make_env`)."""
        # GRPO's groups share initial states: reset them with common seeds
        reset_group = int(self.cfg["algo"]["cfg"].get("group_size", 1))
        seed = int(self.cfg["seed"]) if seed is None else int(seed)
        sim = self.cfg["simulator"]
        if sim.get("vectorized"):
            from ebrl.envs.rlinf_env import RLinfVecEnvGroup

            node = {k: v for k, v in sim.items() if k not in ("_target_", "vectorized")}
            return RLinfVecEnvGroup(
                env_ids=list(env_ids),
                seed=seed,
                reset_group_size=reset_group,
                stream=stream,
                **node,
            )
        return EnvGroup(
            [self.make_env(i, probe=probe) for i in env_ids],
            env_ids,
            seed=seed,
            reset_group_size=reset_group,
            stream=stream,
        )

    def sim(self, env_ids: list[int], incarnation: int = 0) -> SimStage:
        """The sim stage of ``env_ids``; ``incarnation`` > 0 for a replacement of a dead env
        worker (its resets draw from a stream of their own, not its predecessor's again)."""
        return SimStage(self.group(env_ids, stream=self.start_version + (incarnation << 32)))

    # -- gen / train ----------------------------------------------------------------------------
    def policy(self) -> Policy:
        """The initial policy; identical in every process (seeded from the run seed, or the
        weights of ``init_checkpoint`` where the run sets it), its std times
        ``init_std_scale``."""
        if self.env_spec is None:
            raise RuntimeError("StageFactory.policy: env spec unknown; call with_spec() first")
        spec = PolicySpec(
            obs_dim=self.env_spec.obs_dim,
            action_dim=self.env_spec.action_dim,
            chunk_size=int(self.cfg["chunk_size"]),
            layout=self.env_spec.obs_layout(),
        )
        torch.manual_seed(int(self.cfg["seed"]))
        # the spec passed as it is: Hydra would turn a dataclass argument into a config node
        policy = instantiate(self.node.policy, _partial_=True)(spec=spec)
        if self.cfg.get("init_checkpoint"):  # a fresh run from given weights (e.g. SFT's)
            from ebrl.sft.checkpoint import load_init_weights

            load_init_weights(policy, self.cfg["init_checkpoint"])
        scale_std(policy, float(self.cfg.get("init_std_scale", 1.0)))
        return policy

    def gen(self, device: str = "cpu", incarnation: int = 0) -> GenStage:
        """The generator stage; ``device``: where it acts (``cuda`` for a GPU share);
        ``incarnation`` > 0 for a replacement of a dead replica (its sampling noise draws from
        streams of its own, not its predecessor's again)."""
        policy = self.policy()
        ckpt = load_checkpoint(self.checkpoint) if self.checkpoint else None
        if ckpt is not None:  # resuming: act with the learner's last saved weights
            policy.set_weights(int(ckpt["version"]), ckpt["policy"])
        return GenStage(
            policy,
            threads=int(self.cfg["threads"]["gen"]),
            seed=int(self.cfg["seed"]),
            stream=self.start_version + (incarnation << 32),
            device=device,
        )

    def train(self, device: str = "cpu") -> TrainStage:
        """The learner stage; ``device``: where it trains (``cuda`` for a GPU share)."""
        algo = instantiate(self.node.algo, policy=self.policy(), _convert_="object")
        # on its device before the optimiser state is loaded (Adam's moments follow the params)
        algo.policy.to(device)
        ckpt = load_checkpoint(self.checkpoint) if self.checkpoint else None
        if ckpt is not None:
            algo.policy.set_weights(int(ckpt["version"]), ckpt["policy"])
            algo.optimizer.load_state_dict(ckpt["optimizer"])
            if "torch_rng" in ckpt:  # checkpoints from before it have none
                torch.set_rng_state(ckpt["torch_rng"])
            if "torch_cuda_rng" in ckpt and torch.device(device).type == "cuda":
                # a CUDA learner's minibatch permutations draw from the CUDA generator
                torch.cuda.set_rng_state(ckpt["torch_cuda_rng"], device)
        inject = self.cfg.get("inject") or {}  # configs from before the option have none
        stage = TrainStage(
            algo,
            threads=int(self.cfg["threads"]["train"]),
            checkpoint=self.checkpoint,
            every=self.checkpoint_every,
            snapshots=self.snapshots,
            snapshot_every=self.snapshot_every,
            extra_after=inject.get("train_after_updates"),
            extra_epochs=int(inject.get("train_extra_epochs", 0)),
            device=device,
        )
        if ckpt is not None:
            stage.trained_env_steps = int(ckpt.get("trained_env_steps", 0))
        return stage


def scale_std(policy: Policy, scale: float) -> None:
    """Multiply the std of ``policy``'s Gaussian by ``scale`` (its ``log_std`` parameter shifted
    by the log): ``init_std_scale``. Raises ValueError, naming the key, for a policy without one."""
    if scale == 1.0:
        return
    log_std = getattr(policy, "log_std", None)
    if not isinstance(log_std, torch.nn.Parameter):
        raise ValueError(
            f"init_std_scale={scale}: {type(policy).__name__} has no log_std parameter to "
            "scale; leave init_std_scale 1 for this policy"
        )
    with torch.no_grad():
        log_std.add_(math.log(scale))
