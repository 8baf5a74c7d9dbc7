"""The tiny pi0 (conf/policy/pi0_tiny.yaml: RLinf's openpi model through ebrl's RLinfPolicy):
its parameter count, acts per second at a few batch sizes, and one learner step.

Usage (from .venv-openpi, `make test-openpi` builds it): ``python benchmarks/vla_tiny.py
[--batches 1,8,32] [--seconds 5] [--threads 1]``

An act is one ``RLinfPolicy.act`` on a batch of counting-simulator observations (state of 5, a
task one-hot, an 8 x 8 camera): RLinf's input transforms (per row, in numpy), the prompt's
tokens, PaliGemma's prefix, the denoising steps and the output transforms. acts/s counts
decisions (rows), so a batch of 8 at 2 calls/s is 16 acts/s. The learner step is
``evaluate`` plus backward on the same batch (no optimizer).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from omegaconf import OmegaConf

from ebrl.envs.fake import CountingEnv
from ebrl.policies.base import PolicySpec
from ebrl.policies.rlinf_policy import RLinfPolicy
from ebrl.train import CONF_DIR
from ebrl.types import Observation


def policy(chunk: int) -> tuple[RLinfPolicy, PolicySpec]:
    node = OmegaConf.to_container(OmegaConf.load(f"{CONF_DIR}/policy/pi0_tiny.yaml"))
    node = {k: v for k, v in node.items() if k not in ("defaults", "name", "package", "install")}
    env = CountingEnv(0, obs_dim=5, action_dim=7, tasks=2, camera_size=8)
    spec = PolicySpec(
        obs_dim=env.spec.obs_dim, action_dim=7, chunk_size=chunk, layout=env.spec.obs_layout()
    )
    torch.manual_seed(0)
    return RLinfPolicy(spec, **node), spec


def batch(n: int) -> Observation:
    envs = [CountingEnv(e, obs_dim=5, action_dim=7, tasks=2, camera_size=8) for e in range(n)]
    obs = torch.from_numpy(np.stack([env.reset(0) for env in envs]))
    return Observation(obs=obs, env_ids=torch.arange(n))


def rate(fn, seconds: float) -> tuple[float, int]:
    fn()  # warm-up
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        dt = time.perf_counter() - t0
        if dt >= seconds and calls >= 3:
            return calls / dt, calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--chunk", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    p, _ = policy(args.chunk)
    params = sum(q.numel() for q in p.model.parameters())
    emb = sum(
        q.numel()
        for n, q in p.model.named_parameters()
        if n.endswith(("embed_tokens.weight", "lm_head.weight"))
    )
    cfg = p.model.config
    print(
        f"pi0_tiny: {params / 1e6:.2f}M parameters ({emb / 1e6:.2f}M of them the vocabulary's "
        f"embeddings), chunk {args.chunk} x 7, {cfg.num_steps} denoising steps, "
        f"torch threads {args.threads}"
    )
    print("batch  acts/s  calls/s  ms/call  learner ms/step")
    for b in (int(x) for x in args.batches.split(",")):
        obs = batch(b)
        calls_s, _ = rate(lambda obs=obs: p.act(obs), args.seconds)
        chunk = p.act(obs)

        def learn(obs=obs, chunk=chunk):
            p.zero_grad(set_to_none=True)
            ev = p.evaluate(obs.obs, chunk.actions, chunk.extras)
            (ev.logprob.mean() + ev.value.mean()).backward()

        learn_s, _ = rate(learn, args.seconds)
        ms = 1e3 / calls_s
        print(f"{b:5d}  {b * calls_s:6.1f}  {calls_s:7.2f}  {ms:7.1f}  {1e3 / learn_s:8.1f}")


if __name__ == "__main__":
    main()
