"""analysis.estimators: the old and new IQM and intervals printed side by side."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import estimators


def _runs() -> pd.DataFrame:
    rows = [
        {"scheduler_variant": "EBRLScheduler", "seed": i, "tp": v}
        for i, v in enumerate([1.0, 2.0, 3.0, 7.0, 100.0])
    ]
    rows += [{"scheduler_variant": "SyncScheduler", "seed": i, "tp": 5.0} for i in range(3)]
    return pd.DataFrame(rows)


def test_old_and_new_side_by_side():
    df = estimators.compare(_runs(), "tp", ["scheduler_variant"], reps=20_000)
    e = df.set_index("scheduler_variant").loc["EBRL"]
    assert e["iqm_old"] == pytest.approx(3.9) and e["iqm_new"] == 4.0 and e["mean"] == 22.6
    # same resamples, another method: BCa reaches further right on this right-skewed sample
    assert e["bca_method"] == "bca" and e["bca_high"] > e["pct_high"] + 5
    assert e["t_low"] < e["pct_low"]  # t: wider on this sample
    s = df.set_index("scheduler_variant").loc["Sync"]  # all equal: BCa undefined, said so
    assert s["bca_method"] == "percentile" and s["bca_low"] == s["bca_high"] == 5.0
    md = estimators.table(df, "tp", ["scheduler_variant"]).markdown()
    row = next(line for line in md.splitlines() if line.startswith("| EBRL |"))
    assert "| 3.9 | 4.0 | 22.6 |" in row
    assert "IQM old (interpolated)" in md and "95% BCa bootstrap CI" in md
    assert "the two differ in 1 of 2 rows" in md and "BCa undefined: percentile" in md


def test_cli_prints_the_table(tmp_path, capsys):
    _runs().to_csv(tmp_path / "runs.csv", index=False)
    args = ["--runs", str(tmp_path), "--value", "tp", "--by", "scheduler_variant"]
    assert estimators.main([*args, "--reps", "2000"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("### Old and new estimators") and "| Sync |" in out
