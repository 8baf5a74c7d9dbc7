"""Models are built where their role computes, and nothing lands on a GPU a role was not given.

RLinf 0.3's ``get_model`` moves the model it built to the accelerator whenever one is visible,
unless the config says ``load_to_device: False``. ebrl's roles are given their device (a Ray
actor with no GPU still sees every GPU of its node: Ray leaves ``CUDA_VISIBLE_DEVICES`` alone
for it), so ebrl builds every RLinf model on the CPU and the role moves it to its own device.

Run on the CPU with fakes: RLinf's ``get_model`` (:func:`get_model`, RLinf's decision to move
a model, recorded instead of done) and a visible CUDA (``torch.cuda.is_available`` patched).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ebrl.policies.base import Evaluation, Policy, PolicySpec
from ebrl.stages.factory import StageFactory
from ebrl.types import ActionChunk

from . import rlinf_fakes
from .conftest import TINY, make_cfg

#: every model :func:`get_model` built: (its config, the device RLinf would have moved it to)
BUILT: list[tuple[dict[str, Any], str | None]] = []


def get_model(cfg: Any) -> torch.nn.Module:
    """RLinf 0.3's ``rlinf.models.get_model`` around the CPU fake MLP: after building, it
    moves the model to the accelerator when one is visible and ``cfg.load_to_device`` is not
    False. The move is recorded (this machine has no CUDA to move to)."""
    from omegaconf import OmegaConf

    model = rlinf_fakes.get_model(OmegaConf.create({**cfg, "model_type": "fake_mlp"}))
    to = "cuda" if torch.cuda.is_available() and cfg.get("load_to_device", True) else None
    BUILT.append((OmegaConf.to_container(cfg, resolve=True), to))
    return model


REGISTRY = f"{__name__}.get_model"
#: the tiny test run with RLinf's MLP built by the fake registry
RUN = [
    *(o for o in TINY if not o.startswith("policy.")),
    "policy=rlinf_mlp",
    f"policy.registry={REGISTRY}",
]


@pytest.fixture
def cuda_visible(monkeypatch):
    """A node whose GPUs this process sees (as a Ray actor with no GPU does)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    BUILT.clear()
    yield
    BUILT.clear()


def factory() -> StageFactory:
    from ebrl.envs.fake import CountingEnv

    return StageFactory.from_config(make_cfg(RUN)).with_spec(CountingEnv(env_id=0).spec)


def test_rlinf_models_are_built_on_the_cpu_even_where_cuda_is_visible(cuda_visible):
    """RLinfPolicy tells RLinf's builder not to move the model (``load_to_device: False``)."""
    policy = factory().policy()
    (cfg, moved_to) = BUILT[-1]
    assert cfg["load_to_device"] is False
    assert moved_to is None
    assert {p.device.type for p in policy.parameters()} == {"cpu"}


def test_a_cpu_roles_generator_and_learner_never_reach_a_gpu(cuda_visible):
    """The generator and the learner of a role given the CPU (no GPU share) build without
    RLinf's move and keep the model on the CPU, though CUDA is visible."""
    f = factory()
    gen, train = f.gen(device="cpu"), f.train(device="cpu")
    assert [moved for _, moved in BUILT] == [None, None]
    for stage in (gen, train):
        policy = getattr(stage, "policy", None) or stage.algo.policy
        assert {p.device.type for p in policy.parameters()} == {"cpu"}


def test_the_shape_searchs_two_copies_stay_on_the_cpu_in_the_driver(cuda_visible):
    """EBRL's shape search builds a generator copy and a learner copy in the driver (no GPU
    share): neither may land on a GPU it was not given (before, both sat on GPU 0)."""
    from ebrl.schedulers.ebrl.control import shape_probes

    probes = shape_probes(factory(), sim_envs=2, decisions_per_env=4)
    try:
        probes.gen_call(2)
        probes.train_update()
    finally:
        probes.close()
    assert len(BUILT) == 2, BUILT
    assert all(cfg["load_to_device"] is False and moved is None for cfg, moved in BUILT)


# --- the learner's sampled batch follows the policy's device -----------------------------------
class OnMeta(Policy):
    """A policy whose tensors live on torch's ``meta`` device: a stand-in for a GPU on a CPU
    machine (a batch left on the CPU would not be on the policy's device)."""

    def __init__(self, spec: PolicySpec) -> None:
        super().__init__(spec)
        self.w = torch.nn.Parameter(torch.zeros(1, device="meta"))

    def act(self, batch, deterministic=False, noise=None) -> ActionChunk:
        b, k, a = batch.obs.shape[0], self.spec.chunk_size, self.spec.action_dim
        dev = self.w.device
        return ActionChunk(
            actions=torch.zeros(b, k, a, device=dev),
            logprob=torch.zeros(b, device=dev),
            value=torch.zeros(b, device=dev),
            env_ids=batch.env_ids,
            policy_version=torch.zeros_like(batch.env_ids),
        )

    def dist(self, obs, actions=None, extras=None):
        shape = (obs.shape[0], self.spec.chunk_size, self.spec.action_dim)
        loc = torch.zeros(shape, device=self.w.device)
        return torch.distributions.Normal(loc, torch.ones_like(loc), validate_args=False)

    def value(self, obs, extras=None):
        return torch.zeros(obs.shape[0], device=self.w.device)

    def evaluate(self, obs, actions, extras=None) -> Evaluation:
        z = torch.zeros(obs.shape[0], device=self.w.device)
        return Evaluation(logprob=z, entropy=z, value=z)


def test_the_sampled_batch_is_on_the_policys_device():
    """The shape search's and the profiler's learner batch (advantages and returns included)
    is made where the policy computes: advantages on the CPU against CUDA log-probs are a
    device-mismatch error in the loss."""
    from ebrl.stages.profile import sampled_batch

    policy = OnMeta(PolicySpec(obs_dim=3, action_dim=2, chunk_size=2))
    data = sampled_batch(policy, 4, torch.Generator().manual_seed(0))
    for name in ("obs", "actions", "behav_logprob", "prox_logprob", "advantages", "returns"):
        assert getattr(data, name).device.type == "meta", name
