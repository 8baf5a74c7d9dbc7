"""Tables and figures for one paper result, from an exported results folder (works offline).

Reads only ``runs.csv``, ``curves.csv``, ``export.json`` and ``traces/`` as written by
``analysis.export``; writes ``<kind>.md`` and ``<kind>.tex`` (the table, with provenance) and the
figures ``<kind>*.png`` / ``.pdf`` into ``--out``; prints the Markdown table and the paths.

Kinds: ``headline`` (throughput and speedup over the strongest baseline, bars), ``convergence``
(time to a success threshold, success against wall-clock time), ``staleness`` (throughput and
final success against k), ``ablation`` (EBRL's levels), ``scaling`` (throughput against a scale
column), ``grpo`` (throughput and success per algorithm), ``timeline`` (Gantt of stage spans).

Schedulers, policies and simulators are shown by the paper's names (``analysis.names``: EBRL,
Async, Transformer-L (VLA-shaped), ManiSkill PushCube...), whatever spelling the runs recorded;
``--target``, ``--baselines`` and ``--where`` on those columns take any spelling (``ebrl``,
``EBRLScheduler``, ``EBRL``). Intervals: ``--ci default`` (each statistic's own, measured by
``python -m analysis.coverage``: Student t for a mean, t on paired log ratios for a ratio, Wilson's
on effective episodes for a success rate), or ``t``, ``bca``, ``percentile``, ``wilson`` for all
the statistics that have it; every column header and every table's notes name the one shown.

Usage: ``python -m analysis.report --runs results/export --kind headline --out results/headline``
(``--runs A B``: the runs of several export folders together, e.g. a study made in batches).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from analysis import files, names, tables
from analysis.tables import TARGET, Table

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: what defines a configuration (each gets its own strongest baseline): a GPU type is one of its
#: own, and so is a transformer size where the policy's name does not already say it (old runs)
CONFIG_COLS = ("simulator", "policy", "param.policy.size", "param.gpu.name")
KINDS = ("headline", "convergence", "staleness", "ablation", "scaling", "grpo", "timeline")


def _csv_list(s: str | None) -> list[str] | None:
    return None if s is None else [x.strip() for x in s.split(",") if x.strip()]


def _as_text(x: object) -> str:
    """A cell as ``--where`` compares it: integral floats without ``.0`` (a column of ints turns
    float as soon as one run lacks the param, and ``staleness=1`` must still match ``1.0``)."""
    if isinstance(x, float) and x.is_integer():
        return str(int(x))
    return str(x)


def _filter(runs: pd.DataFrame, where: Sequence[str]) -> pd.DataFrame:
    """Keep rows where ``COL=V1,V2`` (one of the values) or drop them with ``COL!=V1,V2``;
    compared as text (a scheduler, variant, policy or simulator by its config name, so any
    spelling of it matches: :func:`analysis.names.column_key`); all conditions must hold."""
    for w in where:
        neg = "!=" in w
        col, _, vals = w.partition("!=" if neg else "=")
        if col not in runs:
            raise SystemExit(f"--where {w!r}: no column {col!r} in runs.csv")
        wanted = {names.column_key(col, v) for v in vals.split(",")}
        hit = runs[col].map(lambda x, c=col: names.column_key(c, _as_text(x))).isin(wanted)
        runs = runs[~hit if neg else hit]
    if runs.empty:
        raise SystemExit(f"no runs left after --where {list(where)}")
    return runs


def _tells_apart(runs: pd.DataFrame, col: str) -> bool:
    """Whether a default configuration column is needed: simulator and policy always; another
    one where it varies, a transformer size only where one policy name holds several sizes."""
    if col in ("simulator", "policy"):
        return True
    if col not in runs or runs[col].nunique(dropna=False) < 2:
        return False
    if col == "param.policy.size" and "policy" in runs:
        return bool(runs.groupby("policy", dropna=False)[col].nunique(dropna=False).max() > 1)
    return True


def _provenance(runs_dirs: Sequence[Path], argv: Sequence[str]) -> str:
    """The report's command, then each export folder's: its command, date, the commits of its
    runs and the machines (one block per folder, in the order given)."""
    from ebrl.tracking.provenance import portable

    lines = [f"report: `{portable('python -m analysis.report ' + ' '.join(argv))}`"]
    for i, runs_dir in enumerate(runs_dirs):
        meta_path = runs_dir / "export.json"
        meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        of = (
            f" {i + 1} of {len(runs_dirs)} ({portable(str(runs_dir))})"
            if len(runs_dirs) > 1
            else ""
        )
        lines += [
            f"export{of}: `{portable(meta.get('command') or 'unknown')}` "
            f"({meta.get('date', 'date unknown')})",
            f"run commits: {', '.join(meta.get('run_commits', [])) or 'unknown'}; "
            f"analysis commit: {meta.get('analysis_commit', 'unknown')}",
            f"machines: {'; '.join(meta.get('machines', [])) or 'unknown'}",
        ]
        lines += [f"export note: {x}" for x in meta.get("lines", [])[1:]]
    return "\n".join(f"- {x}" for x in lines)


def read_exports(runs_dirs: Sequence[Path]) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """``runs.csv`` and ``curves.csv`` of one or several export folders, together (the
    batches of one study: each made and committed on its own, reported as one). A run that
    two folders both hold (the same run id) is counted once."""
    runs, curves = [], []
    for d in runs_dirs:
        runs_csv = d / "runs.csv"
        if not files.exists(runs_csv):
            raise SystemExit(f"{runs_csv} not found: run `python -m analysis.export` first")
        runs.append(files.read_csv(runs_csv))
        if files.exists(d / "curves.csv"):
            curves.append(files.read_csv(d / "curves.csv"))
    all_runs = pd.concat(runs, ignore_index=True).drop_duplicates("run_id", keep="first")
    if not curves:
        return all_runs, None
    all_curves = pd.concat(curves, ignore_index=True).drop_duplicates()
    return all_runs, all_curves


def _gantts(
    runs: pd.DataFrame, runs_dirs: Sequence[Path], args: argparse.Namespace, figs: ModuleType
) -> list[tuple[str, Figure]]:
    """(name, figure) per trace: the given files, else the lowest-seed run of each scheduler."""
    window = tuple(float(x) for x in args.window_s.split(",")) if args.window_s else None
    if args.trace:
        # a run folder's trace is "timeline.json": name it by its folder then
        paths = [Path(t) for t in args.trace]
        names = [p.parent.name if p.stem == "timeline" else p.stem for p in paths]
        return [(n, figs.gantt(p, window=window, title=n)) for n, p in zip(names, paths)]
    out = []
    order = runs.sort_values([c for c in ("seed", "run_name") if c in runs])
    for sched, g in order.groupby(args.scheduler_col, sort=True):
        found = [d / "traces" / f"{r}.json" for r in g["run_id"] for d in runs_dirs]
        found = [p for p in found if p.exists()]
        if found:
            title = f"{sched}: {g.iloc[0]['run_name']}" if "run_name" in g else str(sched)
            out.append((str(sched), figs.gantt(found[0], window=window, title=title)))
    if not out:
        into = " or ".join(str(d) for d in runs_dirs)
        raise SystemExit(f"no traces: pass --trace FILE or export with --traces into {into}")
    return out


def build(
    kind: str, runs: pd.DataFrame, curves: pd.DataFrame | None, args: argparse.Namespace
) -> tuple[Table | None, list[tuple[str, Figure]]]:
    """The table and the (name suffix, figure) pairs of one kind."""
    from analysis import figures as figs  # seaborn: imported only when drawing

    rng = np.random.default_rng(args.seed)
    cfg, sc = args.config_cols, args.scheduler_col
    common = {"scheduler_col": sc, "target": args.target, "baselines": args.baselines}
    # the figures' intervals are the tables' (a curve's band: a mean's)
    bars = {"scheduler_col": sc, "method": args.ci}
    if kind == "headline":
        t = tables.headline(runs, value=args.value, config_cols=cfg, ci=args.ci, rng=rng, **common)
        f = figs.throughput_bars(runs, value=args.value, config_cols=cfg, **bars)
        return t, [("", f)]
    if kind == "scaling":
        t = tables.scaling(
            runs, scale_col=args.scale_col, value=args.value, config_cols=cfg, ci=args.ci, **common
        )
        f = figs.scaling_plot(
            runs, scale_col=args.scale_col, value=args.value, config_cols=cfg, **bars
        )
        return t, [("", f)]
    if kind == "grpo":
        # the sweep's axis point (algo/grpo_g4...) tells GRPO variants apart; the tag does not
        algo = args.algo_col or (
            "param.variant"
            if "param.variant" in runs and runs["param.variant"].notna().all()
            else "algo"
        )
        t = tables.grpo(
            runs,
            value=args.value,
            config_cols=cfg,
            algo_col=algo,
            extra=(args.success,),
            ci=args.ci,
            rng=rng,
            **common,
        )
        gcfg = [*cfg, algo]
        return t, [
            ("", figs.throughput_bars(runs, value=args.value, config_cols=gcfg, **bars)),
            ("_success", figs.throughput_bars(runs, value=args.success, config_cols=gcfg, **bars)),
        ]
    if kind == "ablation":
        t = tables.ablation(runs, value=args.value, config_cols=cfg, ci=args.ci, rng=rng)
        fig = figs.ablation_bars(runs, value=args.value, config_cols=cfg, method=args.ci)
        return t, [("", fig)]
    if kind == "staleness":
        what = {"k_col": args.k_col, "value": args.value, "success": args.success}
        what |= {"config_cols": cfg, "scheduler_col": sc}
        t = tables.staleness(runs, ci=args.ci, rng=rng, **what)
        return t, [("", figs.staleness_plot(runs, method=args.ci, **what))]
    if kind == "convergence":
        if curves is None or curves.empty:
            raise SystemExit("convergence needs curves.csv with points")
        # the table and the figure read the same curve the same way
        what = {
            "key": args.key,
            "threshold": args.threshold,
            "window": args.window,
            "config_cols": cfg,
        }
        t = tables.convergence(
            runs,
            curves,
            success=args.success,
            censored=args.censored,
            ci=args.ci,
            rng=rng,
            **what,
            **common,
        )
        fig = figs.convergence_curves(curves, runs, scheduler_col=sc, method=args.ci, **what)
        return t, [("", fig)]
    if kind == "timeline":
        gantts = _gantts(runs, args.runs, args, figs)
        return None, [("_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", n).strip("_"), f) for n, f in gantts]
    raise SystemExit(f"unknown kind {kind!r}; one of {KINDS}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--runs",
        type=Path,
        nargs="+",
        required=True,
        help="folder(s) written by analysis.export; several: their runs reported together",
    )
    ap.add_argument("--kind", choices=KINDS, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--value", default="throughput_e2e", help="runs.csv column to compare")
    ap.add_argument(
        "--config-cols",
        type=_csv_list,
        help=f"columns that define a configuration (default: {', '.join(CONFIG_COLS)}; the last "
        "two only where present and not constant)",
    )
    ap.add_argument("--scheduler-col", default="scheduler_variant")
    ap.add_argument(
        "--target", default=TARGET, help="the scheduler under study (ebrl, EBRLScheduler, EBRL)"
    )
    ap.add_argument("--baselines", type=_csv_list, help="default: every other scheduler")
    ap.add_argument(
        "--where", action="append", default=[], help="COL=V1,V2 or COL!=V1,V2; all must hold"
    )
    ap.add_argument("--scale-col", default="param.num_envs")
    ap.add_argument("--k-col", default="param.scheduler.staleness")
    ap.add_argument("--algo-col", help="grpo: default param.variant where set, else algo")
    ap.add_argument(
        "--success",
        default="success_rate",
        help="runs.csv success column of the staleness, grpo and convergence kinds "
        "(e.g. eval_success_rate)",
    )
    ap.add_argument("--key", default="env/success_rate", help="curve key for convergence")
    ap.add_argument("--threshold", type=float, default=0.8)
    ap.add_argument("--window", type=int, default=5, help="trailing-mean points of a curve")
    ap.add_argument("--censored", choices=("nan", "budget"), default="nan")
    ap.add_argument(
        "--ci",
        choices=("default", "t", "bca", "percentile", "wilson"),
        default="default",
        help="intervals: each statistic's default (t for means, t on paired log ratios for "
        "ratios, Wilson for success rates), or one for every statistic that has it",
    )
    ap.add_argument("--trace", action="append", help="timeline.json file(s) for --kind timeline")
    ap.add_argument("--window-s", help="START,END seconds of the trace to draw")
    ap.add_argument("--seed", type=int, default=0, help="bootstrap random seed")
    args = ap.parse_args(argv)
    runs, curves = read_exports(args.runs)
    runs = _filter(names.display_runs(runs), args.where)
    if args.config_cols is None:
        args.config_cols = [c for c in CONFIG_COLS if _tells_apart(runs, c)]
    need = [*args.config_cols, args.scheduler_col]
    need += {"staleness": [args.k_col], "scaling": [args.scale_col]}.get(args.kind, [])
    absent = [c for c in need if c not in runs]
    if absent:
        raise SystemExit(f"runs.csv has no column {absent}; it has {list(runs.columns)}")
    if curves is not None:
        curves = curves[curves["run_id"].isin(runs["run_id"])]
    try:
        table, fig_list = build(args.kind, runs, curves, args)
    except ValueError as e:  # an input the kind cannot use: say which, no traceback
        raise SystemExit(f"{args.kind}: {e}") from e
    from analysis.figures import save

    args.out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    prov = _provenance(args.runs, argv)
    if table is not None:
        md, tex = args.out / f"{args.kind}.md", args.out / f"{args.kind}.tex"
        md.write_text(f"{table.markdown()}\nProvenance:\n\n{prov}\n")
        tex.write_text(table.latex(label=f"tab:{args.kind}"))
        paths += [md, tex]
        print(table.markdown())
    for suffix, fig in fig_list:
        paths += save(fig, args.out / f"{args.kind}{suffix}")
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
