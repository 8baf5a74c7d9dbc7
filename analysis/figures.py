"""The paper's figures from the tidy tables (seaborn style, matplotlib Agg; PNG and PDF).

Each function takes the runs (and curves) DataFrames and the grouping columns and returns a
``matplotlib`` figure; :func:`save` writes it as ``<stem>.png`` and ``<stem>.pdf``. Error bars and
bands are the same 95% CIs over seeds as the tables (``analysis.stats``: each statistic's default,
Student t for a mean, Wilson's for a success rate, unless ``method`` says otherwise), and each
figure names its interval in a caption line; per-seed values are
drawn as dots so a reader sees how few there are. Schedulers, policies and simulators carry the
paper's names (``analysis.names``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI machines or clusters

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from analysis import names, stats
from analysis.tables import LEVELS, is_rate, label, summarize_column, with_levels

sns.set_theme(style="whitegrid", context="paper")
#: stage -> colour, fixed so every Gantt in a paper agrees
STAGE_COLORS = {
    "sim": "#4C72B0",
    "gen": "#DD8452",
    "train": "#55A868",
    "sync": "#C44E52",
    "load": "#8172B3",
}


def save(fig: Figure, stem: str | Path) -> list[Path]:
    """Write ``<stem>.png`` (200 dpi) and ``<stem>.pdf``, close the figure, return the paths."""
    stem = Path(stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    paths = [stem.with_suffix(".png"), stem.with_suffix(".pdf")]
    for p in paths:
        fig.savefig(p, dpi=200, bbox_inches="tight")
    plt.close(fig)
    return paths


def _caption(fig: Figure, what: str, method: str | None, value: str = "") -> None:
    """A line above the figure naming its interval: ``whiskers: 95% Student t CI (mean over
    seeds)`` (above: some legends sit below the panels); ``value``'s statistic picks it."""
    m = stats.method_for("rate" if is_rate(value) else "mean", method)
    fig.text(0.0, 1.0, f"{what}: {stats.ci_label(m)}", fontsize=6, va="bottom", ha="left")


def _config_label(df: pd.DataFrame, cols: Sequence[str]) -> pd.Series:
    if not cols:
        return pd.Series("all", index=df.index)
    return df[list(cols)].astype(str).agg(" / ".join, axis=1)


def _palette(names: Sequence[str]) -> dict[str, tuple]:
    return dict(zip(names, sns.color_palette("deep", max(len(names), 1))))


def throughput_bars(
    runs: pd.DataFrame,
    *,
    value: str = "throughput_e2e",
    config_cols: Sequence[str] = ("simulator", "policy"),
    scheduler_col: str = "scheduler_variant",
    order: Sequence[str] | None = None,
    rng: np.random.Generator | None = None,
    method: str | None = None,
) -> Figure:
    """Grouped bars: one group per configuration, one bar per scheduler, 95% CI whiskers."""
    runs = names.display_runs(runs)
    df = runs.assign(_cfg=_config_label(runs, config_cols))
    summ = summarize_column(df, value, ["_cfg", scheduler_col], method, rng)
    cfgs = list(dict.fromkeys(sorted(df["_cfg"])))
    scheds = list(order or sorted(df[scheduler_col].dropna().unique()))
    pal = _palette(scheds)
    width = 0.8 / max(len(scheds), 1)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 + 0.5 * len(cfgs) * len(scheds)), 3.2))
    for j, s in enumerate(scheds):
        for i, c in enumerate(cfgs):
            row = summ[(summ["_cfg"] == c) & (summ[scheduler_col] == s)]
            if row.empty:
                continue
            r = row.iloc[0]
            x = i + (j - (len(scheds) - 1) / 2) * width
            err = [[r["mean"] - r["ci_low"]], [r["ci_high"] - r["mean"]]] if r["n"] > 1 else None
            ax.bar(x, r["mean"], width * 0.9, color=pal[s], label=s if i == 0 else None)
            if err is not None:
                ax.errorbar(x, r["mean"], yerr=err, color="black", capsize=3, lw=1)
            pts = df.loc[(df["_cfg"] == c) & (df[scheduler_col] == s), value]
            ax.scatter(np.full(len(pts), x), pts, s=8, color="black", alpha=0.6, zorder=3)
    ax.set_xticks(range(len(cfgs)), [c.replace(" / ", "\n") for c in cfgs])
    ax.set_ylabel(label(value))
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    _caption(fig, "bars: mean; whiskers", method, value)
    return fig


