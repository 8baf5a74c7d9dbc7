"""benchmarks/curve.py: a run folder's learning curve, its table and the fifths' means."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import curve  # noqa: E402


def test_the_curve_of_a_run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    n = 10
    pd.DataFrame(
        {
            "iteration": range(n),
            "env/steps_total": [100 * (i + 1) for i in range(n)],
            "env/return": [float(i) for i in range(n)],
            "env/success_rate": [0.0] * 8 + [0.5, 1.0],
            "env/episode_len": [50.0] * n,
            "train/policy_loss": [0.1] * n,
        }
    ).to_csv(run / "metrics.csv", index=False)
    (run / "summary.json").write_text(json.dumps({"commit": "abc", "seed": 3, "iterations": n}))
    assert curve.main([str(run), "--out", str(tmp_path / "out"), "--every", "5"]) == 0
    md = (tmp_path / "out" / "curve.md").read_text()
    assert (tmp_path / "out" / "curve.png").stat().st_size > 0
    # fifths of 10 updates: the first 2 and the last 2
    assert "return 0.500 -> 8.500, success rate 0.000 -> 0.750" in md
    assert md.count("\n| ") == 1 + 2  # the header and updates 0 and 5


def test_a_run_without_the_curves_columns_is_named(tmp_path):
    (tmp_path / "metrics.csv").write_text("iteration,env/return\n0,1.0\n")
    with pytest.raises(SystemExit, match="env/steps_total"):
        curve.load(tmp_path)
