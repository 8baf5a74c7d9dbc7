"""``python -m ebrl.launch --help`` shows a small sweep on each launcher (issue 45: before, a Slurm
sweep was found only in conf/launcher/slurm.yaml), and every example names a sweep and a launcher
that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ebrl.launch.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_help_shows_a_small_sweep_on_every_launcher(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    examples = [
        ln.split("#")[0].split() for ln in out.splitlines() if "python -m ebrl.launch" in ln
    ]
    launchers = {p.stem for p in (ROOT / "conf" / "launcher").glob("*.yaml")}
    sweeps = {p.stem for p in (ROOT / "conf" / "sweep").glob("*.yaml")}
    shown = set()
    for words in examples:
        args = [w for w in words[3:] if not w.startswith("--")]
        assert args and args[0] in sweeps, words
        chosen = [w.split("=", 1)[1] for w in args if w.startswith("launcher=")]
        assert all(c in launchers for c in chosen), words
        shown |= set(chosen) or {"local"}
    assert {"local", "submitit_local", "slurm"} <= shown, out
    assert re.search(r"launcher=slurm\S* .*launcher\.partition=", out), out