def convergence_curves(
    curves: pd.DataFrame,
    runs: pd.DataFrame,
    *,
    key: str = "env/success_rate",
    threshold: float | None = 0.8,
    window: int = 5,
    config_cols: Sequence[str] = ("simulator", "policy"),
    scheduler_col: str = "scheduler_variant",
    rng: np.random.Generator | None = None,
    method: str | None = None,
) -> Figure:
    """Smoothed ``key`` against wall-clock seconds: mean and 95% CI band per scheduler, one panel
    per configuration; a dashed line at ``threshold``."""
    runs = names.display_runs(runs)
    r = runs.assign(_cfg=_config_label(runs, config_cols))
    by = ["_cfg", scheduler_col]
    band = stats.method_for("mean", method)
    bands = stats.curve_bands(curves, r, by, key=key, window=window, rng=rng, method=band)
    cfgs = sorted(bands["_cfg"].unique()) or ["all"]
    pal = _palette(sorted(r[scheduler_col].dropna().unique()))
    fig, axes = plt.subplots(1, len(cfgs), figsize=(4.2 * len(cfgs), 3.2), squeeze=False)
    for ax, c in zip(axes[0], cfgs):
        for s, g in bands[bands["_cfg"] == c].groupby(scheduler_col):
            ax.plot(g["t"], g["mean"], color=pal[s], label=f"{s} (n={int(g['n'].iloc[0])})")
            ax.fill_between(g["t"], g["ci_low"], g["ci_high"], color=pal[s], alpha=0.25, lw=0)
        if threshold is not None:
            ax.axhline(threshold, color="grey", ls="--", lw=1)
        ax.set_title(c, fontsize=9)
        ax.set_xlabel("wall-clock s")
        ax.set_ylabel(f"{key} ({window}-point mean)")
    _shared_legend(fig, axes, below=True)
    _caption(fig, "lines: mean over runs; bands, pointwise", method)
    return fig


def _mean_ci_lines(
    ax: plt.Axes,
    df: pd.DataFrame,
    x: str,
    value: str,
    scheduler_col: str,
    rng: np.random.Generator,
    pal: dict[str, tuple],
    method: str | None = None,
) -> None:
    """Mean with 95% CI error bars against a numeric ``x``, a line per scheduler; schedulers
    without ``x`` (NaN) are drawn as a dashed horizontal reference."""
    summ = summarize_column(df, value, [scheduler_col, x], method, rng)
    for s, g in summ.groupby(scheduler_col):
        ref = g[g[x].isna()]
        if len(ref):
            ax.axhline(
                ref["mean"].iloc[0], color=pal[s], ls="--", lw=1, label=f"{s} (no {label(x)})"
            )
        g = g.dropna(subset=[x]).sort_values(x)
        if g.empty:
            continue
        err = np.vstack([g["mean"] - g["ci_low"], g["ci_high"] - g["mean"]])
        ax.errorbar(
            g[x],
            g["mean"],
            yerr=np.nan_to_num(err),
            marker="o",
            ms=4,
            capsize=3,
            color=pal[s],
            label=s,
        )


def _shared_legend(fig: Figure, axes: np.ndarray, below: bool = False) -> None:
    """One legend for all panels (labels deduplicated), right of them or below them."""
    seen: dict[str, object] = {}
    for ax in np.ravel(axes):
        for h, n in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(n, h)
    fig.tight_layout()
    where = (
        {"loc": "upper center", "bbox_to_anchor": (0.5, 0.0), "ncol": min(3, max(len(seen), 1))}
        if below
        else {"loc": "upper left", "bbox_to_anchor": (1.0, 0.95)}
    )
    fig.legend(list(seen.values()), list(seen), fontsize=7, frameon=False, **where)


