"""pi0 through RLinf's model code behind ebrl's RLinfPolicy (``ebrl.policies.openpi``): its
parameter count, acts per second at a few batch sizes, a learner step and a full update, tiny on
a CPU or at its real size (random weights) on a GPU.

Usage (from .venv-openpi, `make test-openpi` builds it)::

    python benchmarks/vla_pi0.py [--batches 1,8,32] [--seconds 5] [--threads 1]
    python benchmarks/vla_pi0.py --size full --device cuda --batches 1,8,32 --json pi0.json
    # (scripts/gpu_check.sh runs the second where openpi is installed)

``--size tiny`` is conf/policy/pi0_tiny.yaml (12.7M parameters); ``--size full`` is pi0's real
architecture (PaliGemma's Gemma 2B and SigLIP So400m/14, the 300M action expert, 224 x 224
images, a horizon of 50 of which 5 are executed), built from random weights: no checkpoint is
downloaded, so its figures are speed and memory, not behaviour.

An act is one ``RLinfPolicy.act`` on a batch of counting-simulator observations (a state of 5,
a task one-hot, one camera of ``--camera`` pixels a side): RLinf's input transforms (per row, in
numpy), the prompt's tokens, PaliGemma's prefix, the denoising steps and the output transforms.
acts/s counts decisions (rows), so a batch of 8 at 2 calls/s is 16 acts/s. The learner step is
``evaluate`` plus backward on the same batch; the update adds one AdamW step over every
parameter (its state allocated at the first). On CUDA, the peak memory is per batch size.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from omegaconf import OmegaConf

from ebrl.envs.fake import CountingEnv
from ebrl.policies.base import PolicySpec
from ebrl.policies.rlinf_policy import RLinfPolicy
from ebrl.train import CONF_DIR
from ebrl.types import Observation

#: the full pi0's horizon (openpi's Pi0Config) and RLinf's executed chunk on LIBERO
FULL_HORIZON, FULL_CHUNK = 50, 5
#: pi0.yaml's openpi keys that belong to its LIBERO dataconfig (two cameras), not the model
DATA_KEYS = ("config_name", "num_images_in_input")


def policy(size: str, chunk: int, precision: str, camera: int) -> RLinfPolicy:
    """pi0_tiny's config at ``size`` (its ``model_cfg.sizes``), built on the CPU. At full size
    the model's settings are pi0's (conf/policy/pi0.yaml: denoising steps, noise, the VLM
    frozen as RLinf trains it) on pi0_tiny's single-camera transforms."""
    node = OmegaConf.to_container(OmegaConf.load(f"{CONF_DIR}/policy/pi0_tiny.yaml"))
    node = {k: v for k, v in node.items() if k not in ("defaults", "name", "package", "install")}
    cfg = node["model_cfg"]
    cfg["precision"] = None if precision == "openpi" else precision
    if size == "full":
        pi0 = OmegaConf.to_container(OmegaConf.load(f"{CONF_DIR}/policy/pi0.yaml"))["model_cfg"]
        own = {k: v for k, v in pi0["openpi"].items() if k not in DATA_KEYS}
        cfg["sizes"] = "full"
        cfg["openpi"] = {**cfg["openpi"], **own, "action_horizon": FULL_HORIZON}
        cfg["openpi"]["max_token_len"] = 48
    env = CountingEnv(0, obs_dim=5, action_dim=7, tasks=2, camera_size=camera)
    spec = PolicySpec(
        obs_dim=env.spec.obs_dim, action_dim=7, chunk_size=chunk, layout=env.spec.obs_layout()
    )
    torch.manual_seed(0)
    return RLinfPolicy(spec, **node)


def batch(n: int, camera: int, device: torch.device) -> Observation:
    envs = [CountingEnv(e, obs_dim=5, action_dim=7, tasks=2, camera_size=camera) for e in range(n)]
    obs = torch.from_numpy(np.stack([env.reset(0) for env in envs])).to(device)
    return Observation(obs=obs, env_ids=torch.arange(n, device=device))


