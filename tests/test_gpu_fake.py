"""GPU SM shares through the shipped entry point, on a fake GPU layer (issue 42).

``python -m ebrl.train`` runs the headline's GPU scale point (``+axis/scale=g1 gpu=h100``: a
generator and a learner each with half of one H100) against:

- a fake NVML: a ``pynvml`` module first on the run's ``PYTHONPATH`` that shows one H100. The
  run's hardware check sees it, and the Ray instance the run starts declares the GPUs NVML
  shows (``num_gpus``), so Ray places the roles' GPU shares on it;
- a fake ``nvidia-cuda-mps-control`` first on ``PATH``: ``-d`` forks a daemon that lives until a
  client sends ``quit``; each start and quit is appended to a log the test reads;
- ``scheduler.device=cpu``: torch here cannot use a GPU, so the roles compute on the cores
  (the documented dry run of a GPU configuration). Everything else is the GPU path.

The fake daemon cannot see CUDA clients; each GPU role's process reports the sharing variables
it runs with (``gpu_env.jsonl`` in the run folder, read inside the process), and the test holds
those against the daemon's pipe directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from ebrl.config import ConfigError, validate
from ebrl.hardware import MachineFacts
from ebrl.schedulers.ebrl.wiring import gen_name, learner_name
from ebrl.train import _refuse_unwired_resources

from .conftest import TINY, make_cfg
from .fake_mps import write_control

mlflow = pytest.importorskip("mlflow")
ROOT = Path(__file__).resolve().parents[1]
H100 = "NVIDIA H100 80GB HBM3"

FAKE_NVML = '''
"""A fake pynvml: GPUs named by FAKE_NVML_GPUS (comma-separated; empty: none)."""
import os


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class _Obj:
    def __init__(self, **kw):
        self.__dict__.update(kw)


def _names():
    return [n for n in os.environ.get("FAKE_NVML_GPUS", "").split(",") if n]


def nvmlInit():
    pass


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_names())


def nvmlDeviceGetHandleByIndex(i):
    if not 0 <= i < len(_names()):
        raise NVMLError("invalid index")
    return i


def nvmlDeviceGetName(h):
    return _names()[h]


def nvmlDeviceGetUUID(h):
    return f"MIG-fake-{h[0]}-{h[1]}" if isinstance(h, tuple) else f"GPU-fake-{h}"


def _migs():
    """FAKE_NVML_MIG: each GPU's MIG instances as SMs:GiB, comma-separated (unset: MIG off)."""
    text = os.environ.get("FAKE_NVML_MIG")
    return [tuple(map(int, m.split(":"))) for m in text.split(",")] if text else None


def nvmlDeviceGetMigMode(h):
    return (1, 1) if _migs() is not None else (0, 0)


def nvmlDeviceGetMaxMigDeviceCount(h):
    return len(_migs() or [])


def nvmlDeviceGetMigDeviceHandleByIndex(h, i):
    if not 0 <= i < len(_migs() or []):
        raise NVMLError("no MIG device there")
    return (h, i)


def nvmlDeviceGetGpuInstanceId(m):
    return m[1]


def nvmlDeviceGetComputeInstanceId(m):
    return 0


def nvmlDeviceGetCudaComputeCapability(h):
    return (9, 0)


def nvmlDeviceGetAttributes(h):
    if isinstance(h, tuple):  # a MIG device
        sms, gib = _migs()[h[1]]
        return _Obj(multiprocessorCount=sms, memorySizeMB=gib * 1024)
    return _Obj(multiprocessorCount=132)


def nvmlDeviceGetMemoryInfo(h):
    return _Obj(total=80 * 2**30, used=0, free=80 * 2**30)


def nvmlDeviceGetUtilizationRates(h):
    return _Obj(gpu=0, memory=0)


def __getattr__(name):
    """Every other NVML call (PCI info, GPM, power ...): not supported by this GPU."""
    if not name.startswith("nvml"):
        raise AttributeError(name)

    def unsupported(*args, **kwargs):
        raise NVMLError_NotSupported(name)

    return unsupported
