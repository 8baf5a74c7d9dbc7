"""RLinf's Colocated mode over N devices (``baselines/colocated_ranks.py``), issue 43 item 1.

A Colocated job on N GPUs runs N ranks, each a process with num_envs/N envs, its own generator and
a data-parallel learner rank. Pinned here through the shipped entry point (``python -m
ebrl.train scheduler=colocated +axis/scale=g2``) on the fake GPU layer of ``test_gpu_fake``
(a fake NVML showing two H100s, so the run's Ray instance declares two GPUs and places a rank
on each; ``scheduler.device=cpu``: the ranks compute on the cores, reducing through gloo), and
held against the one-process Colocated run of the same config: the same env steps, and after
every update the same weights, on every rank.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from baselines.colocated import ColocatedScheduler
from baselines.colocated_ranks import merge, rank_envs
from ebrl.ledger import account
from ebrl.runtime.placement import PlacementError, place
from ebrl.runtime.placement_asks import colocated_asks
from ebrl.runtime.placement_nodes import fake_cluster
from ebrl.schedulers.base import IterationReport, StageError
from ebrl.stages.factory import StageFactory

from .conftest import TINY, make_cfg
from .test_gpu_fake import H100, fake_gpu_layer

ITERATIONS = 3


def train(tmp_path: Path, name: str, env: dict[str, str], *extra: str):
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    cmd = [
        sys.executable, "-m", "ebrl.train", *over, "scheduler=colocated",
        f"budget.iterations={ITERATIONS}", f"run_dir={tmp_path / name}",
        f"tracking.store={tmp_path / 'mlflow'}", *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    run = tmp_path / name
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    return run, [r for r in rows if "colocated/ranks" in r or "train/loss" in r], summary


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoint.pt", weights_only=False)["policy"]


@pytest.mark.slow  # Ray and two rank processes: ~50 s on a loaded 2-core machine
def test_two_ranks_on_two_fake_gpus_train_like_one_process_on_all_the_envs(tmp_path):
    env = fake_gpu_layer(tmp_path, mps=False, gpus=f"{H100},{H100}")
    g2 = ["+axis/scale=g2", "gpu=h100", "scheduler.device=cpu"]
    two, rows, summary = train(tmp_path, "two", env, *g2)
    one, _, one_summary = train(tmp_path, "one", env)  # ranks=1: every stage in the driver

    # two rank processes, neither the driver, each with its half of the envs, on its own GPU
    ranks = [json.loads(ln) for ln in (two / "colocated_ranks.jsonl").read_text().splitlines()]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert len({r["pid"] for r in ranks}) == 2
    assert [r["env_ids"] for r in ranks] == [[0, 1], [2, 3]]
    assert [r["EBRL_GPU_SLOTS"] for r in ranks] == ["0", "1"]  # rank i planned on GPU slot i
    assert [r["CUDA_VISIBLE_DEVICES"] for r in ranks] == ["0", "1"]  # and pinned to it
    assert {r["backend"] for r in ranks} == {"gloo"}  # they compute on the cores here
    rows_of = [ln.split() for ln in (two / "placement.txt").read_text().splitlines()]
    placed = [(r[1], r[3], r[4]) for r in rows_of if r[0] == "colocated"]  # index, gpu, slot
    assert placed == [("0", "1", "0"), ("1", "1", "1")]  # the placement table shows the ranks
    # one report per iteration; after every update the ranks hold the same weights
    assert len(rows) == ITERATIONS
    for row in rows:
        assert row["colocated/ranks"] == 2
        assert row["colocated/weights_sum_rank0"] == row["colocated/weights_sum_rank1"]
    # env steps: the ranks' sum, exact: the one-process run's, and the step ledger's
    assert summary["env_steps"] == one_summary["env_steps"] > 0
    assert account(two, ITERATIONS).trained == summary["env_steps"]
    # the update on the ranks' gathered data is one process's on the union (float tolerance)
    w1, w2 = weights(one), weights(two)
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-5, atol=1e-6, msg=k)


def test_each_rank_gets_a_contiguous_block_of_at_least_env_groups_envs():
    factory = StageFactory.from_config(make_cfg([*TINY, "num_envs=6"]))
    assert rank_envs(factory, 3, 2) == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match=r"num_envs >= 8, got num_envs=6"):
        rank_envs(factory, 4, 2)


def _out(checksum: float, steps: int, episodes: list) -> dict:
    report = IterationReport(0, steps, {"train/loss": 1.0, "sim/steps_total": 3.0})
    return {"report": report, "episodes": episodes, "checksum": checksum, "backend": "gloo"}


def test_the_merged_report_sums_env_steps_and_merges_episodes_over_the_ranks():
    ep = [{"returns": [1.0], "lengths": [2], "successes": [True]}]
    ep2 = [{"returns": [3.0, 5.0], "lengths": [4, 6], "successes": [False, False]}]
    r = merge([_out(0.5, 10, ep), _out(0.5, 12, ep2)], 0)
    assert r.env_steps == 22
    assert r.metrics["sim/steps_total"] == 6.0
    assert r.metrics["env/episodes"] == 3.0
    assert r.metrics["env/return"] == pytest.approx(3.0)
    assert r.metrics["env/success_rate"] == pytest.approx(1 / 3)


def test_ranks_whose_weights_differ_stop_the_run_naming_their_sums():
    with pytest.raises(StageError, match=r"weights differ after update 4.*\[0\.5, 0\.25\]"):
        merge([_out(0.5, 1, []), _out(0.25, 1, [])], 4)


def test_the_scale_point_sets_the_ranks_and_one_rank_is_the_one_process_path():
    assert make_cfg([*TINY, "scheduler=colocated"]).scheduler.ranks == 1
    cfg = make_cfg([*TINY, "scheduler=colocated", "+axis/scale=g4", "num_envs=8"])
    assert cfg.scheduler.ranks == 4
    with pytest.raises(ValueError, match=r"scheduler.device=cpu .* scheduler.ranks=1"):
        ColocatedScheduler(device="cpu")
    with pytest.raises(ValueError, match=r"scheduler.ranks=0"):
        ColocatedScheduler(ranks=0)


def test_on_two_eight_gpu_nodes_rank_i_owns_gpu_i_and_a_node_group_pins_the_ranks():
    nodes = fake_cluster(2, 8, 96, groups={1: {"h100": 1}})
    placed = place(colocated_asks(16, 1.0), nodes)
    assert [(p.node.address, p.gpu_slots) for p in placed] == [
        (f"10.0.0.{1 + i // 8}", (i % 8,)) for i in range(16)
    ]
    pinned = place(colocated_asks(8, 1.0, group="h100"), nodes)
    assert {p.node.address for p in pinned} == {"10.0.0.2"}
    with pytest.raises(
        PlacementError, match=r"placement.groups.colocated=rtx: no node .* group 'rtx'"
    ):
        place(colocated_asks(2, 1.0, group="rtx"), nodes)
    with pytest.raises(PlacementError, match=r"Colocated rank 16"):
        place(colocated_asks(17, 1.0), nodes)  # a GPU per rank: 16 GPUs hold 16 ranks
