"""Resume under every scheduler: a second attempt in the same run folder continues the first.

The first attempt ends (here: its budget) after 3 updates; the second, given a budget of 8,
starts from the checkpoint. Every scheduler must then train 5 more updates on fresh data with
the staleness bound held (before the fix, EBRL's generator took segment ``i`` of an attempt to
be trained by learner version ``i``, so a resumed run ran ahead and hit ``StalenessError``), and
the counts must add up exactly: env steps logged = env steps trained (the checkpoint's ledger).
"""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from ebrl.ledger import account
from ebrl.stages.train import load_checkpoint
from ebrl.train import train

from .conftest import TINY, make_cfg

# (scheduler, extra overrides): every scheduler, both backends of the worker engine
CASES = {
    "sync": ["scheduler=sync"],
    "colocated": ["scheduler=colocated"],
    # RLinf's Colocated over two devices: two rank processes (Ray), the leader checkpoints
    "colocated-2ranks": ["scheduler=colocated", "scheduler.ranks=2"],
    "hybrid": ["scheduler=hybrid", "scheduler.backend=inprocess", "num_envs=4"],
    "async": ["scheduler=async", "scheduler.backend=inprocess"],
    "ebrl-threads": ["scheduler=ebrl", "scheduler.backend=inprocess"],
    "ebrl-k2": ["scheduler=ebrl", "scheduler.backend=inprocess", "scheduler.staleness=2"],
}


def _cfg(tmp_path, extra, iterations):
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    return make_cfg(
        [*over, *extra, f"budget.iterations={iterations}", "simulator.delay_s=0.001"], tmp_path
    )


def _rows(tmp_path):
    return [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]


#: cases that start Ray twice: make test-slow
SLOW = {"colocated-2ranks"}


@pytest.mark.parametrize(
    "case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW else c for c in CASES]
)
def test_a_second_attempt_continues_the_first(case, tmp_path):
    extra = CASES[case]
    first = train(_cfg(tmp_path, extra, 3))
    assert first.iterations == 3 and first.status == "FINISHED"
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ckpt["version"] == 3 and ckpt["trained_env_steps"] == first.env_steps

    second = train(_cfg(tmp_path, extra, 8))
    assert second.status == "FINISHED" and second.iterations == 8
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert ckpt["version"] == 8
    # every env step counted was trained on, and every trained one counted
    assert ckpt["trained_env_steps"] == second.env_steps
    # ... and the env workers' own record agrees: what they collected in segments a learner
    # version trained is exactly what the learner counted (the step ledger, ebrl.ledger)
    acc = account(tmp_path / "run", 8)
    assert len(acc.by_attempt) == 2 and acc.collected > 0
    assert acc.trained == ckpt["trained_env_steps"]
    assert second.collected_env_steps - second.discarded_env_steps == second.env_steps
    assert (second.collected_env_steps, second.discarded_env_steps) == (
        acc.collected,
        acc.discarded,
    )
    rows = _rows(tmp_path)
    assert [r["iteration"] for r in rows] == list(range(8))
    steps = [r["env/steps_total"] for r in rows]
    assert steps == sorted(steps) and len(set(steps)) == 8
    # the bound held in the resumed attempt (the learner raises StalenessError otherwise, and
    # its histogram has no bin past k)
    k = 2 if case == "ebrl-k2" else (1 if case in ("async", "ebrl-threads") else 0)
    for r in rows[3:]:
        assert all(r.get(f"pipeline/staleness_frac_{v}", 0.0) == 0.0 for v in range(k + 1, 9))


def test_a_finished_run_run_again_only_finishes(tmp_path, monkeypatch):
    """A requeued job whose budget is spent (a late USR2, a second requeue) starts no workers."""
    from ebrl.schedulers.sync import SyncScheduler

    cfg = _cfg(tmp_path, ["scheduler=sync"], 3)
    train(cfg)

    def run(self, ctx):
        pytest.fail("workers started")
        yield

    monkeypatch.setattr(SyncScheduler, "run", run)
    s = train(cfg)
    assert s.status == "FINISHED" and s.iterations == 3
    assert len(_rows(tmp_path)) == 3


def test_updates_checkpointed_but_never_logged_are_counted(tmp_path):
    """The driver died after the learner saved update 3 but before logging it."""
    cfg = _cfg(tmp_path, ["scheduler=sync"], 3)
    train(cfg)
    prog_path = tmp_path / "run" / "progress.json"
    prog = json.loads(prog_path.read_text())
    last = _rows(tmp_path)[-1]
    prog["iterations"], prog["env_steps"] = 2, int(last["env/steps_total"]) - 1  # wrong on purpose
    prog_path.write_text(json.dumps(prog))
    s = train(_cfg(tmp_path, ["scheduler=sync"], 5))
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint.pt")
    assert s.iterations == 5 and ckpt["trained_env_steps"] == s.env_steps
    import mlflow

    client = mlflow.tracking.MlflowClient(f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("ebrl").experiment_id])
    (gap,) = client.get_metric_history(run.info.run_id, "fault/unlogged_updates")
    assert gap.value == 1.0


