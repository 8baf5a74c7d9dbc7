"""The roles at scale in the config: one scale point sizes every scheduler on EBRL's workers, and
the dry run shows what each job places and how many of its GPUs that uses."""

from __future__ import annotations

from omegaconf import OmegaConf

from ebrl.job_gpus import roles_line

from .conftest import make_cfg


def job(overrides):
    return OmegaConf.to_container(make_cfg(overrides), resolve=True)


def test_a_scale_point_sizes_ebrl_hybrid_and_async_alike():
    for sched in ("ebrl", "hybrid", "async"):
        s = job([f"scheduler={sched}", "+axis/scale=g8"])["scheduler"]
        assert (s["sim_workers"], s["gen_replicas"], s["learner_ranks"]) == (64, 8, 8), sched
        assert (s["gen_gpus"], s["learner_gpus"]) == (0.5, 0.5), sched


def test_a_scheduler_setting_on_the_command_line_wins_over_the_scale_node():
    s = job(["scheduler=ebrl", "+axis/scale=g8", "scheduler.learner_ranks=3"])["scheduler"]
    assert s["learner_ranks"] == 3 and s["gen_replicas"] == 8


def test_the_default_run_has_one_of_each_role_on_the_cpu():
    s = job(["scheduler=ebrl"])["scheduler"]
    assert (s["sim_workers"], s["gen_replicas"], s["learner_ranks"]) == (2, 1, 1)
    assert (s["gen_gpus"], s["learner_gpus"]) == (0.0, 0.0)


def test_the_dry_run_line_counts_the_gpus_a_job_uses_against_those_it_asks_for():
    full = roles_line(job(["scheduler=ebrl", "+axis/scale=g16"]))
    assert "16 gen replica(s) x 0.5 GPU, 16 learner rank(s) x 0.5 GPU" in full
    assert "GPUs used 16 of 16 asked" in full and "set scheduler" not in full
    short = roles_line(job(["scheduler=ebrl", "launcher.gpus_per_node=4"]))
    assert "GPUs used 0 of 4 asked" in short and "set scheduler.gen_replicas" in short
    assert "runs every stage in one process" in roles_line(job(["scheduler=colocated"]))
