"""The LIBERO convergence and staleness studies (issue 44) are what docs/libero-study.md says:
PPO from sampled layouts, success on the fixed initial states, Sync = EBRL's stages in lock step,
every seed's runs back to back, at least 5 seeds."""

from __future__ import annotations

from ebrl.evaluate import episode_plan
from ebrl.launch.sweep import expand

from .conftest import make_cfg


def _job(sweep: str, job: list[str]):
    return make_cfg([f"+sweep={sweep}", *job])


def test_convergence_compares_sync_async_and_ebrl_on_five_seeds_back_to_back():
    _, jobs = expand("convergence_libero", [])
    seeds = [next(o for o in j if o.startswith("seed=")) for j in jobs]
    assert len(set(seeds)) >= 5 and len(jobs) == 3 * len(set(seeds))
    # each seed's three runs one after another
    assert all(seeds[i] == seeds[i - i % 3] for i in range(len(seeds)))
    by = {
        o.split("=")[1]: _job("convergence_libero", j)
        for j in jobs[:3]
        for o in j
        if "schedule" in o
    }
    assert set(by) == {"sync", "async", "ebrl"}
    sync, ebrl = by["sync"], by["ebrl"]
    # Sync: EBRL's own workers and stages, every level off; EBRL: the same, levels on
    assert sync.scheduler._target_ == ebrl.scheduler._target_
    assert not any(sync.scheduler[lv] for lv in ("overlap", "pipeline", "step_level"))
    assert all(ebrl.scheduler[lv] for lv in ("overlap", "pipeline", "step_level"))
    assert sync.resources.allocator == ebrl.resources.allocator == "static"
    assert "async" in by["async"].scheduler._target_.lower()


def test_training_starts_are_sampled_and_evaluation_is_on_the_fixed_states():
    _, jobs = expand("convergence_libero", [])
    cfg = _job("convergence_libero", jobs[0])
    assert cfg.simulator.task == "libero_object" and cfg.simulator.init_states == "sampled"
    plan = episode_plan(cfg, cfg.eval.episodes, cfg.eval.num_envs, cfg.eval.init_states)
    assert plan.fixed and plan.simulator == {"init_states": "suite"}
    assert [c.seeds for c in plan.cohorts] == [tuple(range(50))]  # all 50 fixed states


def test_staleness_sweeps_k_on_five_seeds_under_ebrl():
    _, jobs = expand("staleness_libero", [])
    ks = {o for j in jobs for o in j if o.startswith("scheduler.staleness=")}
    assert ks == {f"scheduler.staleness={k}" for k in (0, 1, 2, 4, 8)}
    assert len({o for j in jobs for o in j if o.startswith("seed=")}) >= 5
    cfg = _job("staleness_libero", jobs[0])
    assert "ebrl" in cfg.scheduler._target_.lower() and cfg.simulator.init_states == "sampled"
