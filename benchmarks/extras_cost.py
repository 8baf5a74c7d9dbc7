"""What carrying a chunk's extras costs on the hot path: a Go message with and without them.

A generator replica answers a batch of B envs with one ``Go`` per env worker: the fixed fields
(actions, log-prob, value, version) in the shared slots, the message carrying the env ids and,
for a policy with extras (``ebrl.types``), the extras themselves (``ShmSlots.put_chunk``). This
times that message from the replica's ``put_chunk`` to the env worker's ``get_chunk`` (pickle,
socket, unpickle, the slot reads) and back (a small acknowledgement), between two processes, for:

- ``none``: ebrl's own policies (no extras);
- ``pi0``: RLinf's openpi rollout at its LIBERO settings (``num_steps`` 4, the 50-step action
  horizon at openpi's 32 action dims, bf16): ``chains [B, 5, 50, 32]``, ``denoise_inds [B, 4]``,
  the tokenised prompt and its mask ``[B, 48]``;
- ``pi0+images``: the same with both 224 x 224 cameras carried too, which is what the adapter
  avoids by rebuilding a model's image inputs from the observation.

Medians over ``--messages`` round trips after 20 warm-up ones, the three interleaved message by
message, as milliseconds and as a ratio to ``none``.

Usage: python benchmarks/extras_cost.py [--batch 8] [--messages 300]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ebrl.runtime.channel import Address, Inbox, Outbox, new_authkey  # noqa: E402
from ebrl.runtime.slots import ShmSlots, SlotSpec  # noqa: E402
from ebrl.schedulers.ebrl.messages import Go  # noqa: E402
from ebrl.types import ActionChunk  # noqa: E402

K, A, O = 10, 7, 9  # openpi's LIBERO chunk, action and state sizes


def extras(kind: str, b: int) -> dict[str, torch.Tensor]:
    if kind == "none":
        return {}
    out = {
        "chains": torch.randn(b, 5, 50, 32).to(torch.bfloat16),
        "denoise_inds": torch.arange(4).expand(b, -1).clone(),
        "tokenized_prompt": torch.randint(0, 257_152, (b, 48)),
        "tokenized_prompt_mask": torch.ones(b, 48, dtype=torch.bool),
    }
    if kind == "pi0+images":
        out["observation/image"] = torch.randint(0, 256, (b, 224, 224, 3), dtype=torch.uint8)
        out["observation/wrist_image"] = torch.randint(0, 256, (b, 224, 224, 3), dtype=torch.uint8)
    return out


def env_worker(spec: SlotSpec, reply_to: Address, key: bytes, ready: mp.Queue) -> None:
    from multiprocessing import resource_tracker

    # a tracker of its own, as an env worker (a Ray actor) has: attaching to the slots forgets
    # them there, not in the creator's tracker (which then reports them unknown at unlink)
    own = resource_tracker.ResourceTracker()
    resource_tracker.register, resource_tracker.unregister = own.register, own.unregister
    torch.set_num_threads(1)
    slots = ShmSlots(spec)
    inbox = Inbox(key)
    ready.put(inbox.address)
    back = Outbox(reply_to, key)
    while True:
        for go in inbox.recv():
            if go is None:
                slots.close()
                return
            chunk = slots.get_chunk(go.env_ids, go.payload)
            back.send(len(chunk.extras))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8, help="envs answered by one Go")
    p.add_argument("--messages", type=int, default=300)
    args = p.parse_args()
    b = args.batch
    torch.set_num_threads(1)
    slots = ShmSlots.create(num_envs=b, obs_dim=O, chunk_size=K, action_dim=A)
    key = new_authkey()
    inbox = Inbox(key)
    ctx = mp.get_context("spawn")
    ready: mp.Queue = ctx.Queue()
    child = ctx.Process(target=env_worker, args=(slots.spec, inbox.address, key, ready))
    child.start()
    to_env = Outbox(ready.get(timeout=60), key)
    kinds = ("none", "pi0", "pi0+images")
    chunks = {
        kind: ActionChunk(
            actions=torch.randn(b, K, A),
            logprob=torch.randn(b),
            value=torch.randn(b),
            env_ids=torch.arange(b),
            policy_version=torch.zeros(b, dtype=torch.int64),
            extras=extras(kind, b),
        )
        for kind in kinds
    }
    times: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        for i in range(20 + args.messages):
            for kind in kinds:
                chunk = chunks[kind]
                t0 = time.perf_counter()
                to_env.send(Go(chunk.env_ids.numpy(), slots.put_chunk(chunk)))
                while not inbox.recv(timeout=10.0):
                    pass
                if i >= 20:
                    times[kind].append(time.perf_counter() - t0)
    finally:
        to_env.send(None)
        child.join(timeout=10)
        slots.close()
        inbox.close()
    base = statistics.median(times["none"])
    print(f"Go round trip, B={b} envs, median of {args.messages} (ms; ratio to none)")
    for kind in kinds:
        nbytes = sum(t.numel() * t.element_size() for t in chunks[kind].extras.values())
        med = statistics.median(times[kind])
        print(
            f"  {kind:<11} extras {nbytes / 1024:8.1f} KiB  {1e3 * med:7.3f} ms  "
            f"x{med / base:6.2f}  (p90 {1e3 * np.percentile(times[kind], 90):.3f} ms)"
        )


if __name__ == "__main__":
    main()
