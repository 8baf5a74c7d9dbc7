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
