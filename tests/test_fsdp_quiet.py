"""FSDP2's "returned a view tensor" warning, silenced because it is harmless here (issue 47).

FSDP2 warns at every forward of a wrapped module whose output is a view (a policy's value head
``squeeze(-1)``, its distribution's loc and scale): an in-place op on such a view would skip
the all-gather before the backward. ebrl's learner takes none, and this test holds it: 2 FSDP
ranks' update of the transformer and the MLP policy gives the one-rank update's weights (as
``tests/test_fsdp.py`` does over five updates), and no such warning reaches the ranks' output.
"""

from __future__ import annotations

import multiprocessing
import warnings
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from ebrl.runtime.dist import SOLO
from ebrl.runtime.dist_group import destroy, free_port, init_group

from .test_fsdp import _inputs, _same_weights, _train

CASES = ("ppo_mlp", "ppo_transformer")


def _rank(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    inputs = torch.load(Path(out) / "inputs.pt", weights_only=False)
    dp = init_group(rank, 2, ("127.0.0.1", port), "gloo", timeout_s=60, strategy="fsdp")
    try:
        with warnings.catch_warnings(record=True) as seen:  # the filters in force, recorded
            res = {name: _train(name, inputs[name], dp, range(1)) for name in CASES}
        res["_warnings"] = [str(w.message) for w in seen]
        torch.save(res, Path(out) / f"rank{rank}.pt")
    finally:
        destroy()


@pytest.mark.slow  # 2 spawned ranks: ~30 s here, more under load
def test_fsdp_ranks_update_like_one_and_print_no_view_warning(tmp_path):
    inputs = {name: _inputs(name) for name in CASES}
    torch.save(inputs, tmp_path / "inputs.pt")
    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", __name__])
    mp.start_processes(
        _rank, args=(free_port("127.0.0.1"), str(tmp_path)), nprocs=2, join=True,
        start_method="forkserver",
    )  # fmt: skip
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        solo = {name: _train(name, inputs[name], SOLO, range(1)) for name in CASES}
    finally:
        torch.set_num_threads(threads)
    for name in CASES:
        _same_weights(ranks[0][name]["weights"], solo[name]["weights"])
    for r in ranks:
        assert not [w for w in r["_warnings"] if "view tensor" in w], r["_warnings"]
