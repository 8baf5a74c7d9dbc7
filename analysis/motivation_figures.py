"""The motivation figures (``analysis.motivation``): the machine over time, the step-latency CDF,
trajectory lengths over training, and the stage Gantt of each run.

Each function takes :class:`analysis.motivation.Run` objects and returns a matplotlib figure;
:func:`all_figures` names them for ``analysis.figures.save``.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI machines or clusters

import matplotlib.pyplot as plt
import matplotlib.ticker as ticker
import numpy as np
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from analysis import figures
from analysis.motivation import Run, episode_lengths, gpu_stats, latency_stats, step_latency

#: the GPU panels' text where there is no GPU to show
NO_GPU = (
    "No GPU on this machine\n(NVML found none this run could see):\n"
    "GPU utilisation and SM occupancy\nnot measured"
)


def _cpu_panel(ax: Axes, run: Run) -> None:
    """Cores x time, coloured by busy %, over the run's RL time."""
    win = run.window()
    cpu = run.util[run.util["device"] == "cpu"] if run.util is not None else None
    if cpu is None or cpu.empty:
        ax.text(0.5, 0.5, "CPU not sampled\n(tracking.utilisation=false)", ha="center", va="center")
        ax.set_axis_off()
        return
    grid = cpu.pivot_table(index="index", columns="t_s", values="util_pct", aggfunc="mean")
    t = grid.columns.to_numpy(dtype=float)
    t0 = win[0] if win else t[0]
    edges = np.concatenate([[t[0] - (t[1] - t[0] if t.size > 1 else 0.2)], t]) - t0
    mesh = ax.pcolormesh(
        edges,
        np.arange(grid.shape[0] + 1) - 0.5,
        grid.to_numpy(),
        vmin=0,
        vmax=100,
        cmap="viridis",
        shading="flat",
    )
    if win:
        ax.set_xlim(0, win[1] - win[0])
    ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
    ax.set_ylabel("CPU core")
    ax.set_xlabel("s since the first stage span")
    means = grid.loc[:, [c for c in grid.columns if not win or win[0] <= c <= win[1]]].mean(axis=1)
    busy = int((means > 50).sum())
    ax.set_title(f"{run.label}: {busy} of {len(means)} cores above 50% busy", fontsize=8)
    plt.colorbar(mesh, ax=ax, label="busy %", pad=0.01)


def _gpu_panel(ax: Axes, run: Run) -> None:
    """Each GPU's utilisation and SM occupancy over time, or plainly that there is none."""
    g = gpu_stats(run)
    if "na" in g:
        ax.text(0.5, 0.5, NO_GPU if "no GPU" in g["na"] else g["na"], ha="center", va="center")
        ax.set_title(f"{run.label}: GPU", fontsize=8)
        ax.set_axis_off()
        return
    win = run.window()
    t0 = win[0] if win else 0.0
    gpu = run.util[run.util["device"] == "gpu"]
    for idx, d in gpu.groupby("index"):
        ax.plot(d["t_s"] - t0, d["util_pct"], lw=0.8, label=f"GPU {idx} utilisation")
        if d["sm_occupancy_pct"].notna().any():
            ax.plot(
                d["t_s"] - t0, d["sm_occupancy_pct"], lw=0.8, ls="--", label=f"GPU {idx} SM occ."
            )
    ax.axhline(50, color="grey", lw=0.6, ls=":")
    ax.axhline(20, color="grey", lw=0.6, ls=":")
    ax.set_ylim(0, 100)
    if win:
        ax.set_xlim(0, win[1] - win[0])
    ax.set_ylabel("%")
    ax.set_xlabel("s since the first stage span")
    ax.set_title(f"{run.label}: {g['gpu_under_50']:.0%} of samples under 50%", fontsize=8)
    ax.legend(fontsize=6, ncol=2, frameon=False)