def staleness_plot(
    runs: pd.DataFrame,
    *,
    k_col: str = "param.scheduler.staleness",
    value: str = "throughput_e2e",
    success: str = "success_rate",
    config_cols: Sequence[str] = ("simulator", "policy"),
    scheduler_col: str = "scheduler_variant",
    rng: np.random.Generator | None = None,
    method: str | None = None,
) -> Figure:
    """Throughput and final success (mean, 95% CI) against the staleness bound k: two panels per
    configuration (a row each); schedulers without k are dashed reference lines."""
    rng = rng or np.random.default_rng(0)
    runs = names.display_runs(runs)
    df = runs.assign(_cfg=_config_label(runs, config_cols))
    cfgs = sorted(df["_cfg"].unique())
    pal = _palette(sorted(df[scheduler_col].dropna().unique()))
    fig, axes = plt.subplots(len(cfgs), 2, figsize=(7.0, 2.8 * len(cfgs)), squeeze=False)
    for row, c in zip(axes, cfgs):
        for ax, v in zip(row, (value, success)):
            _mean_ci_lines(ax, df[df["_cfg"] == c], k_col, v, scheduler_col, rng, pal, method)
            ax.set_xlabel(f"staleness bound {label(k_col)}")
            ax.set_ylabel(label(v))
            ax.set_title(c, fontsize=9)
            ax.set_xticks(sorted(df[k_col].dropna().unique()))
    _shared_legend(fig, axes)
    _caption(fig, "points: mean; error bars (throughput)", method, value)
    _caption_rate(fig, success, method)
    return fig


def _caption_rate(fig: Figure, success: str, method: str | None) -> None:
    """A second caption line for a success panel, whose interval is a rate's."""
    if is_rate(success):
        m = stats.method_for("rate", method)
        text = f"error bars (success): {stats.ci_label(m)}"
        fig.text(0.0, 1.02, text, fontsize=6, va="bottom", ha="left")


def scaling_plot(
    runs: pd.DataFrame,
    *,
    scale_col: str = "param.num_envs",
    value: str = "throughput_e2e",
    config_cols: Sequence[str] = ("simulator", "policy"),
    scheduler_col: str = "scheduler_variant",
    rng: np.random.Generator | None = None,
    method: str | None = None,
) -> Figure:
    """Throughput against a scale column (envs, GPUs...), a line per scheduler with 95% CI bars,
    a panel per configuration; log2 axis when the scale spans 8x or more."""
    rng = rng or np.random.default_rng(0)
    runs = names.display_runs(runs)
    df = runs.assign(_cfg=_config_label(runs, config_cols))
    cfgs = sorted(df["_cfg"].unique())
    pal = _palette(sorted(df[scheduler_col].dropna().unique()))
    fig, axes = plt.subplots(1, len(cfgs), figsize=(4.0 * len(cfgs), 3.2), squeeze=False)
    xs = df[scale_col].dropna()
    for ax, c in zip(axes[0], cfgs):
        _mean_ci_lines(ax, df[df["_cfg"] == c], scale_col, value, scheduler_col, rng, pal, method)
        if len(xs) and xs.min() > 0 and xs.max() / xs.min() >= 8:
            ax.set_xscale("log", base=2)
        ax.set_xlabel(label(scale_col))
        ax.set_ylabel(label(value))
        ax.set_title(c, fontsize=9)
    _shared_legend(fig, axes)
    _caption(fig, "points: mean; error bars", method, value)
    return fig


def ablation_bars(
    runs: pd.DataFrame,
    *,
    value: str = "throughput_e2e",
    config_cols: Sequence[str] = ("simulator", "policy"),
    levels: Mapping[str, object] = LEVELS,
    rng: np.random.Generator | None = None,
    method: str | None = None,
) -> Figure:
    """Bars per combination of EBRL's levels, ordered by how many are on (as the table), grouped
    by configuration."""
    df, order, _ = with_levels(runs, levels)
    return throughput_bars(
        df,
        value=value,
        config_cols=config_cols,
        scheduler_col="levels",
        order=order,
        rng=rng,
        method=method,
    )


