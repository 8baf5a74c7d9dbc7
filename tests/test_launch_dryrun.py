"""``python -m ebrl.launch --dry-run``: the Slurm jobs a sweep would submit, nothing submitted."""

from __future__ import annotations

import json

import pytest

from ebrl import launch

#: the headline sweep narrowed to one policy/simulator/scheduler: its two GPU types remain
HEADLINE = ["headline_full", "policy=pi0", "simulator=libero", "scheduler=ebrl"]


def dry_run(capsys, *args: str) -> tuple[int, str]:
    code = launch.main(["--dry-run", *args])
    return code, capsys.readouterr().out


@pytest.fixture(scope="module")
def headline_plan() -> dict:
    """The JSON plan (composing is the slow part: once per module)."""
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert launch.main(["--dry-run", "--json", *HEADLINE]) == 0
    return json.loads(buf.getvalue())


def test_options_may_stand_between_the_sweep_and_its_overrides(capsys, tmp_path):
    """The Makefile's paper targets call ``launch <sweep> --out DIR <overrides>``."""
    sweep, *overrides = HEADLINE
    code = launch.main([sweep, "--out", str(tmp_path / "o"), "--dry-run", "--json", *overrides])
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
        "simulator=libero",
        "scheduler=ebrl",
        "seed=0",
        "gpu=rtx4090",
    )
    assert code == 1
    assert "fail validation" in out and "policy=dreamzero" in out and "GiB" in out


def test_cpu_sweep_runs_here(capsys):
    code, out = dry_run(capsys, "smoke")
    assert code == 0
    assert "6 jobs" in out and "no Slurm job" in out and "#SBATCH" not in out


def test_unknown_sweep_names_the_choices():
    with pytest.raises(SystemExit, match="headline"):
        launch.main(["--dry-run", "no_such_sweep"])
