"""benchmarks/allocator.py's noise analysis of the (b) grid, on made-up runs."""

from __future__ import annotations

from benchmarks.allocator import grid_noise


def rows(table: dict[str, list[float]]) -> list[dict]:
    return [
        {"config": n, "seed": s, "throughput_e2e": v}
        for n, vals in table.items()
        for s, v in enumerate(vals)
    ]


def test_held_out_best_is_picked_on_the_other_seeds():
    # "b" wins seeds 0 and 1, "c" wins seed 2 by luck; "a" is chosen
    runs = rows({"a": [90.0, 90.0, 90.0], "b": [100.0, 100.0, 80.0], "c": [95.0, 95.0, 120.0]})
    lines = grid_noise(runs, ["a", "b", "c"], "a")
    text = "\n".join(lines)
    assert "seed 0 b (100.0), seed 1 b (100.0), seed 2 c (120.0)" in text
    # seed 0: best on seeds 1, 2 is c (107.5 vs 90); seed 1: c too; seed 2: b (100 vs 95)
    assert "seed 0: a / c = 0.947" in text and "seed 2: a / b = 1.125" in text
    mean = (90 / 95 + 90 / 95 + 90 / 80) / 3
    assert f"mean {mean:.3f}" in text
    # pooled sd: a 0, b sqrt(133.3), c sqrt(208.3) -> sqrt(mean of variances)
    sd = ((0 + 400 / 3 + 625 / 3) / 3) ** 0.5
    assert f"scatter by {sd:.1f}" in text


def test_nothing_to_say_with_one_seed_or_an_unknown_choice():
    assert grid_noise(rows({"a": [1.0], "b": [2.0]}), ["a", "b"], "a") == []  # one seed
    two = rows({"a": [1.0, 1.0], "b": [2.0, 2.0]})
    assert grid_noise(two, ["a", "b"], "missing") == []
    assert grid_noise(two, ["a", "b"], "a") != []
