"""``python -m ebrl.launch --dry-run``: the Slurm jobs a sweep would submit, nothing submitted."""

from __future__ import annotations

import json

import pytest

from ebrl.launch import cli
from ebrl.launch.check import CONF_DIR, compose_config
from ebrl.launch.sweep import expand, hydra_command, plan

#: the headline sweep narrowed to one policy/simulator/scheduler: its two GPU types remain
HEADLINE = ["headline_full", "policy=pi0", "simulator=libero_vla", "scheduler=ebrl"]


def dry_run(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["--dry-run", *args])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def headline_plan() -> dict:
    """The JSON plan (composing is the slow part: once per module)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert cli.main(["--dry-run", "--json", *HEADLINE]) == 0
    return json.loads(buf.getvalue())


def test_options_may_stand_between_the_sweep_and_its_overrides(capsys, tmp_path):
    """The Makefile's paper targets call ``launch <sweep> --out DIR <overrides>``."""
    sweep, *overrides = HEADLINE
    code = cli.main([sweep, "--out", str(tmp_path / "o"), "--dry-run", "--json", *overrides])
    assert code == 0
    got = json.loads(capsys.readouterr().out)
    assert got["n_jobs"] == 10 and str(tmp_path / "o") in json.dumps(got)


def test_headline_has_one_array_per_gpu_type(headline_plan):
    arrays = {a["label"]: a for a in headline_plan["arrays"]}
    assert set(arrays) == {"gpu=h100", "gpu=a100"}
    assert headline_plan["n_jobs"] == 10 and not headline_plan["errors"]
    for gpu, a in (("h100", arrays["gpu=h100"]), ("a100", arrays["gpu=a100"])):
        flags = set(a["sbatch"])
        assert {
            f"--constraint={gpu}",
            "--partition=gpu",
            "--gpus-per-node=8",
            "--cpus-per-task=96",
            "--nodes=1",
            "--ntasks-per-node=1",
            "--time=60",
            "--array=0-4%5",  # 5 seeds, all at once (array_parallelism 32)
            "--requeue",
            "--exclusive",
            "--job-name=headline-full",
        } <= flags, flags
        assert not any(f.startswith("--gres") for f in flags)
        seeds = sorted(j["overrides"][-1] for j in a["jobs"])
        assert seeds == [f"seed={s}" for s in range(5)]
        assert all(f"gpu={gpu}" in j["overrides"] for j in a["jobs"])
        # the multirun that submits exactly this array
        cmd = a["command"]
        assert cmd[:3] == ["-m", "ebrl.train", "+sweep=headline_full"]
        assert f"gpu={gpu}" in cmd and "seed=0,1,2,3,4" in cmd
        assert cmd[-1].startswith("hydra.sweep.dir=") and cmd[-1].endswith(f"gpu-{gpu}")


def test_text_output_shows_sbatch_lines_and_commands(capsys):
    code, out = dry_run(capsys, *HEADLINE, "seed=0")
    assert code == 0
    assert "dry run, nothing submitted" in out and "2 Slurm job array(s)" in out
    assert "#SBATCH --constraint=h100" in out and "#SBATCH --constraint=a100" in out
    assert "#SBATCH --gpus-per-node=8" in out and "#SBATCH --array=0-0%1" in out
    assert "python -m ebrl.train +sweep=headline_full hydra.mode=RUN policy=pi0" in out


def test_gres_style_and_multi_node_scaling(capsys):
    code, out = dry_run(capsys, *HEADLINE, "seed=0", "gpu=a100", "launcher=slurm_gres")
    assert code == 0
    assert "#SBATCH --gres=gpu:a100:8" in out
    assert "--gpus-per-node" not in out and "--constraint" not in out
    code, out = dry_run(capsys, "scaling_full", "+axis/scale=g1,g16", "scheduler=ebrl", "seed=0")
    assert code == 0 and "2 Slurm job array(s)" in out
    assert "#SBATCH --nodes=2" in out and "#SBATCH --gpus-per-node=1" in out


def test_a_job_that_cannot_run_is_reported_not_submitted(capsys):
    code, out = dry_run(
        capsys,
        "headline_full",
        "policy=dreamzero",
        "simulator=libero_vla",
        "scheduler=ebrl",
        "seed=0",
        "gpu=rtx4090",
    )
    assert code == 1
    assert "fail validation" in out and "policy=dreamzero" in out and "GiB" in out


PAPER_CHECKPOINTS = (
    ("pi0", "RLinf/RLinf-Pi0-LIBERO-Spatial-Object-Goal-SFT"),
    ("gr00t", "RLinf/RLinf-Gr00t-SFT-Spatial"),
    ("openvla_oft", "RLinf/Openvla-oft-SFT-libero10-trajall"),
)