def test_the_learner_continues_its_random_stream(tmp_path):
    """Minibatch shuffles after a resume are the ones the uninterrupted learner would draw."""
    from ebrl.stages.factory import StageFactory
    from ebrl.stages.train import save_learner

    cfg = make_cfg([*TINY, "tracking.enabled=false"])
    f = StageFactory.from_config(cfg)
    sim = f.sim([0, 1])
    f = f.with_spec(sim.group.spec)
    stage = f.train()
    torch.manual_seed(123)
    path = tmp_path / "ckpt.pt"
    save_learner(path, stage.algo, trained_env_steps=40)
    expected = torch.rand(5)
    torch.manual_seed(0)  # the resumed process starts elsewhere in the stream
    resumed = StageFactory(cfg=f.cfg, env_spec=f.env_spec, checkpoint=str(path)).train()
    assert torch.equal(torch.rand(5), expected)
    assert resumed.trained_env_steps == 40


def test_resumed_attempts_draw_fresh_initial_states_and_noise():
    from ebrl.envs.base import reset_seed
    from ebrl.stages.gen import noise_seed

    # a fresh run keeps its old streams (committed results stay reproducible) ...
    assert noise_seed(3, 5, 0) == 3 * 1_000_003 + 5
    # ... and each resumed attempt has its own
    seeds = {reset_seed(0, 1, 2, s) for s in range(4)}
    noise = {noise_seed(0, 1, s) for s in range(4)}
    assert len(seeds) == 4 and len(noise) == 4


def test_errors_survive_pickling():
    """A launcher unpickles a job's error: it must arrive as itself."""
    from ebrl.schedulers.base import StageError
    from ebrl.signals import Preempted

    e = pickle.loads(pickle.dumps(StageError("sim1", "its process died")))
    assert isinstance(e, StageError) and e.stage == "sim1" and "its process died" in str(e)
    p = pickle.loads(pickle.dumps(Preempted(15)))
    assert isinstance(p, Preempted) and p.signum == 15


def test_a_failed_job_fails_its_slurm_job(monkeypatch):
    """In a Slurm job, the job's exception leaves the launcher's call (Submitit then pickles it
    as an error and exits non-zero); a completed job's result is returned as it is."""
    from hydra.core.utils import JobReturn, JobStatus

    from ebrl.schedulers.base import StageError
    from hydra_plugins.ebrl_launcher.slurm_launcher import SlurmLauncher

    ret = JobReturn(status=JobStatus.FAILED, _return_value=StageError("learner", "died"))
    ok = JobReturn(status=JobStatus.COMPLETED, _return_value=3)
    returns = iter([ok, ret])
    # the class ours extends, as ours holds it: Hydra's plugin scan re-executes the plugin
    # modules (a fresh hydra_submitit_launcher module object), so an earlier test's scan can leave
    # the name in sys.modules bound to another copy of the same class
    base = SlurmLauncher.__bases__[0]
    assert base.__name__ == "SlurmLauncher" and "submitit_launcher" in base.__module__
    monkeypatch.setattr(base, "__call__", lambda self, *a, **k: next(returns))
    for k in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID"):  # a job of one task
        monkeypatch.delenv(k, raising=False)
    launcher = SlurmLauncher.__new__(SlurmLauncher)  # what runs inside the job: its __call__
    args = ([], "hydra.sweep.dir", 0, "1", {})
    assert launcher(*args) is ok
    with pytest.raises(StageError, match="stage 'learner' failed: died"):
        launcher(*args)


def test_the_slurm_launcher_is_ours():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.plugins import Plugins

    from ebrl.train import CONF_DIR

    for launcher in ("slurm", "slurm_gres"):
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
            full = compose(
                config_name="config",
                overrides=[*TINY, f"launcher={launcher}"],
                return_hydra_config=True,
            )
        target = full.hydra.launcher._target_
        assert target == "hydra_plugins.ebrl_launcher.slurm_launcher.SlurmLauncher"
        # Hydra instantiates a launcher only from its plugins' namespace package
        assert Plugins.instance().is_in_toplevel_plugins_module(target)
        assert "fail_on_slurm" not in (full.hydra.callbacks or {})


def test_a_signal_that_surfaces_as_another_error_still_stops_the_run_as_preempted(
    tmp_path, monkeypatch
):
    """A stop signal raised inside native code comes back as that code's error (Ray's Cython
    wait: SystemError); the run must still end KILLED and by its signal, not FAILED."""
    import signal

    from ebrl.schedulers.sync import SyncScheduler
    from ebrl.signals import Preempted

    orig = SyncScheduler._loop

    def loop(self, st, ctx, builder, episodes):
        for i, rep in enumerate(orig(self, st, ctx, builder, episodes)):
            yield rep
            if i == 1:
                try:
                    signal.raise_signal(signal.SIGTERM)
                except Preempted as p:
                    raise SystemError("returned a result with an exception set") from p

    monkeypatch.setattr(SyncScheduler, "_loop", loop)
    with pytest.raises(Preempted) as got:
        train(_cfg(tmp_path, ["scheduler=sync"], 6))
    assert got.value.signum == signal.SIGTERM
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "KILLED" and summary["iterations"] == 2
