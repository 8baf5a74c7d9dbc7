"""benchmarks/weak_scaling.py: the layouts it runs and the ratios it prints."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import weak_scaling as ws  # noqa: E402

from .conftest import make_cfg  # noqa: E402


def test_each_point_doubles_roles_and_envs_together():
    small, big, same = ws.POINTS
    assert (big.replicas, big.ranks, big.env_workers, big.envs) == (
        2 * small.replicas,
        2 * small.ranks,
        2 * small.env_workers,
        2 * small.envs,
    )
    # the strong-scaling reference: the big point's work on the small point's roles
    assert (same.replicas, same.ranks) == (small.replicas, small.ranks)
    assert (same.env_workers, same.envs) == (big.env_workers, big.envs)


def test_every_run_composes_as_the_config_it_claims():
    for w in ws.WORKLOADS:
        for p in ws.POINTS:
            cfg = make_cfg([*ws.WORKLOADS[w], *ws.EBRL, *p.overrides()])
            assert cfg.num_envs == p.envs
            assert cfg.scheduler.gen_replicas == p.replicas
            assert cfg.scheduler.learner_ranks == p.ranks
            assert cfg.scheduler.sim_workers == p.env_workers
            assert cfg.scheduler.step_level and cfg.scheduler.pipeline


def test_the_table_reports_weak_efficiency_and_the_same_envs_ratio():
    rows = []
    for seed, base in enumerate((100.0, 110.0, 90.0)):
        # the 2+2 point at 1.8x its half-size twin, and 1.5x the 1+1 layout on its 16 envs
        for name, rate in (("1+1 x8", base), ("2+2 x16", 1.8 * base), ("1+1 x16", 1.2 * base)):
            rows.append({"workload": "sleep", "point": name, "seed": seed, "throughput_e2e": rate})
    text = ws.table(rows, ["sleep"], list(ws.POINTS))
    line = text.splitlines()[2]
    assert "100.0" in line  # the 1+1 x8 mean
    ratios = text.splitlines()[-1]
    assert ratios.startswith("| sleep | 0.900") and "| 1.500" in ratios