'''


def fake_gpu_layer(
    tmp_path: Path, mps: bool = True, gpus: str = H100, mig: str | None = None
) -> dict[str, str]:
    """The environment of a run on the fake GPU layer (fake NVML; the fake MPS control binary
    on PATH when ``mps``; every GPU in MIG mode with instances ``mig``, ``SMs:GiB,...``)."""
    nvml = tmp_path / "fake_nvml"
    nvml.mkdir()
    (nvml / "pynvml.py").write_text(FAKE_NVML)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if mps:
        write_control(bin_dir)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_")}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=os.pathsep.join([str(nvml), str(ROOT), env.get("PYTHONPATH", "")]),
        FAKE_NVML_GPUS=gpus,
        FAKE_MPS_LOG=str(tmp_path / "mps.log"),
    )
    if mig is not None:
        env["FAKE_NVML_MIG"] = mig
    return env


def command(tmp_path: Path, *extra: str, iterations: int = 3, scale: str = "g1") -> list[str]:
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    return [
        sys.executable,
        "-m",
        "ebrl.train",
        *over,
        "scheduler=ebrl",
        f"+axis/scale={scale}",  # g1, the headline's GPU point: gen and learner half a GPU each
        "gpu=h100",
        "scheduler.device=cpu",  # torch here has no GPU: the roles compute on the cores
        "scheduler.sim_workers=2",
        "num_envs=4",
        f"budget.iterations={iterations}",
        f"run_dir={tmp_path / 'run'}",
        f"tracking.store={tmp_path / 'mlflow'}",
        *extra,
    ]


def mps_log(tmp_path: Path) -> list[list[str]]:
    path = tmp_path / "mps.log"
    return [ln.split() for ln in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def role_envs(tmp_path: Path) -> dict[str, dict]:
    rows = (tmp_path / "run" / "gpu_env.jsonl").read_text().splitlines()
    return {r["worker"]: r for r in map(json.loads, rows)}


def sharing_param(tmp_path: Path) -> str | None:
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name != "Default"]
    (run,) = client.search_runs([exp.experiment_id])
    return run.data.params.get("gpu/sharing")


def run_train(
    tmp_path: Path,
    env: dict[str, str],
    *extra: str,
    iterations: int = 3,
    timeout: float = 240,
    scale: str = "g1",
) -> subprocess.CompletedProcess:
    return subprocess.run(
        command(tmp_path, *extra, iterations=iterations, scale=scale),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- the default path: one node, Ray started by the run -------------------------------------
@pytest.mark.slow  # Ray and four roles: 2-3 min on a loaded 2-core machine; make test-slow
@pytest.mark.parametrize(
    ("extra", "quotas"),
    [
        ((), {"gen": "50", "learner": "50"}),  # unpinned: the roles' GPU shares
        (("resources.gen_sm_pct=70", "resources.train_sm_pct=30"), {"gen": "70", "learner": "30"}),
    ],
    ids=["shares", "pinned"],
)
def test_g1_on_one_node_starts_one_daemon_every_gpu_role_gets_its_quota_and_none_is_left(
    tmp_path, extra, quotas
):
    p = run_train(tmp_path, fake_gpu_layer(tmp_path), *extra)
    assert p.returncode == 0, p.stderr[-3000:]
    log = mps_log(tmp_path)
    starts = [ln for ln in log if ln[0] == "start"]
    assert len(starts) == 1, log  # one node, one daemon
    _, pid, pipe = starts[0]
    assert ["quit", pipe] in log  # stopped at the end
    assert gone_within([int(pid)], 10) == []
    envs = role_envs(tmp_path)
    assert set(envs) == {"gen", "learner"}
    for role, want in quotas.items():
        assert envs[role]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == want, envs[role]
        assert envs[role]["CUDA_MPS_PIPE_DIRECTORY"] == pipe, envs[role]
        assert envs[role]["CUDA_VISIBLE_DEVICES"] == "0"  # Ray gave it the declared GPU
    rows = [ln.split() for ln in (tmp_path / "run" / "placement.txt").read_text().splitlines()]
    table = {r[0]: r[5] for r in rows if r and r[0] in quotas}  # role -> its "mps %" column
    assert table == quotas
    assert sharing_param(tmp_path) == "mps"


@pytest.mark.slow  # Ray, 2 learner ranks, 2 replicas, 2 env workers: 1.5-3 min; make test-slow
def test_g2_on_one_node_puts_one_learner_rank_and_one_replica_on_each_gpu_at_their_quotas(
    tmp_path,
):
    """The shipped ``+axis/scale=g2`` on a node whose NVML shows two H100s: per GPU one learner
    rank and one generator replica, each at half its SMs. What each GPU role's process saw,
    read inside it, holds against the placement table: the ranks on different GPUs (their
    planned slots, not the slot Ray would hand the first shares it is asked for), every quota
    the table's, every role on the one daemon's pipe."""
    env = fake_gpu_layer(tmp_path, gpus=f"{H100},{H100}")
    p = run_train(tmp_path, env, scale="g2", timeout=420)
    assert p.returncode == 0, p.stderr[-3000:]
    (start,) = [ln for ln in mps_log(tmp_path) if ln[0] == "start"]  # one node, one daemon
    pipe = start[2]
    rows = [ln.split() for ln in (tmp_path / "run" / "placement.txt").read_text().splitlines()]
    # worker name -> (role, its planned GPU slot, its "mps %"), from the table's role and index
    name_of = {"gen": gen_name, "learner": learner_name}
    table = {name_of[r[0]](int(r[1])): (r[0], r[4], r[5]) for r in rows if r and r[0] in name_of}
    envs = role_envs(tmp_path)
    assert set(envs) == set(table) == {"gen", "gen1", "learner", "learner1"}, rows
    by_gpu: dict[str, list[str]] = {}
    for name, (role, slot, quota) in sorted(table.items()):
        # no CUDA_VISIBLE_DEVICES on the node: slot i is device i
        assert envs[name]["CUDA_VISIBLE_DEVICES"] == slot, (name, envs[name], rows)
        assert envs[name]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == quota == "50", envs[name]
        assert envs[name]["CUDA_MPS_PIPE_DIRECTORY"] == pipe, envs[name]
        by_gpu.setdefault(envs[name]["CUDA_VISIBLE_DEVICES"], []).append(role)
    assert envs["learner"]["CUDA_VISIBLE_DEVICES"] != envs["learner1"]["CUDA_VISIBLE_DEVICES"]
    assert by_gpu == {"0": ["gen", "learner"], "1": ["gen", "learner"]}, envs


@pytest.mark.slow  # 1.5-3 min on a loaded 2-core machine; make test-slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "driver_kill"])
def test_no_daemon_is_left_after_the_driver_is_stopped_or_killed(tmp_path, sig):
    """The no-orphan rule of tests/test_faults.py for the MPS daemon: after SIGTERM the driver
    quits it; after SIGKILL (nothing of the driver runs) the keeper quits it when its pipe
    closes."""
    env = fake_gpu_layer(tmp_path)
    proc = subprocess.Popen(
        command(tmp_path, iterations=10_000),
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not (tmp_path / "run" / "gpu_env.jsonl").exists():
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the roles never started"
            time.sleep(0.2)
        (start,) = [ln for ln in mps_log(tmp_path) if ln[0] == "start"]
        assert alive(int(start[1]))
        proc.send_signal(sig)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert gone_within([int(start[1])], 20) == [], "the MPS daemon outlived the run"
    assert ["quit", start[2]] in mps_log(tmp_path)


@pytest.mark.slow  # 1.5-3 min on a loaded 2-core machine; make test-slow
def test_without_mps_the_run_warns_once_names_the_fix_and_records_time_slicing(tmp_path):
    p = run_train(tmp_path, fake_gpu_layer(tmp_path, mps=False))
    assert p.returncode == 0, p.stderr[-3000:]
    said = p.stdout + p.stderr  # the run's log goes to stdout (Hydra's console handler)
    warned = [ln for ln in said.splitlines() if "time-slice the GPU" in ln]
    assert len(warned) == 1, said[-3000:]
    assert "nvidia-cuda-mps-control" in warned[0] and "enable MIG" in warned[0]
    envs = role_envs(tmp_path)
    assert envs["gen"]["CUDA_MPS_PIPE_DIRECTORY"] is None
    assert sharing_param(tmp_path) == "time-sliced"


# --- refused before any work ------------------------------------------------------------------
G1 = ["scheduler=ebrl", "+axis/scale=g1", "gpu=h100", "scheduler.device=cpu"]
FAKE_H100 = MachineFacts(where="the test machine", gpus=(H100,), cuda=False, cpus=16)


def refused(overrides: list[str], *words: str, on: MachineFacts = FAKE_H100) -> str:
    with pytest.raises(ConfigError) as e:
        _refuse_unwired_resources(validate(make_cfg(overrides), machine=on))
    for w in words:
        assert w in str(e.value), f"{w!r} not in: {e.value}"
    return str(e.value)


def test_quotas_past_one_gpu_are_refused_naming_both_keys():
    refused(
        [*G1, "resources.gen_sm_pct=70", "resources.train_sm_pct=40"],
        "resources.gen_sm_pct=70",
        "resources.train_sm_pct=40",
        "110%",
        "at most 100",
    )


def test_an_unpinned_quota_counts_as_the_roles_share():
    refused([*G1, "resources.gen_sm_pct=60"], "resources.gen_sm_pct=60", "train_sm_pct=50")


def test_a_quota_for_a_role_without_a_gpu_is_refused():
    refused(
        ["scheduler=ebrl", "gpu=h100", "scheduler.device=cpu", "resources.gen_sm_pct=50"],
        "resources.gen_sm_pct=50",
        "scheduler.gen_gpus=0",
        "scale.gen_gpus",
    )


@pytest.mark.parametrize("pct", [0, 101])
def test_a_quota_outside_0_100_is_refused(pct):
    with pytest.raises(ConfigError, match=rf"resources.gen_sm_pct={pct}"):
        validate(make_cfg([*G1, f"resources.gen_sm_pct={pct}"]), machine=FAKE_H100)


def test_pinned_quotas_that_fit_are_taken_under_ebrl_and_its_baselines():
    for sched in ("ebrl", "async", "hybrid"):
        over = ["+axis/scale=g1", "gpu=h100", f"scheduler={sched}"]
        over += ["resources.gen_sm_pct=70", "resources.train_sm_pct=30"]
        run = validate(make_cfg(over), machine=MachineFacts(gpus=(H100,), cuda=True, cpus=16))
        _refuse_unwired_resources(run)


def test_gpu_shares_without_a_gpu_are_refused_before_any_work(tmp_path):
    """NVML sees no GPU: the run stops at the hardware check, naming the fix."""
    env = fake_gpu_layer(tmp_path, gpus="")
    p = run_train(tmp_path, env)
    assert p.returncode != 0
    assert "no NVIDIA GPU" in p.stderr and "gpu=cpu" in p.stderr, p.stderr[-2000:]
    assert not (tmp_path / "mlflow" / "mlflow.db").exists() or sharing_param_absent(tmp_path)
    assert mps_log(tmp_path) == []


def sharing_param_absent(tmp_path: Path) -> bool:
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    return all(e.name == "Default" for e in client.search_experiments())


# --- a Ray cluster of two nodes ---------------------------------------------------------------
@pytest.mark.slow  # a 2-node Ray cluster and a run: ~3 min on a loaded 2-core machine
def test_on_a_two_node_cluster_every_machine_has_one_daemon_and_every_gpu_role_its_pipe(
    tmp_path, monkeypatch
):
    """The driver joins a cluster (``scheduler.ray_address``) whose two nodes declare a GPU
    each: roles with SM quotas land on both. Both Ray nodes are this machine, which has one MPS
    daemon per user: one keeper starts it and the roles of both nodes join it.

    The cluster runs without token authentication, said explicitly (Ray 2.60 decides an unset
    mode by whether a token file exists, which earlier tests may have left), and the driver
    has no ``RAY_AUTH_MODE`` of its own, as a user joining such a cluster: the run must not
    force a token on it."""
    from ray.cluster_utils import Cluster

    env = fake_gpu_layer(tmp_path)
    env.pop("RAY_AUTH_MODE", None)
    for key in ("PATH", "FAKE_MPS_LOG"):  # the nodes' raylets, and so the keepers, see these
        monkeypatch.setenv(key, env[key])
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the cluster's processes read it
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "num_gpus": 1})
    cluster.add_node(num_cpus=2, num_gpus=1)
    try:
        p = run_train(
            tmp_path,
            env,
            f"scheduler.ray_address={cluster.address}",
            "scale.gen_replicas=2",  # the learner and one replica on one node, one on the other
        )
        assert p.returncode == 0, p.stderr[-3000:]
    finally:
        cluster.shutdown()
    rows = [ln.split() for ln in (tmp_path / "run" / "placement.txt").read_text().splitlines()]
    nodes = {r[2] for r in rows if r and r[0] in ("gen", "learner")}
    assert len(nodes) == 2, rows  # GPU roles on both nodes
    log = mps_log(tmp_path)
    starts = [ln for ln in log if ln[0] == "start"]
    assert len(starts) == 1, log
    _, pid, pipe = starts[0]
    assert ["quit", pipe] in log and gone_within([int(pid)], 10) == []
    envs = role_envs(tmp_path)
    assert set(envs) == {"gen", "gen1", "learner"}
    assert {e["CUDA_MPS_PIPE_DIRECTORY"] for e in envs.values()} == {pipe}
    assert {e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] for e in envs.values()} == {"50"}


# --- Algorithm 1 over the SMs ----------------------------------------------------------------
#: a GPU stage profile shipped with the planner (pi0 on an H100 at shares 0.25, 0.5, 1)
GPU_PROFILE = ROOT / "conf" / "plan" / "example_gpu_profile.json"


def run_params(tmp_path: Path) -> tuple[dict[str, str], object, str]:
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name != "Default"]
    (run,) = client.search_runs([exp.experiment_id])
    return run.data.params, client, run.info.run_id


@pytest.mark.slow  # Ray, four roles, a generator restarted: 2-3 min on a loaded 2-core machine
def test_unpinned_quotas_are_algorithm_1s_and_a_drift_re_split_restarts_the_generator_with_its_new_quota(  # noqa: E501
    tmp_path,
):
    """``resources.gpu_profile`` names the GPU stage profile; the quotas are unpinned, so
    Algorithm 1 splits the GPU's SMs from it. The roles here run on the cores
    (``scheduler.device=cpu``), far from the profile's GPU rates: the stages diverge from the
    planned rates by more than 15% for the run's window, Algorithm 1 searches again on the
    rescaled profile and the generator is restarted with its new quota (the new process's own
    environment, read inside it, says so). Every env step is counted once across it."""
    from ebrl.ledger import account

    # the generator's counters reach the driver once per weights version it acts with (about
    # every other update here): 16 updates give the monitors their window after the warm-up
    iters = 16
    p = run_train(tmp_path, fake_gpu_layer(tmp_path), f"resources.gpu_profile={GPU_PROFILE}",
                  iterations=iters, timeout=480)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    params, client, run_id = run_params(tmp_path)
    assert params["gpu/sharing"] == "mps" and params["gpu/split"] == "algorithm1"
    start = {"gen": params["gpu/gen_sm_pct"], "learner": params["gpu/train_sm_pct"]}
    assert int(start["gen"]) + int(start["learner"]) == 100
    assert start != {"gen": "50", "learner": "50"}  # not the roles' GPU shares
    rows = [json.loads(ln) for ln in (tmp_path / "run" / "gpu_env.jsonl").read_text().splitlines()]
    gens = [r for r in rows if r["worker"] == "gen"]
    (learner,) = [r for r in rows if r["worker"] == "learner"]
    assert gens[0]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == start["gen"]
    assert learner["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == start["learner"]
    # the re-splits: each restarted the generator, in a new process, with the new quota
    resplits = [
        json.loads(ln) for ln in (tmp_path / "run" / "gpu_resplits.jsonl").read_text().splitlines()
    ]
    assert resplits, "no re-split"
    said = [ln for ln in (p.stdout + p.stderr).splitlines() if "GPU" in ln or "MPS" in ln]
    assert len(gens) == 1 + len(resplits), "\n".join(said)[-3000:]
    for before, after, r in zip(gens[:-1], gens[1:], resplits, strict=True):
        assert r["new"]["gen"] != r["old"]["gen"] and r["stage"] in ("gen", "train")
        assert after["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(r["new"]["gen"])
        assert after["pid"] != before["pid"]
        assert after["CUDA_MPS_PIPE_DIRECTORY"] == before["CUDA_MPS_PIPE_DIRECTORY"]
    assert r["old"]["gen"] == int(start["gen"]) or len(resplits) > 1
    first = params["gpu/resplit1"]
    assert f"gen {resplits[0]['old']['gen']}% -> {resplits[0]['new']['gen']}%" in first
    assert f"{resplits[0]['stage']} drifted" in first
    history = client.get_metric_history(run_id, "gpu/resplit_s")
    assert len(history) == len(resplits) and all(m.value > 0 for m in history)
    # not a fault, and every env step counted once
    assert {m.value for m in client.get_metric_history(run_id, "fault/gen_restarts")} == {0.0}
    import torch

    ckpt = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert ckpt["trained_env_steps"] == summary["env_steps"]
    acc = account(tmp_path / "run", iters)
    assert acc.collected - acc.discarded == acc.trained == ckpt["trained_env_steps"]
    mlflow_record = {k: v for k, v in params.items() if k.startswith("gpu/")}
    print(f"RESPLITS {resplits}\nMLFLOW {mlflow_record} gpu/resplit_s {[m.value for m in history]}")


# --- MIG where MPS is not there ---------------------------------------------------------------
@pytest.mark.slow  # Ray and four roles: 2-3 min on a loaded 2-core machine; make test-slow
def test_without_mps_a_gpu_in_mig_mode_gives_each_role_the_instance_closest_to_its_quota(
    tmp_path,
):
    """No ``nvidia-cuda-mps-control`` on PATH; NVML shows the H100 in MIG mode with instances of
    16, 32 and 60 SMs (12%, 24%, 45% of 132). The generator's and the learner's 50% quotas
    (their GPU shares) get the two closest instances: 60 SMs, then 32. No time-slicing
    warning: MIG enforces the split."""
    env = fake_gpu_layer(tmp_path, mps=False, mig="16:10,32:20,60:40")
    p = run_train(tmp_path, env)
    assert p.returncode == 0, p.stderr[-3000:]
    said = p.stdout + p.stderr
    assert "time-slice the GPU" not in said
    envs = role_envs(tmp_path)
    assert envs["gen"]["CUDA_VISIBLE_DEVICES"] == "MIG-fake-0-2", envs
    assert envs["learner"]["CUDA_VISIBLE_DEVICES"] == "MIG-fake-0-1", envs
    assert envs["gen"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] is None  # no MPS quota: MIG's
    assert sharing_param(tmp_path) == "mig"
    assert mps_log(tmp_path) == []
