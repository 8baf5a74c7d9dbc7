"""Which torch.distributed backend learner ranks take, and where a sharded learner's tensors live.

The backend is decided from what each rank's process sees (``ebrl.runtime.dist_group.rank_devices``:
its ``CUDA_VISIBLE_DEVICES``, torch's CUDA device count, the GPUs' UUIDs) and the other ranks'
views (``choose_backend``): NCCL where every rank owns its GPUs, gloo where one computes on the
CPU, sees no GPU, or two share a GPU. The layouts below are fakes of what a Ray actor sees: Ray
sets ``CUDA_VISIBLE_DEVICES`` to the GPUs it gave the actor, and on this CPU-only machine torch
sees none of them (NCCL itself cannot run here; its choice is checked at this level only).

FSDP: after sharding and an update, no parameter, gradient or optimiser state of a rank sits on
another device type than the learner's (``devices_of``, which the GPU check calls on a GPU); and
FSDP's mesh is on the learner's device type whatever the backend (a CPU mesh moved a GPU
learner's parameters to the CPU when ranks shared a GPU).
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from ebrl.algos.ppo import PPO, PPOConfig
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.runtime.dist_fsdp import devices_of
from ebrl.runtime.dist_group import (
    RankDevices,
    choose_backend,
    destroy,
    free_port,
    init_group,
    rank_devices,
)
from ebrl.stages.train import TrainStage

from .test_data_parallel import _collect


def view(env: dict[str, str], count: int, host: str = "node0", device: str = "cuda"):
    """A rank's view of the GPUs: what a process with ``env`` and ``count`` CUDA devices (no
    UUIDs: named by their CUDA_VISIBLE_DEVICES entries) sees on ``host``."""
    return rank_devices(device, env=env, count=count, uuid_of=lambda i: None, host=host)


def with_nccl(monkeypatch):
    """This CPU build of torch has no NCCL; the choice is made as a CUDA build would."""
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)


def test_each_rank_owning_its_gpu_takes_nccl(monkeypatch):
    with_nccl(monkeypatch)
    # g2 after placement: one rank per GPU; Ray gives each actor its GPU as cuda:0
    views = [view({"CUDA_VISIBLE_DEVICES": "0"}, 1), view({"CUDA_VISIBLE_DEVICES": "1"}, 1)]
    backend, why = choose_backend(views)
    assert backend == "nccl"
    assert "rank 0: node0/0" in why and "rank 1: node0/1" in why
    # the same GPU index on two machines is two GPUs
    views = [
        view({"CUDA_VISIBLE_DEVICES": "0"}, 1, "a"),
        view({"CUDA_VISIBLE_DEVICES": "0"}, 1, "b"),
    ]
    assert choose_backend(views)[0] == "nccl"
    # a rank with two GPUs of its own
    views = [view({"CUDA_VISIBLE_DEVICES": "0,1"}, 2), view({"CUDA_VISIBLE_DEVICES": "2,3"}, 2)]
    assert choose_backend(views)[0] == "nccl"
    # UUIDs, where torch gives them, name the GPU whatever the index
    uuids = [rank_devices("cuda", {}, 1, lambda i, u=u: u, "n") for u in ("GPU-aaaa", "GPU-bbbb")]
    assert choose_backend(uuids) == (
        "nccl", "each of the 2 ranks owns its GPUs (rank 0: n/GPU-aaaa; rank 1: n/GPU-bbbb)"
    )  # fmt: skip


def test_ranks_sharing_a_gpu_or_without_one_take_gloo_and_say_why(monkeypatch):
    with_nccl(monkeypatch)
    # today's g2: two learner ranks of 0.5 GPU each on one GPU
    shared = [view({"CUDA_VISIBLE_DEVICES": "0"}, 1), view({"CUDA_VISIBLE_DEVICES": "0"}, 1)]
    assert choose_backend(shared) == ("gloo", "ranks 0 and 1 share GPU node0/0")
    # one GPU of a rank's two is another rank's
    overlap = [view({"CUDA_VISIBLE_DEVICES": "0,1"}, 2), view({"CUDA_VISIBLE_DEVICES": "1"}, 1)]
    assert choose_backend(overlap) == ("gloo", "ranks 0 and 1 share GPU node0/1")
    # Ray declared a GPU (CUDA_VISIBLE_DEVICES set) but the process sees none: this machine
    absent = [view({"CUDA_VISIBLE_DEVICES": "0"}, 0), view({"CUDA_VISIBLE_DEVICES": "1"}, 0)]
    assert choose_backend(absent) == (
        "gloo", "rank 0 sees no GPU (CUDA_VISIBLE_DEVICES=0, torch sees 0 CUDA devices)"
    )  # fmt: skip
    cpu = [view({}, 1), view({}, 1, device="cpu")]
    assert choose_backend(cpu) == ("gloo", "rank 1 computes on the cpu")


def test_nccl_by_name_is_refused_where_the_ranks_cannot_have_it(monkeypatch):
    with_nccl(monkeypatch)
    shared = [view({"CUDA_VISIBLE_DEVICES": "0"}, 1), view({"CUDA_VISIBLE_DEVICES": "0"}, 1)]
    with pytest.raises(RuntimeError, match=r"ranks 0 and 1 share GPU node0/0.*backend 'auto'"):
        choose_backend(shared, "nccl")
    assert choose_backend(shared, "gloo") == (
        "gloo", "asked for by name (ranks 0 and 1 share GPU node0/0)"
    )  # fmt: skip
    with pytest.raises(ValueError, match="'mpi'"):
        choose_backend(shared, "mpi")


def test_without_nccl_in_torch_gpus_of_their_own_still_take_gloo(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)
    views = [view({"CUDA_VISIBLE_DEVICES": "0"}, 1), view({"CUDA_VISIBLE_DEVICES": "1"}, 1)]
    assert choose_backend(views) == ("gloo", "this torch has no NCCL")


def test_a_view_travels_through_the_store_as_text():
    v = view({"CUDA_VISIBLE_DEVICES": "2,3"}, 2)
    assert RankDevices.loads(v.dumps()) == v
    assert v.gpus == ("node0/2", "node0/3")


def test_a_gpu_learner_that_sees_no_gpu_takes_gloo_and_keeps_its_mesh_on_the_gpu_type():
    """The group's reductions of small buffers go through the CPU under gloo, but FSDP's mesh
    has the learner's device type: a CPU mesh moves a GPU learner's shards to the CPU."""
    dp = init_group(0, 1, ("127.0.0.1", free_port()), device="cuda", timeout_s=30)
    try:
        assert (dp.backend, dp.device.type, dp.learner_device.type) == ("gloo", "cpu", "cuda")
        assert "sees no GPU" in dp.why
        assert dp.mesh.device_type == "cuda"
    finally:
        destroy()


def test_devices_of_names_every_device_type_a_learner_holds():
    pol = MLPPolicy(PolicySpec(4, 2, 2), hidden=8, layers=1)
    opt = torch.optim.Adam(pol.parameters())
    assert devices_of(pol, opt) == {"params": {"cpu"}, "grads": set(), "optimizer": set()}
    sum(p.sum() for p in pol.parameters()).backward()
    opt.step()
    assert devices_of(pol, opt) == {"params": {"cpu"}, "grads": {"cpu"}, "optimizer": {"cpu"}}
    # a moment left on another device is seen (the step counters, 0-dim and on the host by
    # torch's design, are not state that follows the parameters)
    state = next(iter(opt.state.values()))
    state["exp_avg"] = state["exp_avg"].to("meta")
    assert devices_of(pol, opt)["optimizer"] == {"cpu", "meta"}


# --- FSDP on 2 gloo ranks: nothing leaves the learner's device -------------------------------
def _fsdp_rank(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dp = init_group(rank, world, ("127.0.0.1", port), timeout_s=60, device="cpu", strategy="fsdp")
    try:
        torch.manual_seed(0)
        pol = MLPPolicy(PolicySpec(4, 2, 3), hidden=8, layers=2)
        algo = PPO(pol, PPOConfig(update_epochs=1, num_minibatches=2, target_kl=None))
        stage = TrainStage(algo, device="cpu", dp=dp)
        seg = _collect(_ref_policy(), n_envs=4, t_len=4, k=3, noise=1.0)
        torch.manual_seed(1)
        stage.train(seg)
        sharded = all(p.__class__.__name__ == "DTensor" for p in algo.policy.parameters())
        res = {
            "devices": devices_of(algo.policy, algo.optimizer),
            "sharded": sharded,
            "backend": (dp.backend, dp.why, dp.mesh.device_type),
        }
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        destroy()


def _ref_policy() -> MLPPolicy:
    torch.manual_seed(0)
    return MLPPolicy(PolicySpec(4, 2, 3), hidden=8, layers=2)


def test_fsdp_shards_leave_nothing_on_another_device_type(tmp_path):
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", __name__])
    mp.start_processes(
        _fsdp_rank, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True,
        start_method="forkserver",
    )  # fmt: skip
    for r in range(2):
        res = torch.load(tmp_path / f"rank{r}.pt", weights_only=False)
        assert res["sharded"]
        # after an update a rank holds parameters, gradients and Adam's moments: all on the CPU
        assert res["devices"] == {"params": {"cpu"}, "grads": {"cpu"}, "optimizer": {"cpu"}}
        assert res["backend"] == ("gloo", "rank 0 computes on the cpu", "cpu")
