"""analysis.names: the paper's names for schedulers, policies and simulators, from any spelling a
run recorded (config option, class name, task), and the report on a committed export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analysis import names
from analysis.export import _scheduler_variant
from analysis.report import main as report

ROOT = Path(__file__).resolve().parents[1]
#: a committed export whose tags are class names (recorded before the config-name tags)
HEADLINE = ROOT / "results" / "archive" / "headline-cpu-2026-12-01" / "export"


@pytest.mark.parametrize(
    ("spellings", "shown"),
    [
        (["sync", "SyncScheduler", "Sync"], "Sync"),
        (["colocated", "ColocatedScheduler", "COLOCATED"], "Colocated"),
        (["hybrid", "HybridScheduler"], "Hybrid"),
        (["async", "AsyncScheduler", "Async"], "Async"),
        (["ebrl", "EBRLScheduler", "EBRL"], "EBRL"),
        (["rlinf_async", "RLinf Async"], "RLinf Async"),
        (["rlinf_colocated"], "RLinf Colocated"),
    ],
)
def test_schedulers_by_any_spelling(spellings, shown):
    for s in spellings:
        assert names.display("scheduler", s) == shown
        assert names.display("scheduler", names.display("scheduler", s)) == shown  # idempotent
    assert len({names.key("scheduler", s) for s in spellings}) == 1


def test_real_rlinf_by_its_mode_and_unknown_values_kept():
    assert names.display("scheduler", "RLinfScheduler", mode="hybrid") == "RLinf Hybrid"
    assert names.display("scheduler", "RLinfScheduler") == "RLinf (mode unknown)"
    assert _scheduler_variant({"scheduler.mode": "async"}, "RLinfScheduler") == "rlinf_async"
    assert names.variant(_scheduler_variant({"scheduler.mode": "async"}, "RLinfScheduler")) == (
        "RLinf Async"
    )
    assert names.display("scheduler", "MyScheduler") == "MyScheduler"
    assert names.display("policy", "my_policy") == "my_policy"


def test_policies_and_simulators():
    for s in ("transformer_l", "Transformer-L (VLA-shaped)"):
        assert names.display("policy", s) == "Transformer-L (VLA-shaped)"
    assert names.display("policy", "TransformerPolicy", size="M") == "Transformer-M (VLA-shaped)"
    assert names.display("policy", "TransformerPolicy") == "Transformer (VLA-shaped)"
    assert names.display("policy", "MLPPolicy") == names.display("policy", "mlp") == "MLP"
    assert names.display("policy", "pi0") == "π0"
    for s in ("pushcube", "PushCube-v1", "ManiSkill PushCube"):
        assert names.display("simulator", s) == "ManiSkill PushCube"
    assert names.display("simulator", "PickCube-v1") == "ManiSkill PickCube"
    # a simulator of several tasks: each task keeps a name of its own (never pooled together)
    assert names.display("simulator", "libero_spatial") == "LIBERO-Spatial"
    assert names.display("simulator", "libero", task="libero_goal") == "LIBERO-Goal"
    assert names.display("simulator", "libero", task="libero_new") == "LIBERO libero_new"
    assert names.display("simulator", "LIBERO libero_new", task="libero_new") == (
        "LIBERO libero_new"
    )
    assert names.display("simulator", "robocasa", task="PnPCounterToCab") == (
        "RoboCasa PnPCounterToCab"
    )
    assert names.display("simulator", "pushcube", task="PushCube-v1") == "ManiSkill PushCube"
    assert names.display("simulator", "SyntheticCostEnv") == "Synthetic (step-cost model)"


def test_variants_keep_what_is_switched_off():
    assert names.variant("EBRLScheduler[-overlap]+elastic") == "EBRL[-overlap]+elastic"
    assert names.variant("ebrl[-pipeline,-step_level]") == "EBRL[-pipeline,-step_level]"
    assert names.variant("AsyncScheduler") == "Async"
    assert names.column_key("scheduler_variant", "EBRL[-overlap]") == "ebrl[-overlap]"
    assert names.column_key("scheduler_variant", "EBRLScheduler[-overlap]") == "ebrl[-overlap]"
    assert names.column_key("param.num_envs", "16") == "16"  # other columns: the text


@pytest.mark.parametrize(
    ("group", "table"),
    [("scheduler", names.SCHEDULERS), ("policy", names.POLICIES), ("simulator", names.SIMULATORS)],
)
def test_every_config_option_has_a_name(group, table):
    """A new conf/<group>/<option>.yaml needs its paper name here, or tables show the option."""
    options = {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}
    assert options and options <= set(table), sorted(options - set(table))


def test_display_runs_maps_the_name_columns_once():
    runs = pd.DataFrame(
        {
            "scheduler": ["EBRLScheduler", "async", np.nan],
            "scheduler_variant": ["EBRLScheduler[-overlap]", "async", "x"],
            "policy": ["TransformerPolicy", "TransformerPolicy", "mlp"],
            "simulator": ["PushCube-v1", "pickcube", "libero"],
            "param.policy.size": ["L", "M", np.nan],
            "param.simulator.task": ["PushCube-v1", "PickCube-v1", "libero_10"],
            "run_name": ["EBRLScheduler-a", "b", "c"],
        }
    )
    shown = names.display_runs(runs)
    assert shown["scheduler"].iloc[:2].tolist() == ["EBRL", "Async"]
    assert pd.isna(shown["scheduler"].iloc[2])
    assert shown["scheduler_variant"].tolist() == ["EBRL[-overlap]", "Async", "x"]
    assert shown["policy"].tolist() == [
        "Transformer-L (VLA-shaped)",
        "Transformer-M (VLA-shaped)",
        "MLP",
    ]
    push, pick = "ManiSkill PushCube", "ManiSkill PickCube"
    assert shown["simulator"].tolist() == [push, pick, "LIBERO-Long (LIBERO-10)"]
    assert shown["run_name"].tolist() == runs["run_name"].tolist()  # identifiers are kept
    assert names.display_runs(shown).equals(shown)
    assert runs["scheduler"].iloc[0] == "EBRLScheduler"  # a copy: the input is untouched


@pytest.mark.skipif(not HEADLINE.exists(), reason="the committed headline export is absent")
def test_report_on_a_committed_export(tmp_path, capsys):
    """results/archive/headline-cpu-2026-12-01/export holds class-name tags; the report shows
    the paper's names, takes any spelling in --where and --target, and names its interval;
    results/ is untouched."""
    out = tmp_path / "headline"
    before = {p: p.stat().st_mtime_ns for p in HEADLINE.iterdir()}
    args = ["--runs", str(HEADLINE), "--kind", "headline", "--out", str(out)]
    args += ["--where", "simulator=pushcube", "--where", "policy=transformer_l"]
    args += ["--where", "scheduler_variant=ebrl,AsyncScheduler,Hybrid", "--target", "ebrl"]
    assert report(args) == 0
    md, tex = (out / "headline.md").read_text(), (out / "headline.tex").read_text()
    table = md.split("Provenance")[0]
    for shown in ("| EBRL |", "| Async |", "| Hybrid |", "ManiSkill PushCube", "P(EBRL better)"):
        assert shown in table
    assert "Transformer-L (VLA-shaped)" in table and "Colocated" not in table
    # the default intervals, named in the headers and the notes
    assert "mean [95% Student t CI]" in table and "[95% Student t CI, log ratio]" in table
    assert "95% Student t CI (paired log ratio)" in table
    for old in ("Scheduler", "TransformerPolicy", "PushCube-v1"):
        assert old not in table and old not in tex
    assert "1 (strongest baseline)" in table  # Async is the strongest baseline there
    assert (out / "headline.png").exists()
    assert {p: p.stat().st_mtime_ns for p in HEADLINE.iterdir()} == before
    assert "| EBRL |" in capsys.readouterr().out