def test_a_dry_run_without_checkpoints_previews_the_jobs_and_lists_each_checkpoint_once(
    capsys, monkeypatch
):
    """headline_full's three VLAs (DreamZero is out: RLinf 0.3 cannot train it) on a fresh
    clone, without EBRL_CHECKPOINTS: the preview still shows every job (exit 0), and the
    checkpoints to fetch before submitting come once each, with the command that fetches it,
    not once per job."""
    monkeypatch.delenv("EBRL_CHECKPOINTS")
    code, out = dry_run(
        capsys, "headline_full", "simulator=libero_vla", "scheduler=ebrl", "seed=0,1", "gpu=h100"
    )
    assert code == 0, out
    assert "sweep headline_full: 6 jobs in 1 Slurm job array(s)" in out
    assert "fail validation" not in out and "is not given" not in out
    assert "3 checkpoint(s) to fetch before submitting" in out
    for policy, hub in PAPER_CHECKPOINTS:
        fetch = f"huggingface-cli download {hub} --local-dir $EBRL_CHECKPOINTS/"
        assert out.count(fetch) == 1, (policy, out)
        assert f"{hub} (policy={policy}, 2 jobs)" in out
    assert "policy=dreamzero" not in out


def test_the_json_preview_names_the_checkpoints_to_fetch_and_their_jobs(capsys, monkeypatch):
    monkeypatch.delenv("EBRL_CHECKPOINTS")
    code, out = dry_run(capsys, "--json", *HEADLINE, "seed=0", "gpu=h100")
    got = json.loads(out)
    assert code == 0 and got["n_jobs"] == 1 and not got["errors"]
    (fetch,) = got["checkpoints_to_fetch"]
    assert fetch["hub"] == PAPER_CHECKPOINTS[0][1] and fetch["jobs"] == [0]
    assert fetch["command"].startswith("huggingface-cli download RLinf/RLinf-Pi0-LIBERO")


def test_submitting_for_real_still_refuses_missing_checkpoints(capsys, monkeypatch):
    monkeypatch.delenv("EBRL_CHECKPOINTS")
    monkeypatch.setattr(cli, "start_sweep_runs", lambda *a: pytest.fail("started a run"))
    monkeypatch.setattr(cli, "_run_arrays", lambda *a: pytest.fail("submitted"))
    code = cli.main([*HEADLINE, "seed=0", "gpu=h100"])
    captured = capsys.readouterr()
    assert code == 1
    assert "1 checkpoint(s) to fetch before submitting" in captured.out
    assert "not launched: fetch the checkpoints above first" in captured.err


def test_a_checkpoint_given_is_not_listed(capsys, monkeypatch):
    """With EBRL_CHECKPOINTS set, the Slurm node's paths are not known from here: nothing to
    fetch is claimed."""
    monkeypatch.setenv("EBRL_CHECKPOINTS", "/ckpt")
    code, out = dry_run(capsys, *HEADLINE, "seed=0", "gpu=h100")
    assert code == 0 and "to fetch" not in out


def test_a_warning_validate_gives_every_job_is_printed_once(capsys, monkeypatch, caplog):
    import logging

    monkeypatch.delenv("EBRL_CHECKPOINTS")
    with caplog.at_level(logging.WARNING, logger="ebrl.config"):
        code, _ = dry_run(
            capsys,
            "headline_full",
            "policy=pi0",
            "simulator=libero_vla",
            "seed=0",
            "scheduler=hybrid,ebrl",
            "scale.gen_gpus=0",  # the policy on the CPU, let through: validate() warns
            "scale.learner_gpus=0",
            "launcher.allow_idle_gpus=true",
        )
    shares = [r for r in caplog.records if "ask for no GPU share" in r.getMessage()]
    assert code == 0
    assert sorted(r.getMessage().split(",")[0] for r in shares) == ["gpu=a100", "gpu=h100"]


def test_cpu_sweep_runs_here(capsys):
    code, out = dry_run(capsys, "smoke")
    assert code == 0
    assert "6 jobs" in out and "no Slurm job" in out and "#SBATCH" not in out


def test_unknown_sweep_names_the_choices():
    with pytest.raises(SystemExit, match="headline"):
        cli.main(["--dry-run", "no_such_sweep"])