def read_trace(path: str | Path) -> pd.DataFrame:
    """Complete events (``ph == "X"``) of a Chrome trace as rows: track, stage, start_s, dur_s."""
    data = json.loads(Path(path).read_text())
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {
        (e.get("pid"), e["tid"]): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    rows = [
        {
            "track": names.get((e.get("pid"), e["tid"]), str(e["tid"])),
            "tid": e["tid"],
            "stage": e["name"],
            "start_s": e["ts"] / 1e6,
            "dur_s": e.get("dur", 0.0) / 1e6,
        }
        for e in events
        if e.get("ph") == "X"
    ]
    return pd.DataFrame(rows, columns=["track", "tid", "stage", "start_s", "dur_s"])


def _busy(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of intervals."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(zip(starts, ends)):
        if cur_e is None or s > cur_e:
            total += 0.0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0.0 if cur_e is None else cur_e - cur_s)


def gantt(
    trace: str | Path | pd.DataFrame,
    *,
    window: tuple[float, float] | None = None,
    title: str | None = None,
) -> Figure:
    """Per-stage utilisation timeline: a lane per track, a colour per stage, busy % per lane.

    Args:
        trace: a Chrome trace file (``timeline.json``) or :func:`read_trace`'s rows.
        window: (start, end) seconds after the trace's first span to draw; None: all of it.
    """
    ev = trace if isinstance(trace, pd.DataFrame) else read_trace(trace)
    if ev.empty:
        raise ValueError("the trace has no complete (ph=X) events")
    t0, t1 = ev["start_s"].min(), (ev["start_s"] + ev["dur_s"]).max()
    span = f"0-{t1 - t0:.1f} s"
    lo, hi = (t0, t1) if window is None else (t0 + window[0], t0 + window[1])
    ev = ev.assign(
        end_s=(ev["start_s"] + ev["dur_s"]).clip(upper=hi), start_s=ev["start_s"].clip(lower=lo)
    )
    ev = ev[ev["end_s"] > ev["start_s"]]
    if ev.empty:
        raise ValueError(f"no spans in the window {window}: the trace covers {span}")
    tracks = list(dict.fromkeys(ev.sort_values("tid")["track"]))
    stages = list(
        dict.fromkeys(
            [*[s for s in STAGE_COLORS if s in set(ev["stage"])], *sorted(ev["stage"].unique())]
        )
    )
    extra = iter(sns.color_palette("muted", 10)[5:])
    colors = {s: STAGE_COLORS.get(s) or next(extra, "grey") for s in stages}
    fig, ax = plt.subplots(figsize=(8.0, 0.45 * len(tracks) + 1.2))
    for i, tr in enumerate(tracks):
        lane = ev[ev["track"] == tr]
        for st, g in lane.groupby("stage"):
            spans = list(zip(g["start_s"] - t0, g["end_s"] - g["start_s"]))
            ax.broken_barh(spans, (i - 0.4, 0.8), facecolors=colors[st], lw=0)
        util = _busy(lane["start_s"].to_numpy(), lane["end_s"].to_numpy()) / max(hi - lo, 1e-12)
        ax.text(hi - t0, i, f" {util:.0%}", va="center", fontsize=7)
    ax.set_yticks(range(len(tracks)), tracks)
    ax.invert_yaxis()
    ax.set_xlim(lo - t0, hi - t0)
    ax.set_xlabel("s since the first span")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[s]) for s in stages]
    ax.legend(
        handles,
        stages,
        ncol=len(stages),
        fontsize=7,
        frameon=False,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
    )
    if title:
        ax.set_title(title, fontsize=9, pad=18)
    ax.grid(axis="y", visible=False)
    fig.tight_layout()
    return fig
