"""GPU check of the GPU regime's policy (``policy=transformer_vla``, marker ``gpu``): the
VLA-sized transformer (~302M parameters, its trunk in bf16) acts and takes a PPO update on the
GPU, and nothing of it (parameters, gradients, Adam's moments) is left on another device type or
in another dtype than its parameter's. Prints acts/s and the update's seconds.

Never run on a GPU yet (written 2026-12-07; scripts/gpu_check.sh runs it).
"""

from __future__ import annotations

import time

import pytest
import torch
from hydra.utils import instantiate

from ebrl.algos.loss import sgd_update
from ebrl.plan.measure import compose
from ebrl.policies.base import PolicySpec
from ebrl.stages.profile import ppo_config, sampled_batch
from ebrl.types import Observation
from tests.gpu.test_gpu_mps import requires_gpu

pytestmark = pytest.mark.gpu


@requires_gpu
def test_the_vla_policy_acts_and_learns_on_the_gpu_with_every_tensor_there():
    assert torch.cuda.is_available(), "a CUDA build of torch is needed (the venv has a CPU one?)"
    cfg = compose(["+experiment=gpu_regime"])
    torch.manual_seed(0)
    # the synthetic simulator's observation and action sizes are small: the size is the trunk's
    policy = instantiate(cfg.policy, _partial_=True)(spec=PolicySpec(35, 8, int(cfg.chunk_size)))
    policy = policy.to("cuda")
    n = sum(p.numel() for p in policy.parameters())
    assert n > 250e6, n
    obs = Observation(obs=torch.randn(16, 35, device="cuda"), env_ids=torch.arange(16))
    with torch.no_grad():
        chunk = policy.act(obs)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            chunk = policy.act(obs)
        torch.cuda.synchronize()
        act_s = (time.perf_counter() - t0) / 5
    assert chunk.actions.device.type == "cuda" and chunk.logprob.dtype == torch.float32
    ppo = ppo_config(cfg)
    opt = torch.optim.Adam(policy.parameters(), lr=ppo.lr, eps=ppo.adam_eps)
    data = sampled_batch(policy, 96, torch.Generator().manual_seed(0), torch.device("cuda"))
    t0 = time.perf_counter()
    stats = sgd_update(policy, opt, data, ppo, target_kl=None, vf_coef=ppo.vf_coef)
    torch.cuda.synchronize()
    update_s = time.perf_counter() - t0
    assert all(v == v for v in stats.values()), stats  # no NaN
    for name, p in policy.named_parameters():
        assert p.device.type == "cuda", name
        assert p.grad is None or (p.grad.device.type == "cuda" and p.grad.dtype == p.dtype), name
        for key, t in opt.state[p].items():
            if torch.is_tensor(t) and t.dim() > 0:
                assert t.device.type == "cuda" and t.dtype == p.dtype, (name, key)
    assert policy.encoder.layers[0].linear1.weight.dtype == torch.bfloat16
    print(
        f"\ntransformer_vla ({n / 1e6:.0f}M parameters, bf16 trunk): act on 16 envs "
        f"{act_s * 1000:.1f} ms ({16 / act_s:,.0f} acts/s); one update of 96 decisions "
        f"({ppo.update_epochs} epochs x {ppo.num_minibatches} minibatches) {update_s:.2f} s; "
        f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB"
    )
