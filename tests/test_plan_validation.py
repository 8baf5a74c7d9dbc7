"""benchmarks/plan_validation.py's verdicts: which pairs the measurement resolves, and which
rankings are of schedulers (the issue's goal) rather than one scheduler's thread splits."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import plan_validation as pv  # noqa: E402


def group(campaign: str, config: str, measured: list[float], predicted: float) -> pv.Group:
    runs = [SimpleNamespace(measured=m) for m in measured]
    g = pv.Group(campaign, "PushCube-v1 L N16", config, runs, None, "held-out")  # type: ignore[arg-type]
    g.predicted = predicted
    return g


def test_a_pair_is_resolved_only_when_every_seed_of_one_is_above_every_seed_of_the_other():
    (r,) = pv.ranking(
        [
            group("headline-cpu", "async", [600, 610, 605], 500),  # clearly first, predicted last
            group("headline-cpu", "ebrl", [480, 490, 485], 560),
            group("headline-cpu", "hybrid", [470, 495, 460], 540),  # overlaps ebrl's seeds
        ]
    )
    assert r["kind"] == "schedulers"
    assert r["measured_order"] == ["async", "ebrl", "hybrid"]
    assert r["predicted_order"] == ["ebrl", "hybrid", "async"] and not r["right"]
    assert (r["pairs"], r["pairs_wrong"]) == (3, 2)  # async-ebrl, async-hybrid wrong
    assert (r["resolved_pairs"], r["resolved_pairs_wrong"]) == (2, 2)  # ebrl-hybrid unresolved


def test_the_allocators_grids_rank_thread_splits_not_schedulers():
    (r,) = pv.ranking(
        [
            group("allocator/2026-11-30", "g1t1b8", [370], 400),
            group("allocator/2026-11-30", "g3t1b2", [378], 325),
        ]
    )
    assert r["kind"] == "thread splits"


def test_each_policy_token_names_a_committed_offline_profile():
    for token, folder in pv.THREAD_REFS.items():
        assert (pv.RESULTS / folder / "profile.json").exists(), (token, folder)
        ref = pv.thread_ref(folder)
        assert set(ref.gen) >= {1, 2} and set(ref.train) >= {1, 2}
    assert pv.policy_of("PickCube-v1 M N16") == "M" and pv.policy_of("PushCube-v1 MLP N32") == "MLP"


def test_ebrl_runs_that_chose_their_shape_at_run_time_are_predicted_at_the_shape_they_kept():
    """The 2026-12-06 headline's EBRL runs pin no shape (the resource manager chose it): they are
    predicted at the shape and threads the campaign reports, under the task's own name."""
    runs = [r for r in pv.export_runs("headline-cpu") if r.scheduler == "ebrl"]
    assert len(runs) == 20
    assert {r.workload for r in runs} == {
        "PushCube-v1 L N16", "PushCube-v1 M N16", "PickCube-v1 L N16", "PickCube-v1 M N16",
    }  # fmt: skip
    for r in runs:
        assert r.shape is not None and (r.shape.groups, r.shape.step_level) == (1, False)
        assert r.wl.threads["ebrl"] == (1, 1) and r.wl.staleness == 1


def test_a_reported_shape_the_runs_generator_batches_contradict_is_refused(monkeypatch):
    from ebrl.resources.model import Shape

    monkeypatch.setitem(pv.RUNTIME_SHAPES, "headline-cpu", (Shape(2, False, 8, 0.005), (1, 1)))
    import pytest

    with pytest.raises(ValueError, match="generator batches"):
        pv.export_runs("headline-cpu")
