"""Evaluation on every task and on the suite's fixed initial states (LIBERO's standard: 50 per
task), whatever initial states the run trained from (``eval.init_states``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException

from ebrl.config import EvalInitStates, validate
from ebrl.envs.base import reset_seed
from ebrl.envs.fake import CountingEnv
from ebrl.envs.libero import FIXED_STATES
from ebrl.evaluate import EVAL_STREAM, episode_plan, evaluate
from ebrl.hardware import MachineFacts
from ebrl.stages.factory import StageFactory
from tests.conftest import make_cfg

#: LIBERO-Object trained from sampled layouts on every task, a small MLP (composing the shipped
#: config imports no LIBERO)
LIBERO = [
    "simulator=libero",
    "simulator.task=libero_object",
    "simulator.init_states=sampled",
    "policy=mlp",
    "policy.hidden=16",
    "policy.layers=1",
    "chunk_size=2",
]


class _Recorder:
    """Stands in for the simulator: what each env was built with and reset from."""

    def __init__(self) -> None:
        self.built: list[tuple[int, str]] = []  # (env id, simulator.init_states)
        self.resets: list[tuple[int, int]] = []  # (env id, seed)

    def make_env(self, factory: StageFactory, env_id: int, probe: bool = False) -> CountingEnv:
        self.built.append((env_id, str(factory.cfg["simulator"]["init_states"])))
        env = CountingEnv(env_id=env_id, episode_len=2, obs_dim=5, action_dim=7)
        reset = env.reset

        def recorded(seed: int):
            self.resets.append((env_id, int(seed)))
            return reset(seed)

        env.reset = recorded  # type: ignore[method-assign]
        return env


def _run(monkeypatch, tmp_path, episodes: int, *extra: str, init_states: str = "auto"):
    cfg = make_cfg([*LIBERO, *extra], tmp_path)
    factory = StageFactory.from_config(cfg)
    rec = _Recorder()
    monkeypatch.setattr(StageFactory, "make_env", lambda f, i, probe=False: rec.make_env(f, i))
    pol = factory.with_spec(CountingEnv(env_id=0, obs_dim=5, action_dim=7).spec).policy()
    res = evaluate(
        factory, pol.get_weights(), episodes=episodes, num_envs=8, init_states=init_states
    )
    return res, rec


def test_task_all_evaluates_every_task_not_only_the_first_num_envs(monkeypatch, tmp_path):
    res, rec = _run(monkeypatch, tmp_path, 20)
    assert {env_id % 10 for env_id, _ in rec.built} == set(range(10))
    assert res.per_task == {t: (2, 2) for t in range(10)}
    assert res.episodes == 20


def test_a_run_trained_on_sampled_layouts_is_evaluated_on_the_fixed_states(monkeypatch, tmp_path):
    res, rec = _run(monkeypatch, tmp_path, 30)
    assert res.fixed_states
    assert {mode for _, mode in rec.built} == {"suite"}  # the adapter's fixed initial states
    # task t plays its fixed states 0, 1, 2 (state i is reset seed i)
    for t in range(10):
        assert sorted(s for i, s in rec.resets if i % 10 == t) == [0, 1, 2]


def test_one_task_plays_its_fifty_fixed_states(monkeypatch, tmp_path):
    res, rec = _run(monkeypatch, tmp_path, FIXED_STATES, "simulator.task_id=3")
    assert sorted(s for _, s in rec.resets) == list(range(FIXED_STATES))
    assert res.fixed_states and res.per_task == {}


def test_train_keeps_the_runs_own_starts_from_the_evaluation_stream(monkeypatch, tmp_path):
    res, rec = _run(monkeypatch, tmp_path, 4, "simulator.task_id=3", init_states="train")
    assert not res.fixed_states
    assert {mode for _, mode in rec.built} == {"sampled"}
    assert sorted(s for _, s in rec.resets) == sorted(
        reset_seed(0, EVAL_STREAM + e, 0) for e in range(4)
    )


def test_more_episodes_than_fixed_states_are_refused(tmp_path):
    cfg = make_cfg([*LIBERO, "simulator.task_id=0"], tmp_path)
    with pytest.raises(ValueError, match=r"eval\.episodes=51.*set eval\.episodes <= 50"):
        episode_plan(cfg, 51, 8)
    with pytest.raises(ValueError, match=r"eval\.episodes <= 500"):
        episode_plan(make_cfg(LIBERO, tmp_path), 501, 8)


def test_fixed_is_refused_where_the_simulator_has_none(tiny_cfg):
    with pytest.raises(ValueError, match=r"eval\.init_states=fixed.*set eval\.init_states=auto"):
        episode_plan(tiny_cfg(), 4, 2, "fixed")
    with pytest.raises(ValueError, match="choose one of auto, fixed, train"):
        episode_plan(tiny_cfg(), 4, 2, "suite")


def test_auto_on_a_simulator_without_fixed_states_is_the_old_stream(tiny_cfg):
    plan = episode_plan(tiny_cfg(), 5, 2)
    assert not plan.fixed and plan.simulator == {}
    (cohort,) = plan.cohorts
    assert cohort.env_ids == (0, 1)
    assert cohort.seeds == tuple(reset_seed(0, EVAL_STREAM + e, 0) for e in range(5))


def test_the_export_carries_each_runs_evaluation_episodes_for_wilson(tiny_cfg, tmp_path):
    """A success rate's Wilson interval counts episodes: the run logs how many it evaluated,
    and the export has them beside the rate (analysis.tables.TRIALS)."""
    pytest.importorskip("mlflow")
    from analysis.export import export_runs
    from ebrl.train import train

    train(tiny_cfg(["eval.episodes=3"]))
    runs = export_runs(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}", ["ebrl"]).runs
    assert runs["eval_success_rate"].tolist() == [1.0]
    assert runs["eval_episodes"].tolist() == [3]


def test_a_misspelt_init_states_is_refused_at_composition_naming_key_value_and_choices():
    """``eval.init_states`` is a choice (:class:`EvalInitStates`): Hydra refuses any other value
    while composing, before any work, with the key, the value and the choices."""
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg(["eval.init_states=fixd"])
    said = f"{e.value} {e.value.__cause__}"
    assert "eval.init_states" in said and "'fixd'" in said, said
    assert "expected one of [auto, fixed, train]" in said, said


@pytest.mark.parametrize("value", ["auto", "fixed", "train"])
def test_every_init_states_value_composes_and_plans_as_before(value, tmp_path):
    cfg = make_cfg([*LIBERO, f"eval.init_states={value}"], tmp_path)
    run = validate(cfg, machine=MachineFacts(where="a 2-core CPU machine", cpus=2))
    assert run.eval.init_states is EvalInitStates(value) and run.eval.init_states == value
    plan = episode_plan(cfg, 2, 2, run.eval.init_states)
    assert plan.fixed == (value != "train")  # LIBERO has fixed states: auto takes them


def test_train_refuses_a_misspelt_init_states_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    train = [sys.executable, "-m", "ebrl.train", "eval.init_states=fixd"]
    proc = subprocess.run(
        [*train, "tracking.enabled=false", f"run_dir={run_dir}", f"hydra.run.dir={tmp_path}/h"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=300,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "eval.init_states=fixd" in said and "expected one of [auto, fixed, train]" in said, said
    assert not run_dir.exists() or not any(run_dir.iterdir())  # nothing ran
