"""benchmarks/soak.py: a training run that dies in the warm-up is reported, not a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import soak  # noqa: E402


def test_a_run_that_ends_before_the_first_sample_says_why(tmp_path, capsys):
    # a misspelt key: ebrl.train refuses it at once, long before the warm-up ends
    code = soak.main(
        [
            "--minutes",
            "0.1",
            "--out",
            str(tmp_path),
            "--workload",
            "+experiment=embedded",
            "+budgett.x=1",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "before the first sample" in err and "budgett" in err
    assert not (tmp_path / "soak.json").exists()  # no report that would look like a soak
