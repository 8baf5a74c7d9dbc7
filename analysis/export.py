"""MLflow runs -> tidy tables: ``runs.csv`` (a row per run) and ``curves.csv`` (a row per point).

Everything downstream (``analysis.stats``, ``analysis.tables``, ``analysis.figures``,
``analysis.report``) reads only these files, so a report reruns offline from a committed folder.

``runs.csv``: ``run_id``, ``run_name``, ``experiment``, ``status``, ``start_time``, ``end_time``,
the run's tags (``scheduler``, ``policy``, ``simulator``, ``gpu``, ``algo``, ``seed``,
``git_commit``, ``machine``, ``implementation``, then any others but MLflow's own: runs since the
config options are recorded also have ``scheduler_class``, ``policy_class``, ``simulator_task``),
``scheduler_variant`` (the
scheduler with its switched-off levels and a non-static allocator, e.g. ``ebrl[-overlap]+elastic``
or, for runs tagged with class names, ``EBRLScheduler[-overlap]+elastic``; real RLinf by its mode,
``rlinf_async``: what tables compare, so differently set runs never pool), the
requested summary metrics without their ``summary/`` prefix (``throughput_e2e``...) and the key
params as ``param.<dotted name>`` (a default list plus every param that differs between runs; a
param a run's config does not have is empty there: not applicable, not missing).

The tags are written as recorded; ``analysis.names`` turns them into the paper's names (EBRL,
Async, ManiSkill PushCube...) when tables and figures are drawn.

``curves.csv``: ``run_id``, ``step`` (env steps), ``wall_s`` (the run's ``time/wall_s`` at that
step), ``timestamp`` (ms since the epoch), ``key``, ``value``.

A requested metric that a run lacks, or an experiment without runs, is an :class:`ExportError`
naming them; with ``allow_missing`` the cells are written as explicit NaN and ``export.json`` (the
report and provenance) lists them. Runs that did not finish are left out and listed, and so is
a sweep's own run (``ebrl.launch``'s parent of the jobs' runs, tagged ``run_kind=sweep``).

With ``--traces`` each run's ``timeline.json`` artifact is copied to ``traces/<run_id>.json`` for
the Gantt figure.

Usage: ``python -m analysis.export --uri sqlite:///outputs/mlflow/mlflow.db --experiment NAME
[--experiment NAME2] [--tag sweep=headline] [--out DIR] [--allow-missing] [--traces]``
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

#: summary metrics exported as run columns (train.py logs the first four always, success_rate
#: only when episodes ended)
SUMMARY_METRICS = (
    "summary/throughput_e2e",
    "summary/throughput_overall",
    "summary/wall_s",
    "summary/overhead_frac",
    "summary/success_rate",
)
#: summary metrics that only some configurations log (``eval.episodes > 0``): exported when any
#: exported run has one, and then required of every run like the others
OPTIONAL_SUMMARY_METRICS = ("summary/eval_success_rate", "summary/eval_episodes")
#: curve keys; exact names are required of every run, patterns (fnmatch) take what exists
CURVE_KEYS = (
    "throughput/env_steps_per_s",
    "env/success_rate",
    "env/*",
    "eval/*",
    "pipeline/*",
    "time/*/busy_s",
)
#: the curves' time axis: required of every run, joined onto each point as ``wall_s``
WALL_KEY = "time/wall_s"
#: params always exported (when a run has them), besides those that vary between runs
KEY_PARAMS = (
    "variant",
    "gpu.name",
    "num_envs",
    "env_groups",
    "chunk_size",
    "rollout_steps",
    "warmup_iters",
    "simulator.task",
    "policy.size",
    "algo.cfg.group_size",
    "scheduler.backend",
    "scheduler.mode",
    "scheduler.sim_workers",
    "scheduler.overlap",
    "scheduler.pipeline",
    "scheduler.step_level",
    "scheduler.staleness",
    "resources.allocator",
    "threads.gen",
    "threads.train",
    "budget.env_steps",
    "budget.iterations",
    "budget.minutes",
)
#: params that differ between runs by construction: never exported as "varying"
PER_RUN_PARAMS = (
    "run_dir",
    "seed",
    "tracking.run_name",
    "tracking.store",
    "tracking.uri",
    "tracking.parent_run_id",
)
#: the tag ``ebrl.launch`` sets on a sweep's own run (the parent of its jobs' runs): not a job,
#: never exported as one
SWEEP_RUN_TAG = ("run_kind", "sweep")
STANDARD_TAGS = (
    "scheduler",
    "policy",
    "simulator",
    "gpu",
    "algo",
    "seed",
    "git_commit",
    "machine",
    "implementation",
)
#: EBRL's switchable levels, named in ``scheduler_variant`` when off
LEVELS = ("overlap", "pipeline", "step_level")


class ExportError(RuntimeError):
    """The export would be incomplete; the message names the experiments, runs and metrics."""


@dataclass
class ExportReport:
    """What was exported and what was not."""

    uri: str
    experiments: list[str]
    tag_filter: str | None
    n_runs: int = 0
    n_curve_points: int = 0
    #: experiments (or tag filter) with no runs at all
    empty: list[str] = field(default_factory=list)
    #: runs left out because they did not finish: "name (id): STATUS"
    excluded: list[str] = field(default_factory=list)
    #: sweeps' own runs (the parents of the jobs' runs) left out: "name (id)"
    sweeps: list[str] = field(default_factory=list)
    #: "name (id)" -> requested metric keys the run does not have
    missing: dict[str, list[str]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        """A human-readable account, one finding per line."""
        where = ", ".join(self.experiments) or "all experiments"
        if self.tag_filter:
            where += f" where {self.tag_filter}"
        out = [f"exported {self.n_runs} runs, {self.n_curve_points} curve points from {where}"]
        out += [f"empty: {e}" for e in self.empty]
        out += [f"left out (not finished): {r}" for r in self.excluded]
        out += [f"left out (a sweep's own run, parent of its jobs): {r}" for r in self.sweeps]
        out += [f"missing (NaN / no rows): {r}: {', '.join(k)}" for r, k in self.missing.items()]
        return out


@dataclass
class Export:
    """The tidy tables and the report of one export."""

    runs: pd.DataFrame
    curves: pd.DataFrame
    report: ExportReport


def _label(run: Any) -> str:
    return f"{run.info.run_name} ({run.info.run_id})"


def _typed(col: pd.Series) -> pd.Series:
    """MLflow params are strings: make a column numeric or boolean where every value is."""
    vals = col.dropna()
    if len(vals) and vals.isin(["True", "False", "true", "false"]).all():
        return col.map(lambda v: v if pd.isna(v) else str(v).lower() == "true").astype("boolean")
    num = pd.to_numeric(vals, errors="coerce")
    if len(vals) and not num.isna().any():
        return pd.to_numeric(col)
    return col


def _scheduler_variant(params: dict[str, str], scheduler: str | None) -> str:
    """The scheduler with what is switched off or changed: ``EBRLScheduler[-overlap]+elastic``.

    Runs of one scheduler under different settings must not pool into one cell of a table, so the
    levels that are off and a non-static allocator are part of the name, and so is the mode of
    the real-RLinf launcher when its tag is the class name (``RLinfScheduler`` ->
    ``rlinf_async``, the config name users type).
    """
    off = [lv for lv in LEVELS if params.get(f"scheduler.{lv}", "True").lower() == "false"]
    base = scheduler or "unknown"
    if base == "RLinfScheduler" and params.get("scheduler.mode"):
        base = f"rlinf_{params['scheduler.mode']}"
    name = base + (f"[{','.join('-' + lv for lv in off)}]" if off else "")
    alloc = params.get("resources.allocator", "static")
    return name if alloc == "static" else f"{name}+{alloc}"


def _search(client: Any, exp_ids: list[str], flt: str) -> list[Any]:
    runs, token = [], None
    while True:
        page = client.search_runs(exp_ids, filter_string=flt, max_results=1000, page_token=token)
        runs.extend(page)
        token = page.token
        if not token:
            return runs


def _experiments(client: Any, names: Sequence[str]) -> dict[str, str]:
    """name -> id; every name must exist."""
    if not names:
        return {e.name: e.experiment_id for e in client.search_experiments()}
    out, unknown = {}, []
    for n in names:
        exp = client.get_experiment_by_name(n)
        if exp is None:
            unknown.append(n)
        else:
            out[n] = exp.experiment_id
    if unknown:
        have = sorted(e.name for e in client.search_experiments())
        raise ExportError(f"no experiment named {unknown} at this URI; it has {have}")
    return out


def _tag_filter(tag: str | None) -> str:
    if not tag:
        return ""
    k, sep, v = tag.partition("=")
    if not sep or not k:
        raise ExportError(f"a tag filter is KEY=VALUE, not {tag!r}")
    return f"tags.`{k.strip()}` = '{v.strip()}'"


def _curve_keys(available: set[str], requested: Sequence[str]) -> tuple[list[str], list[str]]:
    """(keys to fetch, required keys the run lacks) for one run."""
    keys: list[str] = []
    lacking: list[str] = []
    for pat in requested:
        if any(ch in pat for ch in "*?["):
            keys += [k for k in sorted(available) if fnmatch.fnmatchcase(k, pat)]
        elif pat in available:
            keys.append(pat)
        else:
            lacking.append(pat)
    keys = [k for k in dict.fromkeys(keys) if not k.startswith("summary/")]
    return keys, lacking


def export_runs(
    uri: str,
    experiments: Sequence[str] = (),
    *,
    tag: str | None = None,
    summary_metrics: Sequence[str] = SUMMARY_METRICS,
    curve_keys: Sequence[str] = CURVE_KEYS,
    key_params: Sequence[str] = KEY_PARAMS,
    statuses: Sequence[str] = ("FINISHED",),
    allow_missing: bool = False,
) -> Export:
    """Read runs from an MLflow tracking store into tidy tables.

    Args:
        uri: MLflow tracking URI (``sqlite:///path/mlflow.db``, ``http://host:port``).
        experiments: experiment names; empty means every experiment (useful with ``tag``).
        tag: ``KEY=VALUE``: only runs with this tag (a sweep's name, say).
        summary_metrics: metrics each run must have; its last value becomes a column. Those of
            ``OPTIONAL_SUMMARY_METRICS`` are added when any exported run has them.
        curve_keys: metric histories to export; exact names are required, patterns optional.
        key_params: params always exported; params that differ between runs are added.
        statuses: run statuses to export; the others are left out and listed in the report.
        allow_missing: write NaN (or no curve rows) for missing metrics and empty experiments
            instead of raising; the report lists each.

    Raises:
        ExportError: an unknown experiment; no runs at all; an empty experiment or a run
            without a requested metric (unless ``allow_missing``).
    """
    from mlflow.tracking import MlflowClient  # heavy import (~2 s)

    client = MlflowClient(tracking_uri=uri)
    exps = _experiments(client, experiments)
    flt = _tag_filter(tag)
    report = ExportReport(uri=uri, experiments=list(experiments), tag_filter=flt or None)
    kept: list[tuple[str, Any]] = []
    for name, exp_id in exps.items():
        runs = _search(client, [exp_id], flt)
        jobs = [r for r in runs if r.data.tags.get(SWEEP_RUN_TAG[0]) != SWEEP_RUN_TAG[1]]
        if not jobs and experiments:
            report.empty.append(
                f"experiment {name!r} has no runs" + (f" where {flt}" if flt else "")
            )
        for r in runs:
            if r.data.tags.get(SWEEP_RUN_TAG[0]) == SWEEP_RUN_TAG[1]:
                report.sweeps.append(_label(r))
            elif r.info.status in statuses:
                kept.append((name, r))
            else:
                report.excluded.append(f"{_label(r)}: {r.info.status}")
    if not kept:
        raise ExportError("\n".join(["nothing to export:", *report.lines()[1:]]))
    summary_metrics = list(summary_metrics) + [
        k
        for k in OPTIONAL_SUMMARY_METRICS
        if k not in summary_metrics and any(k in r.data.metrics for _, r in kept)
    ]

    rows, curve_frames = [], []
    for exp_name, r in kept:
        metrics = r.data.metrics
        fetch, lacking = _curve_keys(set(metrics), curve_keys)
        lacking = [k for k in (*summary_metrics, WALL_KEY) if k not in metrics] + lacking
        if lacking:
            report.missing[_label(r)] = lacking
        rows.append(_run_row(exp_name, r, summary_metrics))
        if WALL_KEY in metrics:
            pts = _curves(client, r.info.run_id, fetch)
            gaps = int(pts["wall_s"].isna().sum())
            if gaps:  # a point logged at a step with no time/wall_s: no time axis for it
                report.missing.setdefault(_label(r), []).append(f"{WALL_KEY} at {gaps} points")
            curve_frames.append(pts)
    if (report.missing or report.empty) and not allow_missing:
        head = "incomplete export (--allow-missing writes NaN and lists these):"
        raise ExportError("\n".join([head, *report.lines()[1:]]))
    runs_df = _runs_frame(rows, key_params)
    cols = ["run_id", "step", "wall_s", "timestamp", "key", "value"]
    curves_df = (
        pd.concat(curve_frames, ignore_index=True)[cols]
        if curve_frames
        else (pd.DataFrame(columns=cols))
    )
    report.n_runs, report.n_curve_points = len(runs_df), len(curves_df)
    return Export(runs_df, curves_df, report)


def _run_row(exp_name: str, r: Any, summary_metrics: Sequence[str]) -> dict[str, Any]:
    tags = {k: v for k, v in r.data.tags.items() if not k.startswith("mlflow.")}
    row: dict[str, Any] = {
        "run_id": r.info.run_id,
        "run_name": r.info.run_name,
        "experiment": exp_name,
        "status": r.info.status,
        "start_time": pd.to_datetime(r.info.start_time, unit="ms", utc=True),
        "end_time": pd.to_datetime(r.info.end_time, unit="ms", utc=True)
        if r.info.end_time
        else pd.NaT,
    }
    row.update({k: tags.get(k) for k in STANDARD_TAGS})
    row.update({k: v for k, v in sorted(tags.items()) if k not in STANDARD_TAGS})
    row["scheduler_variant"] = _scheduler_variant(r.data.params, tags.get("scheduler"))
    for k in summary_metrics:
        row[k.removeprefix("summary/")] = r.data.metrics.get(k, np.nan)
    row["_params"] = dict(r.data.params)
    return row


def _runs_frame(rows: list[dict[str, Any]], key_params: Sequence[str]) -> pd.DataFrame:
    params = pd.DataFrame([r.pop("_params") for r in rows])
    df = pd.DataFrame(rows)
    if "seed" in df:
        df["seed"] = _typed(df["seed"])
    # params that differ between the runs that have them, but not those unique by construction
    varying = [c for c in params if params[c].dropna().nunique() > 1 and c not in PER_RUN_PARAMS]
    keep = [c for c in key_params if c in params] + sorted(set(varying) - set(key_params))
    for c in keep:
        df[f"param.{c}"] = _typed(params[c])
    order = ["experiment", "scheduler_variant", "seed", "run_name"]
    return df.sort_values(order, kind="stable").reset_index(drop=True)


def _curves(client: Any, run_id: str, keys: list[str]) -> pd.DataFrame:
    wall = {m.step: m.value for m in client.get_metric_history(run_id, WALL_KEY)}
    pts = [
        (run_id, m.step, wall.get(m.step, np.nan), m.timestamp, k, m.value)
        for k in keys
        for m in client.get_metric_history(run_id, k)
    ]
    df = pd.DataFrame(pts, columns=["run_id", "step", "wall_s", "timestamp", "key", "value"])
    return df.sort_values(["key", "step"], kind="stable")


def download_traces(
    uri: str, run_ids: Sequence[str], out: str | Path, artifact: str = "timeline.json"
) -> tuple[list[Path], list[str]]:
    """Copy each run's trace artifact to ``<out>/traces/<run_id>.json`` (for Gantt figures).

    Returns:
        The written paths, and the run ids that have no such artifact.
    """
    import os
    import shutil
    import tempfile

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")

    client = MlflowClient(tracking_uri=uri)
    folder = Path(out) / "traces"
    folder.mkdir(parents=True, exist_ok=True)
    paths, missing = [], []
    for rid in run_ids:
        if artifact not in {a.path for a in client.list_artifacts(rid)}:
            missing.append(rid)
            continue
        with tempfile.TemporaryDirectory() as tmp:
            src = client.download_artifacts(rid, artifact, tmp)
            dst = folder / f"{rid}.json"
            shutil.copyfile(src, dst)
        paths.append(dst)
    return paths, missing


def write(export: Export, out: str | Path, command: str | None = None) -> list[Path]:
    """Write ``runs.csv``, ``curves.csv`` and ``export.json`` (report and provenance) to ``out``."""
    from ebrl.tracking.provenance import git_commit, portable

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "runs.csv", out / "curves.csv", out / "export.json"]
    export.runs.to_csv(paths[0], index=False)
    export.curves.to_csv(paths[1], index=False)
    meta = {
        "report": {**asdict(export.report), "uri": portable(export.report.uri)},
        "lines": export.report.lines(),
        "analysis_commit": git_commit(),
        "run_commits": sorted(export.runs["git_commit"].dropna().astype(str).unique().tolist()),
        "machines": sorted(export.runs["machine"].dropna().astype(str).unique().tolist()),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": portable(command) if command else command,
    }
    paths[2].write_text(json.dumps(meta, indent=2) + "\n")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uri", required=True, help="MLflow tracking URI, e.g. sqlite:///mlflow.db")
    ap.add_argument("--experiment", action="append", default=[], help="repeatable")
    ap.add_argument("--tag", help="KEY=VALUE: only runs with this tag (a sweep's name)")
    ap.add_argument("--out", help="folder for the tables (default: results/<experiment>/export)")
    ap.add_argument("--metrics", help="comma-separated summary metrics every run must have")
    ap.add_argument("--curves", help="comma-separated curve keys or fnmatch patterns")
    ap.add_argument("--params", help="comma-separated params always exported")
    ap.add_argument("--include-unfinished", action="store_true", help="also FAILED/KILLED/RUNNING")
    ap.add_argument("--allow-missing", action="store_true", help="explicit NaN, listed in report")
    ap.add_argument("--traces", action="store_true", help="also copy timeline.json artifacts")
    args = ap.parse_args(argv)
    if not args.experiment and not args.tag:
        ap.error("name at least one --experiment or a --tag")

    def split(s: str | None, default: Sequence[str]) -> Sequence[str]:
        return default if s is None else [x.strip() for x in s.split(",") if x.strip()]

    statuses = ("FINISHED", "FAILED", "KILLED", "RUNNING", "SCHEDULED")
    try:
        ex = export_runs(
            args.uri,
            args.experiment,
            tag=args.tag,
            summary_metrics=split(args.metrics, SUMMARY_METRICS),
            curve_keys=split(args.curves, CURVE_KEYS),
            key_params=split(args.params, KEY_PARAMS),
            statuses=statuses if args.include_unfinished else ("FINISHED",),
            allow_missing=args.allow_missing,
        )
    except ExportError as e:
        print(f"export failed: {e}", file=sys.stderr)
        return 1
    cmd = " ".join(["python -m analysis.export", *(argv if argv is not None else sys.argv[1:])])
    name = "+".join(args.experiment) or args.tag.partition("=")[2]
    paths = write(ex, args.out or Path("results") / name / "export", command=cmd)
    if args.traces:
        got, lacking = download_traces(args.uri, ex.runs["run_id"].tolist(), paths[0].parent)
        paths += got
        if lacking:
            print(f"no timeline.json artifact: {', '.join(lacking)}")
    print("\n".join(ex.report.lines()))
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