def rate(fn: Callable[[], Any], seconds: float, sync: Callable[[], None]) -> float:
    """Calls per second of ``fn`` after one warm-up call, over at least ``seconds`` and 3
    calls; ``sync`` waits for the device."""
    fn()
    sync()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        sync()
        calls += 1
        dt = time.perf_counter() - t0
        if dt >= seconds and calls >= 3:
            return calls / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=("tiny", "full"), default="tiny")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    ap.add_argument(
        "--precision",
        choices=("fp32", "openpi"),
        default=None,
        help="fp32, or openpi's own (its selected parameters in bf16, as pi0.yaml's precision: "
        "null); default fp32 tiny, openpi full",
    )
    ap.add_argument("--camera", type=int, default=None, help="pixels a side (8 tiny, 224 full)")
    ap.add_argument("--chunk", type=int, default=None, help="executed chunk (2 tiny, 5 full)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args()
    full = args.size == "full"
    precision = args.precision or ("openpi" if full else "fp32")
    camera = args.camera or (224 if full else 8)
    chunk = args.chunk or (FULL_CHUNK if full else 2)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            f"--device {args.device}: this torch has no usable CUDA (a CPU build, or no GPU "
            "here): run on a GPU machine with a CUDA build of torch, or --device cpu"
        )
    torch.set_num_threads(args.threads)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    t0 = time.perf_counter()
    p = policy(args.size, chunk, precision, camera)
    p.model.to(device)
    build_s = time.perf_counter() - t0
    params = sum(q.numel() for q in p.model.parameters())
    emb = sum(
        q.numel()
        for n, q in p.model.named_parameters()
        if n.endswith(("embed_tokens.weight", "lm_head.weight"))
    )
    trainable = [q for q in p.model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=1e-6)
    cfg = p.model.config
    head = {
        "size": args.size,
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "precision": precision,
        "parameters": params,
        "embedding_parameters": emb,
        "trainable_parameters": sum(q.numel() for q in trainable),
        "chunk": chunk,
        "horizon": int(cfg.action_horizon),
        "denoising_steps": int(cfg.num_steps),
        "camera": camera,
        "build_s": build_s,
        "torch_threads": args.threads,
    }
    print(
        f"pi0 {args.size}: {params / 1e6:.2f}M parameters ({emb / 1e6:.2f}M of them the "
        f"vocabulary's embeddings, {head['trainable_parameters'] / 1e6:.2f}M trainable), "
        f"{precision} on {head['gpu'] or device}, chunk {chunk} of a horizon of "
        f"{head['horizon']} x 7, {head['denoising_steps']} denoising steps, camera {camera}, "
        f"built in {build_s:.1f} s, torch threads {args.threads}"
    )
    print("batch  acts/s  calls/s  ms/call  learner ms/step  update ms  peak GiB")
    rows = []
    for b in (int(x) for x in args.batches.split(",")):
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        obs = batch(b, camera, device)
        calls_s = rate(lambda obs=obs: p.act(obs), args.seconds, sync)
        chunk_out = p.act(obs)

        def learn(obs=obs, chunk=chunk_out) -> None:
            p.zero_grad(set_to_none=True)
            ev = p.evaluate(obs.obs, chunk.actions, chunk.extras)
            (ev.logprob.float().mean() + ev.value.float().mean()).backward()

        def update() -> None:
            learn()
            opt.step()

        learn_s = rate(learn, args.seconds, sync)
        update_s = rate(update, args.seconds, sync)
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if cuda else float("nan")
        row = {
            "batch": b,
            "acts_per_s": b * calls_s,
            "ms_per_call": 1e3 / calls_s,
            "learner_ms_per_step": 1e3 / learn_s,
            "update_ms": 1e3 / update_s,
            "peak_gib": peak,
        }
        rows.append(row)
        print(
            f"{b:5d}  {row['acts_per_s']:6.1f}  {calls_s:7.2f}  {row['ms_per_call']:7.1f}  "
            f"{row['learner_ms_per_step']:15.1f}  {row['update_ms']:9.1f}  {peak:8.2f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**head, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
