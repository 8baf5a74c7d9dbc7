"""The paper's motivation measurements from run folders: our numbers beside the paper's.

The EBRL paper motivates its design with what a run of today's systems does to the machine:
GPUs mostly idle (>90% of RL time under 50% utilisation; >75% of generation time under 20% SM
occupancy), CPU cores partly busy (22 of 56 above 50%), a long simulator step tail (P99 60 ms
against a 40 ms mean) and trajectories that shorten as the policy learns (31%). This
module computes the same statistics from runs made with ``tracking.utilisation=true`` (``make
fig-motivation``: the Colocated, Hybrid, Async and EBRL runs of ``conf/sweep/motivation.yaml`` and
a learning run), draws the figures (``analysis.motivation_figures``) and writes
``motivation.md`` (the table side by side with the paper, with provenance), ``motivation.json``
and the tidy data behind the figures.

What each run folder gives (``ebrl.train``): ``utilisation.csv`` (every allowed core and visible
GPU every 0.2 s, on the timeline's clock: ``ebrl.utilisation``), ``timeline.json`` (stage spans),
``metrics.csv`` (one row per update: ``env/episode_len``, and the env workers' per-env
``sim/env<i>/step_ms_p50`` / ``_p99`` where they report them), ``summary.json``, ``config.yaml``.

How the statistics are made:

- *RL time* is the run's span from its first stage span to its last (Ray's start, the shape
  search's profile and the shutdown are left out).
- GPU: the share of GPU samples (all visible GPUs) under 50% utilisation; the share of
  generation time under 20% SM occupancy weights each sample by the ``gen`` span time in its
  interval. Without a GPU (or without GPM for SM occupancy) they are n/a, said so.
- CPU: each core's mean busy % over RL time; the cores above 50% are counted. The CPU analogue
  of the GPU statistic is the share of samples whose mean over the cores is under 50%.
- Step latency: every ``sim`` span (an env worker or group stepping ``batch`` envs through one
  chunk of K actions) gives the time per env step, span time / (batch x K), weighted by its
  batch x K steps; the CDF is per track (env worker or group), the P99 and mean over all. This
  is a mean over the K steps and the span's envs, so its tail is shorter than that of single
  ``env.step`` calls; where the env workers report per-env ``env.step`` percentiles (metrics
  ``sim/env<i>/step_ms_p99``) those are shown too.
- Trajectory shortening: ``env/episode_len`` in the first fifth of the updates that finished
  episodes against the last fifth.

Usage::

    python -m analysis.motivation --runs outputs/sweeps/motivation-cpu/<time> \\
        --out results/motivation-cpu
    python -m analysis.motivation --uri sqlite:///outputs/mlflow/mlflow.db \\
        --experiment motivation-cpu-<time> --out results/motivation-cpu
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from analysis import files, names
from ebrl.timeline import covered_s

#: what a run folder holds that this module reads
RUN_FILES = ("summary.json", "config.yaml", "metrics.csv", "timeline.json", "utilisation.csv")
#: the paper's figures: statistic -> (what the paper reports, its value as a number)
PAPER = {
    "gpu_under_50": (">90% of RL time", 0.90),
    "gen_sm_under_20": (">75% of generation time", 0.75),
    "cores_above_50": ("22 of 56 cores (39%)", 22 / 56),
    "cpu_under_50": ("not reported", math.nan),
    "step_latency": ("P99 60 ms vs mean 40 ms (1.50x)", 1.5),
    "env_step_p99": ("P99 60 ms vs mean 40 ms (1.50x)", 1.5),
    "shortening": ("31% shorter", 0.31),
}
#: schedulers in the order the paper shows them
ORDER = ("colocated", "hybrid", "async", "ebrl")


# --- one run ----------------------------------------------------------------------------------
@dataclass
class Run:
    """One run folder's data, as the statistics read it.

    Attributes:
        key: a short unique name (the sweep's variant, else the scheduler option).
        label: what tables and figures call it (the paper's names).
        folder: the run folder.
        summary: ``summary.json``.
        config: ``config.yaml`` (resolved).
        metrics: ``metrics.csv`` (None: absent).
        util: ``utilisation.csv`` (None: absent: the run did not sample).
        spans: the trace's stage spans: track, stage, start_s, end_s, batch, reset.
    """

    key: str
    label: str
    folder: Path
    summary: dict[str, Any]
    config: dict[str, Any]
    metrics: pd.DataFrame | None
    util: pd.DataFrame | None
    spans: pd.DataFrame

    @property
    def chunk(self) -> int:
        return int(self.config.get("chunk_size") or 1)

    def window(self) -> tuple[float, float] | None:
        """(first span start, last span end): the run's RL time on the timeline's clock."""
        if self.spans.empty:
            return None
        return float(self.spans["start_s"].min()), float(self.spans["end_s"].max())


def read_spans(path: Path) -> pd.DataFrame:
    """The complete events of a ``timeline.json`` with their ``batch`` and ``reset`` args."""
    cols = ["track", "stage", "start_s", "end_s", "batch", "reset"]
    if not path.exists():
        return pd.DataFrame(columns=cols)
    data = json.loads(path.read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    tracks = {
        (e.get("pid"), e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    rows = []
    for e in events:
        if e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        start = e["ts"] / 1e6
        rows.append(
            {
                "track": tracks.get((e.get("pid"), e["tid"]), str(e["tid"])),
                "stage": e["name"],
                "start_s": start,
                "end_s": start + e.get("dur", 0.0) / 1e6,
                "batch": float(args.get("batch", math.nan)),
                "reset": bool(args.get("reset", 0)),
            }
        )
    return pd.DataFrame(rows, columns=cols)


def _label(summary: dict[str, Any], config: dict[str, Any], variant: str) -> str:
    sched = names.display("scheduler", str(summary.get("scheduler", "?")))
    if variant.endswith("learning"):
        pol = names.display("policy", str(summary.get("policy", "?")))
        return f"{sched}, learning run ({pol}, K={config.get('chunk_size')})"
    return sched


def load_run(folder: str | Path) -> Run:
    """Read a run folder (``summary.json`` must exist; the rest may be missing)."""
    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text())
    cfg_path = folder / "config.yaml"
    config = (yaml.safe_load(cfg_path.read_text()) or {}) if cfg_path.exists() else {}
    variant = str(config.get("variant") or "")
    key = variant.rsplit("/", 1)[-1] if variant else str(summary.get("scheduler", folder.name))
    metrics = (
        files.read_csv(folder / "metrics.csv") if files.exists(folder / "metrics.csv") else None
    )
    util = (
        files.read_csv(folder / "utilisation.csv")
        if files.exists(folder / "utilisation.csv")
        else None
    )
    return Run(
        key=key,
        label=_label(summary, config, variant),
        folder=folder,
        summary=summary,
        config=config,
        metrics=metrics,
        util=util,
        spans=read_spans(folder / "timeline.json"),
    )


def _rank(run: Run) -> tuple[int, str]:
    sched = names.key("scheduler", str(run.summary.get("scheduler", "")))
    learning = run.key.endswith("learning")
    pos = ORDER.index(sched) if sched in ORDER and not learning else len(ORDER) + learning
    return pos, run.key


def find_runs(root: str | Path) -> list[Run]:
    """Every finished run under ``root`` (run folders hold ``summary.json``), in the paper's
    order (Colocated, Hybrid, Async, EBRL, then the rest); keys made unique by seed."""
    runs = []
    for path in sorted(Path(root).rglob("summary.json")):
        if json.loads(path.read_text()).get("status") == "FINISHED":
            runs.append(load_run(path.parent))
    runs.sort(key=_rank)
    seen: dict[str, int] = {}
    for r in runs:
        seen[r.key] = seen.get(r.key, 0) + 1
    for r in runs:
        if seen[r.key] > 1:  # several seeds of one variant: keep them apart
            r.key, r.label = (
                f"{r.key}-s{r.summary.get('seed')}",
                f"{r.label} s{r.summary.get('seed')}",
            )
    return runs


def fetch(uri: str, experiment: str, dest: str | Path) -> Path:
    """Download the finished job runs of an MLflow experiment (not the sweep's own run) into
    ``<dest>/<run name>/`` (the files of :data:`RUN_FILES` each has); returns ``dest``."""
    import os

    from mlflow.tracking import MlflowClient

    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise SystemExit(f"no experiment {experiment!r} at {uri}")
    dest = Path(dest)
    for r in client.search_runs([exp.experiment_id], "attributes.status = 'FINISHED'"):
        if r.data.tags.get("run_kind") == "sweep":
            continue
        folder = dest / f"{r.info.run_name}-{r.info.run_id[:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        have = {a.path for a in client.list_artifacts(r.info.run_id)}
        for name in RUN_FILES:
            if name in have:
                client.download_artifacts(r.info.run_id, name, str(folder))
    return dest


# --- statistics -------------------------------------------------------------------------------
def _in_window(util: pd.DataFrame, window: tuple[float, float] | None) -> pd.DataFrame:
    if window is None:
        return util
    return util[(util["t_s"] >= window[0]) & (util["t_s"] <= window[1])]


def cpu_stats(run: Run) -> dict[str, Any]:
    """Per-core mean busy % over RL time, the cores above 50%, and the share of samples whose
    mean over the cores is under 50% (empty without ``utilisation.csv``)."""
    if run.util is None:
        return {}
    cpu = _in_window(run.util[run.util["device"] == "cpu"], run.window())
    if cpu.empty:
        return {}
    per_core = cpu.groupby("index")["util_pct"].mean()
    per_sample = cpu.groupby("t_s")["util_pct"].mean()
    return {
        "cores": int(per_core.size),
        "cores_above_50": int((per_core > 50).sum()),
        "core_mean_pct": {int(k): round(float(v), 1) for k, v in per_core.items()},
        "cpu_under_50": float((per_sample < 50).mean()),
        "cpu_mean_pct": float(per_sample.mean()),
    }


def _covered(spans: pd.DataFrame, lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one of ``spans``."""
    return covered_s(zip(spans["start_s"], spans["end_s"], strict=True), lo, hi)


def gpu_stats(run: Run) -> dict[str, Any]:
    """The GPU statistics, or why they are n/a (``na``): the share of samples under 50%
    utilisation over RL time, and of generation time under 20% SM occupancy."""
    if run.util is None:
        return {"na": "not sampled (tracking.utilisation was off)"}
    gpu = _in_window(run.util[run.util["device"] == "gpu"], run.window())
    if gpu.empty:
        return {"na": "no GPU: NVML found none this run could see"}
    out: dict[str, Any] = {
        "gpus": int(gpu["index"].nunique()),
        "gpu_under_50": float((gpu["util_pct"] < 50).mean()),
        "gpu_mean_pct": float(gpu["util_pct"].mean()),
    }
    occ = gpu.dropna(subset=["sm_occupancy_pct"])
    if occ.empty:
        out["sm_na"] = "no SM occupancy: this GPU or driver has no GPM (NVML)"
        return out
    gen = run.spans[run.spans["stage"] == "gen"]
    times = np.sort(run.util["t_s"].unique())
    prev = dict(zip(times[1:], times[:-1], strict=True))  # a sample covers (previous, own]
    weights = np.array(
        [_covered(gen, prev.get(t, t), t) for t in occ["t_s"]],
        dtype=float,
    )
    if weights.sum() <= 0:
        out["sm_na"] = "no generation span overlaps the GPU samples"
        return out
    low = (occ["sm_occupancy_pct"].to_numpy() < 20).astype(float)
    out["gen_sm_under_20"] = float((low * weights).sum() / weights.sum())
    out["gen_sm_mean_pct"] = float((occ["sm_occupancy_pct"] * weights).sum() / weights.sum())
    return out


def step_latency(run: Run) -> pd.DataFrame:
    """Time per env step of every ``sim`` span: track, start_s, step_ms, steps (its weight)."""
    sim = run.spans[(run.spans["stage"] == "sim") & ~run.spans["reset"]]
    sim = sim[sim["batch"].notna() & (sim["batch"] > 0)]
    steps = sim["batch"] * run.chunk
    return pd.DataFrame(
        {
            "track": sim["track"].to_numpy(),
            "start_s": sim["start_s"].to_numpy(),
            "step_ms": ((sim["end_s"] - sim["start_s"]) / steps * 1e3).to_numpy(),
            "steps": steps.to_numpy(),
        }
    )


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight reaches ``q`` of the total."""
    order = np.argsort(values)
    v, w = np.asarray(values, float)[order], np.asarray(weights, float)[order]
    cum = np.cumsum(w)
    return float(v[np.searchsorted(cum, q * cum[-1], side="left")])


def latency_stats(lat: pd.DataFrame) -> dict[str, Any]:
    """Mean and P99 of the time per env step over all sim spans (weighted by steps)."""
    if lat.empty:
        return {}
    v, w = lat["step_ms"].to_numpy(), lat["steps"].to_numpy()
    mean = float((v * w).sum() / w.sum())
    p99 = weighted_quantile(v, w, 0.99)
    return {
        "mean_ms": mean,
        "p50_ms": weighted_quantile(v, w, 0.5),
        "p99_ms": p99,
        "p99_over_mean": p99 / mean if mean > 0 else math.nan,
        "spans": len(lat),
        "tracks": int(lat["track"].nunique()),
    }


def env_gauges(run: Run) -> dict[str, Any]:
    """The env workers' own per-env ``env.step`` percentiles (their latest report), where the
    run's metrics have them: ``sim/env<i>/step_ms_p50`` and ``_p99``."""
    if run.metrics is None:
        return {}
    cols = [c for c in run.metrics if c.startswith("sim/env") and c.endswith("_p99")]
    if not cols:
        return {}
    last = run.metrics.ffill().iloc[-1]
    p99 = np.array([last[c] for c in cols], dtype=float)
    p50 = np.array([last.get(c[: -len("_p99")] + "_p50", np.nan) for c in cols], dtype=float)
    p99, p50 = p99[~np.isnan(p99)], p50[~np.isnan(p50)]
    if not p99.size:
        return {}
    return {
        "envs": int(p99.size),
        "p99_median_ms": float(np.median(p99)),
        "p99_max_ms": float(p99.max()),
        "p50_median_ms": float(np.median(p50)) if p50.size else math.nan,
    }


def episode_lengths(run: Run) -> pd.DataFrame:
    """``env/episode_len`` per update that finished episodes: iteration, env_steps, episode_len."""
    cols = ["iteration", "env_steps", "episode_len"]
    m = run.metrics
    if m is None or "env/episode_len" not in m:
        return pd.DataFrame(columns=cols)
    m = m.dropna(subset=["env/episode_len"])
    steps = m["env/steps_total"] if "env/steps_total" in m else m.index.to_series()
    it = m["iteration"] if "iteration" in m else m.index.to_series()
    return pd.DataFrame(
        {
            "iteration": it.to_numpy(),
            "env_steps": steps.to_numpy(),
            "episode_len": m["env/episode_len"].to_numpy(),
        },
        columns=cols,
    )


def shortening(lengths: pd.DataFrame) -> dict[str, Any]:
    """Mean episode length over the first and the last fifth of the updates, and how much
    shorter the last is (fewer than 4 updates with finished episodes: nothing to compare)."""
    n = len(lengths)
    if n < 4:
        return {"na": f"{n} update(s) finished episodes: too few to compare"}
    k = max(1, n // 5)
    first = float(lengths["episode_len"].iloc[:k].mean())
    last = float(lengths["episode_len"].iloc[-k:].mean())
    return {"first": first, "last": last, "shortening": 1.0 - last / first, "updates": n}


@dataclass
class RunStats:
    """Every statistic of one run (``motivation.json``)."""

    key: str
    label: str
    run_dir: str
    seed: int | None
    commit: str
    machine: str
    wall_s: float
    cpu: dict[str, Any] = field(default_factory=dict)
    gpu: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, Any] = field(default_factory=dict)
    env_latency: dict[str, Any] = field(default_factory=dict)
    trajectory: dict[str, Any] = field(default_factory=dict)


def stats(run: Run) -> RunStats:
    from ebrl.tracking.provenance import portable

    return RunStats(
        key=run.key,
        label=run.label,
        run_dir=portable(str(run.folder)),
        seed=run.summary.get("seed"),
        commit=str(run.summary.get("commit", "unknown")),
        machine=str(run.summary.get("machine", "unknown")),
        wall_s=float(run.summary.get("wall_s", math.nan)),
        cpu=cpu_stats(run),
        gpu=gpu_stats(run),
        latency=latency_stats(step_latency(run)),
        env_latency=env_gauges(run),
        trajectory=shortening(episode_lengths(run)),
    )


# --- the table --------------------------------------------------------------------------------
def _pct(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0%}"


def _ms(x: float) -> str:
    """Milliseconds to three significant figures (a counting env steps in microseconds)."""
    return f"{x:.3g} ms"


def _na(reason: str) -> str:
    """A table cell for a statistic that cannot be had; the notes say why at length."""
    return "n/a (no GPU)" if reason.startswith("no GPU") else f"n/a ({reason})"


def cells(s: RunStats) -> dict[str, str]:
    """One run's column of the table: statistic -> text."""
    g, c, lat, env, tr = s.gpu, s.cpu, s.latency, s.env_latency, s.trajectory
    out = {
        "gpu_under_50": _pct(g.get("gpu_under_50")) if "na" not in g else _na(g["na"]),
        "gen_sm_under_20": (
            _na(g["na"])
            if "na" in g
            else _pct(g["gen_sm_under_20"])
            if "gen_sm_under_20" in g
            else f"n/a ({g.get('sm_na')})"
        ),
        "cores_above_50": (
            f"{c['cores_above_50']} of {c['cores']} ({c['cores_above_50'] / c['cores']:.0%})"
            if c
            else "n/a (not sampled)"
        ),
        "cpu_under_50": _pct(c.get("cpu_under_50")) if c else "n/a (not sampled)",
        "step_latency": (
            f"P99 {_ms(lat['p99_ms'])} vs mean {_ms(lat['mean_ms'])} ({lat['p99_over_mean']:.2f}x)"
            if lat
            else "n/a (no sim spans)"
        ),
        "env_step_p99": (
            f"P99 {_ms(env['p99_median_ms'])} (median over {env['envs']} envs; worst "
            f"{_ms(env['p99_max_ms'])}) vs P50 {_ms(env['p50_median_ms'])}"
            if env
            else "n/a (not reported by the env workers)"
        ),
        "shortening": (
            f"{tr['first']:.1f} -> {tr['last']:.1f} steps ({tr['shortening']:.0%} shorter)"
            if "shortening" in tr
            else f"n/a ({tr.get('na')})"
        ),
    }
    return out


ROWS = {
    "gpu_under_50": "GPU: share of RL time under 50% utilisation",
    "gen_sm_under_20": "GPU: share of generation time under 20% SM occupancy",
    "cores_above_50": "CPU: cores above 50% busy, mean over RL time",
    "cpu_under_50": "CPU analogue of the first row: share of RL time, cores' mean under 50%",
    "step_latency": "Simulator step latency from the sim spans (chunk time / envs x K)",
    "env_step_p99": "Simulator env.step latency per env, timed by the env workers",
    "shortening": "Trajectory length, first vs last fifth of the updates (paper: over training)",
}


def table(all_stats: Sequence[RunStats]) -> str:
    """The Markdown table: a row per statistic, the paper's figure, then a column per run."""
    head = ["statistic", "paper", *(s.label for s in all_stats)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    cols = [cells(s) for s in all_stats]
    for key, title in ROWS.items():
        lines.append("| " + " | ".join([title, PAPER[key][0], *(c[key] for c in cols)]) + " |")
    return "\n".join(lines)


def notes(all_stats: Sequence[RunStats]) -> list[str]:
    out = [
        "RL time: from a run's first stage span to its last (Ray's start, EBRL's shape-search "
        "profile and the shutdown are left out); CPU and GPU sampled every "
        "`tracking.utilisation_interval_s` (0.2 s) by `ebrl.utilisation`.",
        "Step latency from the sim spans is a mean over a chunk's K steps and the span's envs: "
        "its tail is shorter than single env.step calls'; the paper's is per env.step.",
    ]
    if all(s.gpu.get("na", "").startswith("no GPU") for s in all_stats):
        out.append(
            "No GPU: NVML found none these runs could see, so the GPU rows are n/a and the CPU "
            "rows are the analogue. "
            "On a GPU node the same target samples every GPU through NVML (SM occupancy through "
            "GPM on Hopper and later)."
        )
    return out


def provenance(all_stats: Sequence[RunStats], argv: Sequence[str]) -> list[str]:
    from ebrl.tracking.provenance import git_commit, portable

    return [
        f"report: `{portable('python -m analysis.motivation ' + ' '.join(argv))}` "
        f"({time.strftime('%Y-%m-%d %H:%M:%S %Z')}); analysis commit {git_commit()}",
        f"run commits: {', '.join(sorted({s.commit for s in all_stats}))}",
        f"machines: {'; '.join(sorted({s.machine for s in all_stats}))}",
        *(f"{s.label}: `{s.run_dir}` ({s.wall_s:.0f} s)" for s in all_stats),
    ]


# --- the report -------------------------------------------------------------------------------
def write_data(runs: Sequence[Run], out: Path) -> list[Path]:
    """The tidy tables behind the figures: utilisation, step latency, episode lengths."""
    out.mkdir(parents=True, exist_ok=True)
    frames: dict[str, list[pd.DataFrame]] = {
        "utilisation": [],
        "step_latency": [],
        "episode_len": [],
    }
    for r in runs:
        if r.util is not None:
            frames["utilisation"].append(r.util.assign(run=r.key))
        frames["step_latency"].append(step_latency(r).assign(run=r.key))
        frames["episode_len"].append(episode_lengths(r).assign(run=r.key))
    paths = []
    for name, parts in frames.items():
        parts = [p for p in parts if not p.empty]
        if parts:
            df = pd.concat(parts, ignore_index=True)
            df = df[["run", *(c for c in df.columns if c != "run")]]
            path = out / f"{name}.csv"
            df.to_csv(path, index=False, float_format="%.4g")
            paths.append(path)
    return paths


def report(runs: Sequence[Run], out: str | Path, argv: Sequence[str]) -> list[Path]:
    """Write ``motivation.md`` / ``.json``, the figures and the data into ``out``."""
    from analysis import motivation_figures as mf
    from analysis.figures import save

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    all_stats = [stats(r) for r in runs]
    paths = []
    for name, fig in mf.all_figures(runs):
        paths += save(fig, out / f"motivation_{name}")
    paths += write_data(runs, out / "data")
    md = [
        "# The paper's motivation measurements, ours beside them",
        "",
        table(all_stats),
        "",
        *(f"- {n}" for n in notes(all_stats)),
        "",
        "Figures: " + ", ".join(f"`{p.name}`" for p in paths if p.suffix == ".png"),
        "",
        "## Provenance",
        "",
        *(f"- {x}" for x in provenance(all_stats, argv)),
        "",
    ]
    (out / "motivation.md").write_text("\n".join(md))
    (out / "motivation.json").write_text(
        json.dumps([asdict(s) for s in all_stats], indent=2, default=str) + "\n"
    )
    return [out / "motivation.md", out / "motivation.json", *paths]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", help="a folder holding run folders (a sweep's --out)")
    ap.add_argument("--uri", help="or: an MLflow tracking URI to download the runs from")
    ap.add_argument("--experiment", help="with --uri: the sweep's experiment")
    ap.add_argument("--out", required=True, help="where the report goes (results/motivation-cpu)")
    args = ap.parse_args(argv)
    argv = list(argv if argv is not None else sys.argv[1:])
    if args.uri:
        if not args.experiment:
            ap.error("--uri needs --experiment")
        root = fetch(args.uri, args.experiment, Path(args.out) / "runs")
    elif args.runs:
        root = Path(args.runs)
    else:
        ap.error("give --runs DIR, or --uri and --experiment")
    runs = find_runs(root)
    if not runs:
        print(f"no finished run folders (summary.json) under {root}", file=sys.stderr)
        return 1
    paths = report(runs, args.out, argv)
    print((Path(args.out) / "motivation.md").read_text())
    print("\n".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
