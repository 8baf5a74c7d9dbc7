"""``resources.gpu_sharing``: the way roles that share a GPU get their quotas, asked for.

``auto`` (the default) is what ``tests/test_gpu_fake.py`` pins: MPS where a daemon can serve,
else MIG instances, else time-sliced with one warning. Asked for, ``mps`` and ``mig`` either
serve or stop the run before any worker starts, naming the fix; ``mig`` starts no daemon;
``time_sliced`` starts nothing and sets no quota. The runs go through ``python -m ebrl.train``
with the shipped ``+axis/scale=g1 gpu=h100`` on the fake GPU layer of ``test_gpu_fake``.
"""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException

from ebrl.config import ConfigError, validate
from ebrl.hardware import MachineFacts

from .conftest import make_cfg
from .test_gpu_fake import (
    FAKE_H100,
    G1,
    fake_gpu_layer,
    mps_log,
    refused,
    role_envs,
    run_train,
)

mlflow = pytest.importorskip("mlflow")


def params(tmp_path) -> dict[str, str]:
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name != "Default"]
    (run,) = client.search_runs([exp.experiment_id])
    return run.data.params


# --- refused at composition -----------------------------------------------------------------
def test_mig_on_a_gpu_type_without_mig_is_refused_naming_the_type():
    rtx = MachineFacts(where="the test machine", gpus=("NVIDIA GeForce RTX 4090",), cpus=16)
    refused(
        [*G1, "gpu=rtx4090", "resources.gpu_sharing=mig"],
        "resources.gpu_sharing=mig",
        "gpu=rtx4090 has no MIG",
        "resources.gpu_sharing=auto",
        on=rtx,
    )


def test_a_way_of_sharing_where_no_role_shares_a_gpu_is_refused():
    refused(
        ["scheduler=ebrl", "gpu=h100", "scheduler.device=cpu", "resources.gpu_sharing=mps"],
        "resources.gpu_sharing=mps",
        "no role shares a GPU",
        "+axis/scale=g1",
    )


def test_pinned_quotas_on_a_time_sliced_gpu_are_refused():
    refused(
        [*G1, "resources.gpu_sharing=time_sliced", "resources.gen_sm_pct=40"],
        "resources.gen_sm_pct=40",
        "nothing enforces a quota",
    )


def test_a_way_of_sharing_on_gpu_cpu_is_refused():
    with pytest.raises(ConfigError, match=r"resources.gpu_sharing=mig.*gpu=cpu"):
        validate(make_cfg(["resources.gpu_sharing=mig"]), machine=FAKE_H100)


def test_a_misspelt_way_of_sharing_is_refused_at_composition_naming_the_key_and_the_choices():
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg([*G1, "resources.gpu_sharing=mgi"])
    said = f"{e.value} {e.value.__cause__}"
    assert "resources.gpu_sharing" in said and "'mgi'" in said, said
    assert "expected one of [auto, mps, mig, time_sliced]" in said, said


def test_a_way_of_sharing_under_a_scheduler_without_ebrls_workers_is_refused():
    cuda = MachineFacts(where="the test machine", gpus=(FAKE_H100.gpus[0],), cuda=True, cpus=16)
    refused(
        ["scheduler=sync", "gpu=h100", "resources.gpu_sharing=mps"],
        "resources.gpu_sharing=mps",
        "scheduler=ebrl",
        on=cuda,
    )


# --- a run, on the fake GPU layer -------------------------------------------------------------
@pytest.mark.slow  # Ray and four roles, twice: 2-4 min on a 2-core machine; make test-slow
@pytest.mark.parametrize(("asked", "recorded"), [("mig", "mig"), ("time_sliced", "time-sliced")])
def test_mig_or_time_slicing_asked_for_starts_no_daemon_though_mps_could_serve(
    tmp_path, asked, recorded
):
    """The MPS control binary is on PATH and NVML shows the H100 in MIG mode with instances of
    16, 32 and 60 SMs: ``auto`` would take MPS. Asked for MIG, the roles get the instances
    closest to their 50% (60 and 32 SMs) and no daemon starts; asked for time-slicing, nothing
    starts and no role gets a quota; no warning either way (it was asked for)."""
    env = fake_gpu_layer(tmp_path, mig="16:10,32:20,60:40")
    p = run_train(tmp_path, env, f"resources.gpu_sharing={asked}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert [ln for ln in mps_log(tmp_path) if ln[0] == "start"] == []
    assert "time-slice the GPU" not in p.stdout + p.stderr
    envs = role_envs(tmp_path)
    got = params(tmp_path)
    assert got["gpu/sharing"] == got["gpu/sharing_asked"] == recorded
    for role in ("gen", "learner"):
        assert envs[role]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] is None, envs
        assert envs[role]["CUDA_MPS_PIPE_DIRECTORY"] is None, envs
    if asked == "mig":
        assert envs["gen"]["CUDA_VISIBLE_DEVICES"] == "MIG-fake-0-2", envs
        assert envs["learner"]["CUDA_VISIBLE_DEVICES"] == "MIG-fake-0-1", envs
    else:
        assert "gpu/gen_sm_pct" not in got  # no quota was set, none is recorded


@pytest.mark.slow  # Ray starts, no worker does: ~30-60 s each on a 2-core machine
@pytest.mark.parametrize(
    ("asked", "mps", "words"),
    [
        ("mps", False, ("no nvidia-cuda-mps-control", "install the NVIDIA driver's MPS tools")),
        ("mig", True, ("not in MIG mode or have no MIG instances", "nvidia-smi -i <gpu> -mig 1")),
    ],
    ids=["mps-without-the-binary", "mig-with-mig-off"],
)
def test_a_way_of_sharing_no_node_can_serve_stops_the_run_before_any_worker(
    tmp_path, asked, mps, words
):
    p = run_train(tmp_path, fake_gpu_layer(tmp_path, mps=mps), f"resources.gpu_sharing={asked}")
    assert p.returncode != 0
    said = p.stdout + p.stderr
    for w in (f"resources.gpu_sharing={asked}", "resources.gpu_sharing=auto", *words):
        assert w in said, said[-3000:]
    assert not (tmp_path / "run" / "gpu_env.jsonl").exists()  # no GPU role ever started
    assert [ln for ln in mps_log(tmp_path) if ln[0] == "start"] == []