def _expand_command(cmd: list[str]) -> list[list[str]]:
    """The jobs Hydra's basic sweeper makes of a multirun command line (its params cleared)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    i = cmd.index("hydra.sweeper.params=null")
    args = [o for o in cmd[i + 1 :] if not o.startswith("hydra.sweep.dir=")]
    (jobs,) = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)
    return jobs


@pytest.mark.parametrize(
    "argv",
    [
        ["grpo"],
        ["grpo", "scheduler=ebrl", "seed=0,1", "tracking.experiment=x"],
        ["scaling_full", "scheduler=ebrl", "seed=0"],
        ["headline_full", "policy=pi0", "simulator=libero_vla", "scheduler=ebrl"],
    ],
)
def test_the_multirun_puts_every_axis_after_the_sweep_and_expands_to_the_planned_jobs(argv):
    p = plan(argv[0], argv[1:])
    for a in p.arrays:
        cmd = hydra_command(p, a)[1:]
        assert cmd[:4] == ["-m", "ebrl.train", f"+sweep={argv[0]}", "hydra.sweeper.params=null"]
        assert _expand_command(cmd) == [list(j.overrides) for j in a.jobs]


def _leaves(node, prefix: str = "") -> dict[str, object]:
    from omegaconf import DictConfig

    out: dict[str, object] = {}
    for k, v in node.items():
        if k == "defaults":
            continue
        if isinstance(v, DictConfig):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("name", ["grpo", "grpo_full", "ablation", "scaling_full"])
def test_every_axis_config_is_in_force_in_its_jobs(name):
    """What an ``+axis/...`` file sets is what its job runs with (not the sweep's base)."""
    from pathlib import Path

    from omegaconf import OmegaConf

    conf = Path(CONF_DIR)
    _, jobs = expand(name, [])
    seen = set()
    for job in jobs:
        axis = next(o for o in job if o.startswith("+axis/"))
        if axis in seen:
            continue
        seen.add(axis)
        group, value = axis.removeprefix("+").split("=", 1)
        want = _leaves(OmegaConf.load(conf / group / f"{value}.yaml"))
        cfg = compose_config([f"+sweep={name}", *job])  # the order the multirun composes in
        for key, v in want.items():
            assert OmegaConf.select(cfg, key) == v, f"{name} {axis}: {key}"
        override = next(
            (
                d["override /algo"]
                for d in OmegaConf.load(conf / group / f"{value}.yaml").get("defaults", [])
                if isinstance(d, dict) and "override /algo" in d
            ),
            None,
        )
        if override is not None:  # the algorithm the axis names is the one that runs
            assert cfg.algo._target_.split(".")[-2] == override, f"{name} {axis}"
    assert len(seen) >= 3


def test_train_refuses_an_axis_before_its_sweep():
    from ebrl.config import ConfigError
    from ebrl.train import check_override_order

    check_override_order(["+sweep=grpo", "+axis/algo=grpo_g4", "seed=0"])
    check_override_order(["+axis/algo=grpo_g4"])  # no sweep: nothing to lose to
    check_override_order([])
    with pytest.raises(
        ConfigError, match=r"\+axis/algo=grpo_g4 comes before \+sweep=grpo.*ebrl\.launch"
    ):
        check_override_order(["+axis/algo=grpo_g4", "scheduler=sync", "+sweep=grpo"])


# --- every GPU a job reserves is used (issue 43) -----------------------------------------------
def test_the_full_size_jobs_on_ebrls_workers_use_every_gpu_they_reserve(capsys):
    code, out = dry_run(capsys, "headline_full", "policy=pi0", "gpu=h100", "seed=0")
    assert code == 0  # Colocated included: a rank per GPU (below)
    assert "GPUs used 8 of 8 asked; per GPU: 1 gen + 1 learner (x8); per node: 64 env" in out
    for sched in ("Colocated", "Hybrid", "Async", "EBRL"):  # each job's roles are printed
        assert f"scheduler={sched.lower()} seed=0" in out
    assert out.count("GPUs used 8 of 8 asked") == 4
    assert "computes on the CPU" not in out


def test_colocated_on_eight_gpus_runs_a_rank_per_gpu(capsys):
    """RLinf's Colocated over the job's 8 GPUs: 8 ranks, each a GPU of its own with 1/8 of the
    envs, a generator and a learner rank (baselines/colocated_ranks.py)."""
    args = ("headline_full", "policy=pi0", "gpu=h100", "scheduler=colocated", "seed=0")
    code, out = dry_run(capsys, *args)
    assert code == 0
    assert (
        "roles: 8 Colocated ranks, each 32 envs + a generator + a learner rank, in turn; GPUs "
        "used 8 of 8 asked; per GPU: 1 colocated (x8); per node: 8 Colocated ranks (x1)"
    ) in out
    # fewer ranks than GPUs leaves some idle: refused, naming the fix
    code, out = dry_run(capsys, *args, "scheduler.ranks=4")
    assert code == 1 and "its 4 Colocated ranks use 4 of the 8 GPUs it reserves" in out
    assert "+axis/scale=g8" in out and "launcher.allow_idle_gpus=true" in out
    # one process on 8 GPUs: refused, naming the ranks that use them
    code, out = dry_run(capsys, *args, "scheduler.ranks=1")
    assert code == 1
    assert "ColocatedScheduler runs every stage in one process: it would compute on 1 GPU of " \
        "the 8 this job reserves" in out  # fmt: skip
    assert "scheduler.ranks=8" in out and "launcher.allow_idle_gpus=true" in out
    code, out = dry_run(capsys, *args, "scheduler.ranks=1", "launcher.allow_idle_gpus=true")
    assert code == 0 and "GPUs used 1 of 8 asked" in out


def test_a_gpu_job_whose_policy_would_compute_on_the_cpu_is_refused(capsys):
    args = ("headline_full", "policy=pi0", "gpu=h100", "scheduler=ebrl", "seed=0")
    code, out = dry_run(capsys, *args, "scale.gen_gpus=0", "scale.learner_gpus=0")
    assert code == 1 and "the policy would compute on the CPU cores" in out
    assert "+axis/scale=g8" in out and "launcher.allow_idle_gpus=true" in out
    code, out = dry_run(capsys, *args, "scale.gen_replicas=4", "scale.learner_ranks=4")
    assert code == 1 and "its roles use 4 of the 8 GPUs it reserves" in out
