"""Evaluation of final weights: whole episodes, counted exactly, on fresh envs; through train()."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from ebrl.config import ConfigError, validate
from ebrl.evaluate import evaluate
from ebrl.stages.factory import StageFactory
from ebrl.train import train


def _factory(tiny_cfg, *extra: str) -> StageFactory:
    return StageFactory.from_config(tiny_cfg(list(extra)))


def _weights(factory: StageFactory):
    env = factory.make_env(0)
    pol = factory.with_spec(env.spec).policy()
    pol.version = 7
    return pol.get_weights()


def test_counts_every_episode_and_its_success(tiny_cfg):
    f = _factory(tiny_cfg, "simulator.episode_len=5")
    res = evaluate(f, _weights(f), episodes=5, num_envs=2)
    assert res.episodes == 5 and res.successes == 5  # the fake env always ends in success
    assert res.success_rate == 1.0 and res.policy_version == 7 and res.deterministic
    assert res.mean_length == 5.0


def test_truncated_episodes_are_failures(tiny_cfg):
    f = _factory(tiny_cfg, "simulator.episode_len=5", "simulator.max_steps=3")
    res = evaluate(f, _weights(f), episodes=4, num_envs=8)
    assert (res.episodes, res.successes, res.mean_length) == (4, 0, 3.0)


def test_eval_needs_episodes(tiny_cfg):
    f = _factory(tiny_cfg)
    with pytest.raises(ValueError, match="episodes=0"):
        evaluate(f, _weights(f), episodes=0)


def test_train_evaluates_the_final_weights(tiny_cfg, tmp_path):
    s = train(tiny_cfg(["eval.episodes=3"]))
    assert s.eval_episodes == 3 and s.eval_success_rate == 1.0
    assert s.eval_policy_version == s.iterations  # the last update's weights
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_success_rate"] == 1.0


def test_eval_refuses_a_lagging_checkpoint(tiny_cfg):
    cfg = tiny_cfg(["eval.episodes=3", "checkpoint.every_iters=0"])
    with pytest.raises(ConfigError, match=r"checkpoint\.every_iters=1"):
        validate(cfg)
    assert OmegaConf.select(cfg, "eval.episodes") == 3


def test_learning_curve_from_snapshots(tiny_cfg, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    s = train(tiny_cfg(["eval.every_iters=1", "eval.curve_episodes=2"]))
    run_dir = tmp_path / "run"
    assert len(list((run_dir / "snapshots").glob("v*.pt"))) == s.iterations == 3
    curve = (run_dir / "eval_curve.csv").read_text().splitlines()
    assert curve[0] == "version,env_steps,wall_s,success"
    assert [int(r.split(",")[0]) for r in curve[1:]] == [1, 2, 3]
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert s.eval_steps_to_80 == metrics[0]["env/steps_total"]  # the fake env always succeeds
    assert s.eval_time_to_80 == metrics[0]["time/wall_s"]
    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ebrl").experiment_id])
    hist = client.get_metric_history(run.info.run_id, "eval/success_rate")
    assert sorted(h.step for h in hist) == [m["env/steps_total"] for m in metrics]


def test_late_eval_reevaluates_a_finished_runs_late_policies(tiny_cfg, tmp_path):
    """benchmarks/late_eval.py: the last snapshots and the final weights, the final figure
    checked against the run's own, the result kept for reuse, a mismatch refused."""
    from benchmarks.late_eval import evaluate_run

    s = train(tiny_cfg(["eval.episodes=3", "eval.every_iters=1", "eval.curve_episodes=2"]))
    run_dir = tmp_path / "run"
    r = evaluate_run(run_dir, last=2, episodes=3)
    versions = sorted(int(v) for v in r["per_policy"])
    assert versions[-1] == s.eval_policy_version and len(versions) == 2  # final = last snapshot
    assert r["final"] == s.eval_success_rate == 1.0 and r["late"] == 1.0
    assert json.loads((run_dir / "late_eval.json").read_text())["late"] == r["late"]
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "eval_success_rate": 0.5}))
    assert evaluate_run(run_dir, last=2, episodes=3) == r  # kept: not evaluated again
    (run_dir / "late_eval.json").unlink()
    with pytest.raises(SystemExit, match="not the same measurement"):
        evaluate_run(run_dir, last=2, episodes=3)


def test_evaluations_on_two_processes_are_those_of_one(tiny_cfg, tmp_path):
    """eval.workers=2: the same curve and final figures, logged in the same order, as in the
    run's own process; each evaluation is one job, whichever process runs it."""
    from ebrl.config import RunConfig
    from ebrl.run.evaluation import EvalJob, run_jobs

    over = ["eval.episodes=3", "eval.every_iters=1", "eval.curve_episodes=2", "eval.workers=2"]
    cfg = tiny_cfg(over)
    s = train(cfg)
    run_dir = tmp_path / "run"
    curve = (run_dir / "eval_curve.csv").read_text().splitlines()
    assert [int(r.split(",")[0]) for r in curve[1:]] == [1, 2, 3]
    assert s.eval_episodes == 3 and s.eval_policy_version == s.iterations
    # the jobs' results on two processes and on one: equal, field for field but the time
    jobs = [EvalJob(str(p), 2) for p in sorted((run_dir / "snapshots").glob("v*.pt"))]
    jobs.append(EvalJob(str(run_dir / "checkpoint.pt"), 3))
    factory = StageFactory.from_config(cfg)
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, RunConfig)
    two = run_jobs(run, factory, jobs)
    run.eval.workers = 1
    one = run_jobs(run, factory, jobs)
    assert [(r.policy_version, r.episodes, r.successes, r.mean_return) for r in two] == [
        (r.policy_version, r.episodes, r.successes, r.mean_return) for r in one
    ]
    assert [r.policy_version for r in one] == [1, 2, 3, 3]
    assert len({r.mean_return for r in one}) > 1  # the weights differ, so do the returns


def test_a_failed_evaluation_process_fails_the_run_naming_the_error(tiny_cfg, tmp_path):
    from ebrl.run.evaluation import EvalJob, run_jobs

    cfg = tiny_cfg(["eval.workers=2"])
    run = OmegaConf.to_object(cfg)
    factory = StageFactory.from_config(cfg)
    missing = [EvalJob(str(tmp_path / "nowhere.pt"), 1)] * 2
    with pytest.raises(FileNotFoundError, match=r"nowhere\.pt"):
        run_jobs(run, factory, missing)


def test_eval_workers_must_be_positive(tiny_cfg):
    with pytest.raises(ConfigError, match=r"eval\.workers=0"):
        validate(tiny_cfg(["eval.workers=0"]))
