"""Where a run's policy computes when the run asks for a GPU (``gpu`` other than ``cpu``).

Found by the first GPU check (an H200): sync and Colocated ran the policy on the CPU cores of a
GPU node, so a GPU sweep compared EBRL on the GPU with its baselines on the CPU.
"""

from __future__ import annotations

import logging

import pytest

from ebrl.config import validate
from ebrl.hardware import MachineFacts
from ebrl.stages.factory import StageFactory

from .conftest import make_cfg

H200 = MachineFacts(where="a GPU node", gpus=("NVIDIA H200",), cuda=True, cpus=16)


@pytest.mark.parametrize(("gpu", "device"), [("h200", "cuda"), ("h100", "cuda"), ("cpu", "cpu")])
def test_the_in_driver_schedulers_compute_on_the_gpu_the_run_asks_for(gpu, device):
    """sync and Colocated build every stage in the driver (RunContext.build_local): there the
    policy acts and trains on the run's GPU, as RLinf's Colocated puts every stage on it."""
    assert StageFactory.from_config(make_cfg([f"gpu={gpu}"])).local_device() == device


def test_a_gpu_run_whose_roles_ask_for_no_gpu_share_is_warned(caplog):
    def warned(overrides: list[str]) -> bool:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ebrl.config"):
            validate(make_cfg(["gpu=h200", *overrides]), machine=H200)
        return any("ask for no GPU share" in r.getMessage() for r in caplog.records)

    assert warned(["scheduler=async"])
    assert warned(["scheduler=ebrl"])
    assert not warned(["scheduler=ebrl", "scale.gen_gpus=0.5", "scale.learner_gpus=0.5"])
    assert not warned(["scheduler=ebrl", "+axis/scale=g1"])
    assert not warned(["scheduler=sync"])  # it puts the policy on the GPU itself
    assert not warned(["scheduler=colocated"])
