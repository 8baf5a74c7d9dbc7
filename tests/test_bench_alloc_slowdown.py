"""benchmarks/allocator.py's (d) windows and summary, on made-up runs."""

from __future__ import annotations

import math
from types import SimpleNamespace

from benchmarks.allocator import slow_windows, slowdown_table, split_of

ARGS = SimpleNamespace(slow_at=4, patience=2, threshold=0.15, warmup=1, slow_epochs=4)


def move(step: int, g: int, t: int, b: int, changed: bool = True) -> dict:
    return {
        "step": step,
        "changed": changed,
        "gen": {"threads": g, "batch": b},
        "train": {"threads": t},
        "apply_cost_s": 0.002 if changed else None,
        "apply_latency_s": 2.5 if changed else None,
    }


def run(config: str, seed: int, tp: list[float], reallocs=(), splits=None) -> dict:
    return {
        "config": config,
        "seed": seed,
        "per_update": [math.nan, *tp],
        "reallocations": list(reallocs),
        "splits": splits or [(1, 1, 8)] * (len(tp) + 1),
    }


def test_windows_follow_the_first_move_and_the_update_that_reports_it():
    # update 5 kept the split, update 6 moved it to 1/2; update 8 is the first to report 1/2
    splits = [(1, 1, 8)] * 8 + [(1, 2, 8)] * 4
    twin = run("x-elastic", 0, [1.0] * 11, [move(5, 1, 1, 8, False), move(6, 1, 2, 8)], splits)
    assert slow_windows(twin, 4) == (7, 9)
    # a move reported by no update: the whole rest is transition
    twin["splits"] = [(1, 1, 8)] * 12
    assert slow_windows(twin, 4) == (7, 12)


def test_windows_without_a_move_or_a_firing():
    kept = run("x-elastic", 0, [1.0] * 9, [move(5, 1, 1, 8, False)])
    assert slow_windows(kept, 4) == (6, 6)
    # a firing before the slowdown does not count; the straddling update always counts as slowed
    none = run("x-elastic", 0, [1.0] * 9, [move(2, 1, 2, 8)])
    assert slow_windows(none, 4) == (10, 10)
    early = run("x-elastic", 0, [1.0] * 9, [move(4, 1, 2, 8)], [(1, 1, 8)] * 5 + [(1, 2, 8)] * 5)
    assert slow_windows(early, 4) == (5, 6)


def test_split_of_reads_a_metrics_row():
    row = {
        "resource/gen_threads": "1.0",
        "resource/train_threads": "3.0",
        "resource/gen_batch": "8",
    }
    assert split_of(row) == (1, 3, 8)
    assert split_of({"resource/gen_threads": "1"}) is None
    assert split_of({**row, "resource/gen_batch": ""}) is None


def test_table_compares_elastic_after_the_move_with_frozen_and_even():
    # updates 1..10; slowdown from 4; elastic moves at 5, reports the new split from 7 on
    splits = [(1, 1, 8)] * 7 + [(1, 2, 8)] * 4
    rows = []
    for seed, lift in ((0, 1.2), (1, 1.1)):
        before, slowed = [500.0] * 3, [250.0] * 4
        after = [250.0 * lift] * 3
        rows += [
            run("slowtrain-elastic", seed, before + slowed + after, [move(5, 1, 2, 8)], splits),
            run("slowtrain-frozen", seed, before + slowed + [250.0] * 3),
            run("slowtrain-even", seed, before + slowed + [250.0 * lift] * 3),
        ]
    text = "\n".join(slowdown_table(rows, ARGS, "train"))
    # elastic: before [1, 3), slowed [4, 6), transition [6, 8), after [8, 11)
    assert "| slowtrain-elastic | 0 | 5: 1/2 b8, 2.5 s, 2 ms applying |" in text
    assert "| 500.0 | 250.0 | 250.0 | 300.0 | 0.600 | 1.200 |" in text
    # the static runs take the elastic run's windows
    assert "| slowtrain-frozen | 1 | never | - | 500.0 | 250.0 | 250.0 | 250.0 | 0.500 |" in text
    # the default ratio interval (t on paired log ratios): the geometric mean of 1.2 and 1.1
    assert "- elastic / frozen: 1.149 [" in text and "(per seed 1.200, 1.100)" in text
    assert "- elastic / even: 1.000 [1.000, 1.000] (per seed 1.000, 1.000)" in text