def utilisation(runs: Sequence[Run]) -> Figure:
    """A row per run: every CPU core over time, and every GPU (or why there is none)."""
    fig, axes = plt.subplots(
        len(runs),
        2,
        figsize=(11, 2.1 * len(runs) + 0.4),
        squeeze=False,
        gridspec_kw={"width_ratios": [2.2, 1]},
    )
    for row, run in zip(axes, runs, strict=True):
        _cpu_panel(row[0], run)
        _gpu_panel(row[1], run)
    fig.tight_layout()
    return fig


def latency_cdf(runs: Sequence[Run]) -> Figure:
    """A panel per run: the CDF of the time per env step, a line per env worker or group, the
    mean and the P99 over all marked."""
    cols = min(3, max(len(runs), 1))
    nrows = -(-len(runs) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.6 * cols, 2.9 * nrows), squeeze=False)
    for ax in axes.flat[len(runs) :]:
        ax.set_axis_off()
    for ax, run in zip(axes.flat, runs, strict=False):
        lat = step_latency(run)
        if lat.empty:
            ax.text(0.5, 0.5, "no sim spans", ha="center", va="center")
            ax.set_axis_off()
            continue
        for track, d in lat.groupby("track"):
            order = np.argsort(d["step_ms"].to_numpy())
            v, w = d["step_ms"].to_numpy()[order], d["steps"].to_numpy()[order]
            ax.step(v, np.cumsum(w) / w.sum(), where="post", lw=0.9, label=str(track))
        s = latency_stats(lat)
        ax.axvline(s["mean_ms"], color="k", lw=0.8, ls="--", label=f"mean {s['mean_ms']:.1f} ms")
        ax.axvline(s["p99_ms"], color="k", lw=0.8, ls=":", label=f"P99 {s['p99_ms']:.1f} ms")
        ax.set_xscale("log")
        # plain numbers, and none on the minor ticks (they collide over a short decade)
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set_ylim(0, 1.01)
        ax.set_xlabel("ms per env step (sim span / envs x K)")
        ax.set_title(run.label, fontsize=8)
        ax.legend(fontsize=6, frameon=False, loc="lower right")
    for row in axes:
        row[0].set_ylabel("CDF (weighted by env steps)")
    fig.tight_layout()
    return fig


def episode_length(runs: Sequence[Run]) -> Figure:
    """Mean episode length of the episodes each update finished, against env steps."""
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    palette = sns.color_palette("deep", max(len(runs), 1))
    drawn = 0
    for color, run in zip(palette, runs, strict=True):
        d = episode_lengths(run)
        if d.empty:
            continue
        ax.plot(d["env_steps"], d["episode_len"], marker=".", lw=1.0, color=color, label=run.label)
        drawn += 1
    if not drawn:
        ax.text(0.5, 0.5, "no update finished an episode", ha="center", va="center")
    ax.set_xlabel("env steps")
    ax.set_ylabel("mean episode length (steps)")
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    return fig


def gantt(run: Run, width_s: float = 10.0) -> Figure | None:
    """``analysis.figures.gantt`` of the run's trace over ``width_s`` seconds mid-run."""
    path = run.folder / "timeline.json"
    win = run.window()
    if not path.exists() or win is None:
        return None
    length = win[1] - win[0]
    mid = length / 2
    lo, hi = max(0.0, mid - width_s / 2), min(length, mid + width_s / 2)
    return figures.gantt(path, window=(lo, hi), title=f"{run.label}: {lo:.0f}-{hi:.0f} s")


def all_figures(runs: Sequence[Run]) -> list[tuple[str, Figure]]:
    """(name, figure) of every motivation figure: ``utilisation``, ``latency_cdf``,
    ``episode_len`` and ``gantt_<run>`` per run with a trace."""
    out = [
        ("utilisation", utilisation(runs)),
        ("latency_cdf", latency_cdf(runs)),
        ("episode_len", episode_length(runs)),
    ]
    for run in runs:
        fig = gantt(run)
        if fig is not None:
            out.append((f"gantt_{run.key}", fig))
    return out
