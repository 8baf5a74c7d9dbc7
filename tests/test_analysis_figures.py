"""analysis.figures, analysis.tables and the analysis.report CLI on small synthetic tables."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analysis import figures, tables
from analysis.report import main as report

LEVELS = {
    "EBRLScheduler": (True, True, True),
    "EBRLScheduler[-overlap,-pipeline,-step_level]": (False, False, False),
    "EBRLScheduler[-pipeline,-step_level]": (True, False, False),
}
SPEED = {"SyncScheduler": 100.0, "Hybrid": 130.0, "EBRLScheduler": 250.0}
SPEED |= {"EBRLScheduler[-overlap,-pipeline,-step_level]": 110.0}
SPEED |= {"EBRLScheduler[-pipeline,-step_level]": 170.0}


def _tables(seeds: int = 3) -> tuple[pd.DataFrame, pd.DataFrame]:
    """runs.csv- and curves.csv-shaped frames: 5 variants x 2 algos x seeds, k in {1, 2} for
    EBRL, 2 sizes; success ramps up in proportion to throughput."""
    rng = np.random.default_rng(0)
    runs, curves = [], []
    for algo in ("PPO", "GRPO"):
        for variant, speed in SPEED.items():
            for seed in range(seeds):
                rid = f"{algo}-{variant}-{seed}"
                tp = speed * (1 + 0.03 * rng.normal())
                row = {"run_id": rid, "run_name": rid, "simulator": "PushCube-v1"}
                row.update(policy="MLPPolicy", algo=algo, seed=seed, scheduler_variant=variant)
                row.update(throughput_e2e=tp, success_rate=0.9, wall_s=3000 / tp)
                row["param.num_envs"] = 16 if seed % 2 == 0 else 64
                if variant in LEVELS:
                    on = LEVELS[variant]
                    row["param.scheduler.overlap"] = on[0]
                    row["param.scheduler.pipeline"] = on[1]
                    row["param.scheduler.step_level"] = on[2]
                    row["param.scheduler.staleness"] = 1 + seed % 2
                runs.append(row)
                for i in range(1, 16):
                    step = 200 * i
                    curves.append((rid, step, step / tp, 0, "env/success_rate", min(1.0, i / 10)))
    cols = ["run_id", "step", "wall_s", "timestamp", "key", "value"]
    return pd.DataFrame(runs), pd.DataFrame(curves, columns=cols)


def _trace(path) -> None:
    ev = []
    for tid, (track, stage, period) in enumerate(
        [("sim0", "sim", 0.3), ("gen", "gen", 0.2), ("learner", "train", 1.0)], 1
    ):
        for j in range(10):
            ts, dur = j * period * 1e6, period * 0.8e6  # microseconds
            ev.append({"name": stage, "ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur})
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": track}})
    path.write_text(json.dumps({"traceEvents": ev, "displayTimeUnit": "ms"}))


@pytest.fixture(scope="module")
def data():
    return _tables()


def _ok(paths) -> None:
    assert len(paths) == 2 and {p.suffix for p in paths} == {".png", ".pdf"}
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)


def test_each_figure_builds(data, tmp_path):
    runs, curves = data
    ppo = runs[runs["algo"] == "PPO"]
    _ok(figures.save(figures.throughput_bars(ppo), tmp_path / "bars"))
    _ok(figures.save(figures.convergence_curves(curves, ppo), tmp_path / "conv"))
    _ok(figures.save(figures.staleness_plot(ppo), tmp_path / "stale"))
    _ok(figures.save(figures.ablation_bars(ppo), tmp_path / "abl"))
    _ok(figures.save(figures.scaling_plot(ppo), tmp_path / "scale"))


def test_gantt_from_trace(tmp_path):
    _trace(tmp_path / "timeline.json")
    ev = figures.read_trace(tmp_path / "timeline.json")
    assert set(ev["track"]) == {"sim0", "gen", "learner"} and len(ev) == 30
    _ok(figures.save(figures.gantt(tmp_path / "timeline.json"), tmp_path / "gantt"))
    _ok(figures.save(figures.gantt(ev, window=(1.0, 3.0), title="w"), tmp_path / "gantt_w"))
    with pytest.raises(ValueError, match="no complete"):
        figures.gantt(ev.iloc[:0])


def test_tables_render(data):
    runs, curves = data
    ppo = runs[runs["algo"] == "PPO"]
    head = tables.headline(
        ppo[ppo["scheduler_variant"].isin(["EBRLScheduler", "Hybrid", "SyncScheduler"])]
    )
    md = head.markdown()
    assert "1 (strongest baseline)" in md and md.count("\n|") == 5  # header, rule, 3 rows
    # the paper's names, whatever the runs recorded (EBRLScheduler, MLPPolicy, PushCube-v1)
    assert {r[2] for r in head.rows} == {"EBRL", "Hybrid", "Sync"}
    assert {(r[0], r[1]) for r in head.rows} == {("ManiSkill PushCube", "MLP")}
    ebrl = next(r for r in head.rows if r[2] == "EBRL")
    assert ebrl[-2].startswith("1.9")  # 250 / 130
    assert "P(EBRL better)" in head.header
    tex = head.latex(label="tab:x")
    assert r"\begin{tabular}" in tex and r"\label{tab:x}" in tex and "EBRL" in tex
    assert "Scheduler" not in tex + md
    abl = tables.ablation(ppo)
    assert [r[2:5] for r in abl.rows] == [["✗", "✗", "✗"], ["✓", "✗", "✗"], ["✓", "✓", "✓"]]
    assert any("without level params" in n for n in abl.notes)
    st = tables.staleness(ppo)
    assert [r[3] for r in st.rows if r[2] == "EBRL"] == ["1", "2"]
    conv = tables.convergence(ppo, curves)
    assert all(r[3] == "3/3" for r in conv.rows)
    g = tables.grpo(runs)
    assert {r[2] for r in g.rows} == {"PPO", "GRPO"}
    sc = tables.scaling(ppo)
    assert {r[2] for r in sc.rows} == {"16", "64"}
    # every table names the intervals it shows, by default the measured ones, in its notes and
    # in the headers of its interval columns
    for t in (head, abl, st, conv, g, sc):
        assert "cells: mean [95% Student t CI (mean over seeds)]" in t.notes, t.title
        assert any("95% Student t CI (paired log ratio)" in n for n in t.notes), t.title
        assert any("[95% Student t CI, log ratio]" in h for h in t.header), t.title
        assert any("mean [95% Student t CI]" in h for h in t.header), t.title
        assert any("measured coverage" in n for n in t.notes), t.title
    for t in (st, conv, g):  # with a success column: Wilson's interval
        assert any(n.startswith("success rates: mean [95% Wilson CI") for n in t.notes), t.title
        assert any("mean [95% Wilson CI]" in h for h in t.header), t.title


@pytest.mark.parametrize(
    ("ci", "said", "ratio"),
    [
        ("percentile", "95% percentile bootstrap CI (over seeds)", "95% percentile bootstrap CI"),
        ("bca", "95% BCa bootstrap CI (over seeds)", "95% BCa bootstrap CI"),
        ("t", "95% Student t CI (mean over seeds)", "95% Student t CI (paired log ratio)"),
    ],
)
def test_tables_name_the_interval_asked_for(data, ci, said, ratio):
    runs, _ = data
    ppo = runs[runs["algo"] == "PPO"]
    head = tables.headline(ppo, ci=ci)
    assert f"cells: mean [{said}]" in head.notes
    assert ratio in head.notes[0]
    what = "ratio of means" if ci != "t" else "geometric mean of the per-seed ratios"
    assert what in head.notes[0]
    with pytest.raises(ValueError, match="interval method"):
        tables.headline(ppo, ci="bootstrap")


def test_tables_say_where_bca_is_undefined():
    """Three seeds with one value, and a ratio equal on every seed: BCa is undefined there; the
    cell shows the (zero-width) percentile interval and the notes count it."""
    rows = [
        {"simulator": "s", "policy": "p", "scheduler_variant": sv, "seed": seed, "tp": tp}
        for sv, tp in (("EBRLScheduler", 200.0), ("AsyncScheduler", 100.0))
        for seed in range(3)
    ]
    head = tables.headline(pd.DataFrame(rows), value="tp", ci="bca")
    ebrl = next(r for r in head.rows if r[2] == "EBRL")
    assert ebrl[4] == "200.0 [200.0, 200.0]" and ebrl[-2] == "2.00 [2.00, 2.00]"
    assert any(
        n.startswith("3 interval(s) are percentile bootstrap instead of BCa") for n in head.notes
    )


@pytest.mark.parametrize(
    "kind", ["headline", "convergence", "staleness", "ablation", "scaling", "grpo", "timeline"]
)
def test_report_cli(kind, data, tmp_path, capsys):
    runs, curves = data
    src = tmp_path / "export"
    (src / "traces").mkdir(parents=True)
    runs.to_csv(src / "runs.csv", index=False)
    curves.to_csv(src / "curves.csv", index=False)
    _trace(src / "traces" / f"{runs['run_id'].iloc[0]}.json")
    where = [] if kind == "grpo" else ["--where", "algo=PPO"]
    out = tmp_path / "out"
    assert report(["--runs", str(src), "--kind", kind, "--out", str(out), *where]) == 0
    printed = capsys.readouterr().out
    pngs = list(out.glob("*.png"))
    assert pngs and all(p.stat().st_size > 1000 for p in pngs)
    if kind != "timeline":
        md = (out / f"{kind}.md").read_text()
        assert md.startswith("### ") and "Provenance" in md and md.split("\n")[0] in printed
        assert (out / f"{kind}.tex").read_text().startswith(r"\begin{table}")


def test_a_study_exported_in_batches_reports_as_one_export(data, tmp_path):
    """``--runs A B``: two export folders (seed 0, then seeds 1-2) give the table one folder
    of all the runs gives; the provenance names each folder; a run in both counts once."""
    runs, curves = data
    runs = runs[runs["algo"] == "PPO"]
    curves = curves[curves["run_id"].isin(runs["run_id"])]
    parts = {"all": runs, "b0": runs[runs["seed"] == 0], "b1": runs[runs["seed"] > 0]}
    for name, r in parts.items():
        (tmp_path / name).mkdir()
        r.to_csv(tmp_path / name / "runs.csv", index=False)
        curves[curves["run_id"].isin(r["run_id"])].to_csv(tmp_path / name / "curves.csv")
    # a run of batch 0 exported again with batch 1: counted once
    both = pd.concat([parts["b1"], parts["b0"].iloc[:1]])
    both.to_csv(tmp_path / "b1" / "runs.csv", index=False)
    got = {}
    for name, src in {"one": ["all"], "batches": ["b0", "b1"]}.items():
        out = tmp_path / f"out-{name}"
        args = ["--runs", *(str(tmp_path / s) for s in src), "--kind", "convergence"]
        assert report([*args, "--out", str(out), "--threshold", "0.8"]) == 0
        got[name] = (out / "convergence.md").read_text()
    table = got["one"].split("Provenance")[0]
    assert got["batches"].split("Provenance")[0] == table
    assert "export 1 of 2" in got["batches"] and "export 2 of 2" in got["batches"]


def test_ablation_with_allocator_orders_cumulative_then_leave_one_out():
    """The lead's ablation axis: lockstep -> +overlap -> +pipeline -> all_levels -> full, and
    full minus each level; a level is on when its column holds the "on" value."""
    axis = {  # overlap, pipeline, step_level, allocator
        "lockstep": (False, False, False, "static"),
        "overlap": (True, False, False, "static"),
        "overlap_pipeline": (True, True, False, "static"),
        "all_levels": (True, True, True, "static"),
        "full": (True, True, True, "elastic"),
        "minus_overlap": (False, True, True, "elastic"),
        "minus_pipeline": (True, False, True, "elastic"),
        "minus_step_level": (True, True, False, "elastic"),
    }
    rows = []
    for i, (name, (o, p, s, a)) in enumerate(axis.items()):
        for seed in range(2):
            rows.append(
                {
                    "run_id": f"{name}{seed}",
                    "seed": seed,
                    "scheduler_variant": "EBRLScheduler",
                    "throughput_e2e": 100.0 * (i + 1) + seed,
                    "param.scheduler.overlap": o,
                    "param.scheduler.pipeline": p,
                    "param.scheduler.step_level": s,
                    "param.resources.allocator": a,
                }
            )
    t = tables.ablation(pd.DataFrame(rows), config_cols=())
    assert t.header[:4] == ["overlap", "pipeline", "step_level", "allocator"]
    order = ["".join("1" if c == "✓" else "0" for c in r[:4]) for r in t.rows]
    assert order == ["0000", "1000", "1100", "1110", "1101", "1011", "0111", "1111"]
    by_levels = {o: r for o, r in zip(order, t.rows)}
    full, minus_overlap = by_levels["1111"], by_levels["0111"]
    assert full[-2].startswith("1.25")  # full (500) over all_levels (400): the allocator
    assert full[-1] == "–" and minus_overlap[-2] == "–"  # no 2-level subset of it ran
    assert minus_overlap[-1].startswith("1.20")  # minus_overlap (600) over full (500)
    assert tables._pooled_notes(pd.DataFrame(rows), ["scheduler_variant"])  # 8 runs per seed


def test_report_staleness_reads_the_success_column_it_is_given(data, tmp_path):
    runs, curves = data
    src = tmp_path / "export"
    src.mkdir()
    runs.assign(eval_success_rate=0.5).to_csv(src / "runs.csv", index=False)
    curves.to_csv(src / "curves.csv", index=False)
    out = tmp_path / "out"
    args = ["--runs", str(src), "--kind", "staleness", "--out", str(out), "--where", "algo=PPO"]
    assert report([*args, "--success", "eval_success_rate"]) == 0
    md = (out / "staleness.md").read_text()
    assert "`eval_success_rate`" in md and "0.5" in md


def test_staleness_table_with_an_integer_k_column(data):
    """Only runs that have a k (no NaN): the column is read as integers, and each k is still
    paired with the smallest (once broke: "1" against "1.0")."""
    runs, _ = data
    k = "param.scheduler.staleness"
    ppo = runs[(runs["algo"] == "PPO") & runs[k].notna()]
    as_int = ppo.assign(**{k: ppo[k].astype(int)})
    rows = tables.staleness(as_int).rows
    assert [r[-1] for r in rows] == [r[-1] for r in tables.staleness(ppo).rows]
    assert rows[-1][-1] != "–"


def test_where_matches_integers_in_a_column_turned_float_by_missing_params():
    from analysis.report import _filter

    runs = pd.DataFrame({"k": [1.0, 2.0, np.nan], "b": [200000.0, 400000.0, 200000.0]})
    assert _filter(runs, ["k=1"])["k"].tolist() == [1.0]
    assert len(_filter(runs, ["b!=400000"])) == 2
    with pytest.raises(SystemExit, match="no runs left"):
        _filter(runs, ["k=3"])
