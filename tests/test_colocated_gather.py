"""Colocated's data-parallel update (``baselines/colocated_ranks.GatheredTrain``): 2 gloo ranks,
each holding only the envs of its half of every segment, end each update with the weights of
one process trained on the union of their data (to float tolerance), and with each other's
exactly.

``tests/test_data_parallel.py`` pins that ranks given the SAME whole segment train like one; this
pins the step before it that Colocated adds: each rank rolls out its own envs, and the ranks'
segments are gathered (in rank order, the env ids' order) before the summed-gradient update.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from baselines.colocated_ranks import GatheredTrain, weights_checksum
from ebrl.policies import MLPPolicy, PolicySpec
from ebrl.runtime.dist import SOLO, DataParallel
from ebrl.runtime.dist_group import destroy, free_port, init_group
from ebrl.stages.train import TrainStage
from ebrl.types import Segment

from .test_data_parallel import CASES, SPEC, TRAIN_SEED, UPDATES, _inputs

WORLD = 2
#: cases of test_data_parallel: unequal halves (5 envs: 3 + 2), GRPO's group of envs 2 and 3
#: split between the ranks (whole again once gathered: the advantages see it all), a KL stop
NAMES = ("ppo_action", "grpo", "ppo_kl_stop")


def half(seg: Segment, rank: int, world: int = WORLD) -> Segment:
    """Rank ``rank``'s contiguous block of the segment's envs (what its own envs collected)."""
    idx = torch.tensor_split(torch.arange(seg.shape[1]), world)[rank]
    out = {}
    for f in dataclasses.fields(Segment):
        v = getattr(seg, f.name)
        if f.name == "extras":
            out[f.name] = {k: t[:, idx] for k, t in v.items()}
        else:
            out[f.name] = v[idx] if f.name == "env_ids" else v[:, idx]
    return Segment(**out)


def _stage(name: str, inputs: dict, dp: DataParallel) -> TrainStage:
    algo_name, cfg_kw, seg_kw = CASES[name]
    algo_cls, cfg_cls = SPEC[algo_name]
    pol = MLPPolicy(PolicySpec(4, 2, seg_kw["k"]), hidden=16, layers=1)
    pol.load_state_dict(inputs["state"])
    return TrainStage(algo_cls(pol, cfg_cls(**cfg_kw)), device="cpu", dp=dp)


def _rank_main(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    inputs = torch.load(Path(out) / "inputs.pt", weights_only=False)
    dp = init_group(rank, world, ("127.0.0.1", port), "gloo", timeout_s=60)
    try:
        res = {}
        for name in NAMES:
            learner = GatheredTrain(_stage(name, inputs[name], dp), dp)
            torch.manual_seed(TRAIN_SEED)
            sums = []
            for seg in inputs[name]["segments"]:
                learner.train(half(seg, rank, world))
                sums.append(weights_checksum(learner.stage.algo.policy))
            res[name] = {"weights": learner.weights()[1], "sums": sums}
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        destroy()


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("gather")
    inputs = {name: _inputs(name) for name in NAMES}
    torch.save(inputs, out / "inputs.pt")
    port = free_port("127.0.0.1")
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", __name__])
    mp.start_processes(
        _rank_main, args=(WORLD, port, str(out)), nprocs=WORLD, join=True,
        start_method="forkserver",
    )  # fmt: skip
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    solo = {}
    for name in NAMES:
        stage = _stage(name, inputs[name], SOLO)
        torch.manual_seed(TRAIN_SEED)
        for seg in inputs[name]["segments"]:
            stage.train(seg)
        solo[name] = stage.weights()[1]
    return {"ranks": ranks, "solo": solo}


def test_halves_are_disjoint_and_gather_back_to_the_segment():
    seg = _inputs("grpo")["segments"][0]
    parts = [half(seg, r) for r in range(WORLD)]
    assert [p.env_ids.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5]]
    whole = Segment.cat_envs(parts)
    for f in dataclasses.fields(Segment):
        if f.name != "extras":
            assert torch.equal(getattr(whole, f.name), getattr(seg, f.name)), f.name


@pytest.mark.parametrize("name", NAMES)
def test_ranks_on_their_own_envs_train_like_one_process_on_all_of_them(runs, name):
    r0, r1 = (r[name] for r in runs["ranks"])
    assert r0["sums"] == r1["sums"] and len(r0["sums"]) == UPDATES  # the same, every update
    for k, w in runs["solo"][name].items():
        assert torch.equal(r0["weights"][k], r1["weights"][k]), k
        torch.testing.assert_close(r0["weights"][k], w, rtol=1e-5, atol=1e-6, msg=k)
