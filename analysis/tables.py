"""The paper's result tables from the tidy run table, as Markdown and LaTeX.

One function per table kind; each takes the runs DataFrame (``analysis.export``'s ``runs.csv``)
and the columns that define a configuration and a scheduler, and returns a :class:`Table`:
``headline`` (throughput per configuration and scheduler, speedup over the strongest baseline),
``scaling`` (the same along a scale column), ``ablation`` (EBRL's levels), ``staleness``
(throughput and final success per k), ``grpo`` (throughput and success per algorithm) and
``convergence`` (time to a success threshold, from the curves). Cells read ``mean [95% CI]``;
each table's notes say which interval (BCa bootstrap by default, see ``analysis.stats``) and how
often it covers with that few seeds. Schedulers, policies and simulators carry the paper's names
(``analysis.names``), whatever spelling the runs recorded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from analysis import names, stats

#: column -> what a table header calls it
LABELS = {
    "throughput_e2e": "end-to-end env steps/s",
    "throughput_overall": "env steps/s (whole run)",
    "success_rate": "final success rate",
    "eval_success_rate": "final evaluation success",
    "overhead_frac": "engine overhead (fraction of wall time)",
    "wall_s": "wall-clock s",
    "time_to_threshold": "wall-clock s to threshold",
    "scheduler_variant": "scheduler",
    "param.variant": "variant",
    "param.num_envs": "envs",
    "param.scheduler.staleness": "k",
    "param.policy.size": "size",
    "param.gpu.name": "gpu",
}
#: the scheduler under study (any spelling ``analysis.names`` knows: ebrl, EBRLScheduler, EBRL)
TARGET = "EBRL"
#: the ablation's levels: runs.csv column -> the value that means "on"
LEVELS: dict[str, object] = {
    "param.scheduler.overlap": True,
    "param.scheduler.pipeline": True,
    "param.scheduler.step_level": True,
    "param.resources.allocator": "elastic",
}
DASH = "–"


@dataclass
class Table:
    """A rendered result table: header, string cells and notes (caption lines)."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        """A GitHub-flavoured Markdown table under a heading, notes below it."""
        lines = [f"### {self.title}", "", "| " + " | ".join(self.header) + " |"]
        lines.append("|" + "|".join("---" for _ in self.header) + "|")
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
        if self.notes:
            lines += ["", *[f"- {n}" for n in self.notes]]
        return "\n".join(lines) + "\n"

    def latex(self, label: str | None = None) -> str:
        """A ``table`` float with a booktabs ``tabular`` (packages: booktabs, amssymb)."""
        cols = "l" * len(self.header)
        body = [" & ".join(_tex(c) for c in r) + r" \\" for r in self.rows]
        caption = ". ".join(_tex(x.rstrip(".")) for x in [self.title, *self.notes]) + "."
        out = [
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            rf"\begin{{tabular}}{{{cols}}}",
            r"\toprule",
            " & ".join(_tex(h) for h in self.header) + r" \\",
            r"\midrule",
            *body,
            r"\bottomrule",
            r"\end{tabular}",
            rf"\caption{{{caption}}}",
        ]
        if label:
            out.append(rf"\label{{{label}}}")
        return "\n".join([*out, r"\end{table}"]) + "\n"


_TEX = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "–": "--",
    "π": r"$\pi$",
    "≥": r"$\geq$",
    "×": r"$\times$",
    "✓": r"\checkmark{}",
    "✗": "--",
}


def _tex(s: str) -> str:
    """Escape text for LaTeX; ``code`` spans become ``\\texttt``."""
    parts = str(s).split("`")
    esc = ["".join(_TEX.get(ch, ch) for ch in p) for p in parts]
    return "".join(rf"\texttt{{{e}}}" if i % 2 else e for i, e in enumerate(esc))


def label(col: str) -> str:
    """Header text for a column."""
    return LABELS.get(col, col.removeprefix("param."))


def fmt_ci(mean: float, lo: float, hi: float, n: int, spec: str = ".1f") -> str:
    """``mean [lo, hi]``; ``mean (n=1)`` without a CI; a dash when there is no value."""
    n = int(n)
    if n == 0 or mean is None or np.isnan(mean):
        return DASH
    if n < 2 or np.isnan(lo):
        return f"{mean:{spec}} (n={n})"
    return f"{mean:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def _fmt(row: pd.Series, spec: str) -> str:
    """:func:`fmt_ci` of a summary row (``mean``, ``ci_low``, ``ci_high``, ``n``)."""
    return fmt_ci(row["mean"], row["ci_low"], row["ci_high"], int(row["n"]), spec)


def _fmt_ratio(row: pd.Series, prefix: str = "") -> str:
    """A ratio row (``ratio``, ``ci_low``, ``ci_high``, ``n``, ``n_baseline``): its CI needs at
    least two runs on each side."""
    n = int(min(row["n"], row["n_baseline"]))
    return prefix + fmt_ci(row["ratio"], row["ci_low"], row["ci_high"], n, ".2f")


def _cell(v: object) -> str:
    if v is None or (isinstance(v, float) and np.isnan(v)) or v is pd.NA:
        return DASH
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _ratio_method(ci: str) -> str:
    """The interval of ratios and probabilities: a bootstrap one (no t interval for a ratio)."""
    return "percentile" if ci == "percentile" else "bca"


def _fell_back(ci: str, *frames: pd.DataFrame) -> int:
    """How many intervals of ``frames`` (``ci_method`` columns) are percentile where BCa was
    asked for: BCa is undefined there (see ``analysis.stats``)."""
    if _ratio_method(ci) != "bca":
        return 0
    return int(sum((f["ci_method"] == "percentile").sum() for f in frames if "ci_method" in f))


def _ci_notes(n_min: int, ci: str, missing: int = 0, fell_back: int = 0) -> list[str]:
    """Which interval the cells show, how often it covers with this few seeds, what is missing."""
    notes = [f"cells: mean [{stats.ci_label(ci)}]"]
    cov = stats.COVERAGE.get(ci, {})
    if 0 < n_min < 10 and cov:
        measured = ", ".join(f"{v:.0%} at n={n}" for n, v in cov.items())
        what = stats.CI_NAMES[ci]
        notes.append(
            f"fewest seeds in a cell: {n_min}; measured coverage of the nominal 95% {what} "
            f"interval of a mean on normal data: {measured} (`python -m analysis.coverage`)"
            + ("" if ci == "t" else ": read the intervals as a spread")
        )
    if fell_back:
        notes.append(
            f"{fell_back} interval(s) are percentile bootstrap instead of BCa: BCa is undefined "
            "where every resample gives the same value (all seeds equal, or the same ratio)"
        )
    if missing:
        notes.append(f"{missing} run(s) lack the value and are left out of their cell")
    return notes


def _named(
    runs: pd.DataFrame, scheduler_col: str, target: str, baselines: Sequence[str] | None
) -> tuple[pd.DataFrame, str, list[str] | None]:
    """The runs with the paper's names, and the target and baselines spelled the same way."""

    def show(v: str) -> str:
        return names.display_value(scheduler_col, v)

    return (
        names.display_runs(runs),
        show(target),
        None if baselines is None else [show(b) for b in baselines],
    )


def _pooled_notes(df: pd.DataFrame, by: Sequence[str], seed_col: str = "seed") -> list[str]:
    """A warning when a cell holds several runs of one seed: runs that differ in a setting the
    grouping does not name (a param, a machine) would be pooled as if they were seeds."""
    if seed_col not in df or df.empty:
        return []
    counts = df.groupby([*by, seed_col], dropna=False).size()
    dup = counts[counts > 1]
    if dup.empty:
        return []
    cells = sorted({" / ".join(map(str, k[:-1])) for k in dup.index})
    return [
        f"{len(cells)} cell(s) hold more than one run per seed ({'; '.join(cells[:3])}"
        f"{'...' if len(cells) > 3 else ''}): settings that differ between them are pooled; "
        "add the column that tells them apart to the grouping"
    ]


def _sort_key(df: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    return df.sort_values(list(cols), kind="stable", na_position="first").reset_index(drop=True)


def headline(
    runs: pd.DataFrame,
    *,
    value: str = "throughput_e2e",
    config_cols: Sequence[str] = ("simulator", "policy"),
    scheduler_col: str = "scheduler_variant",
    target: str = TARGET,
    baselines: Sequence[str] | None = None,
    extra: Sequence[str] = (),
    title: str = "End-to-end throughput and speedup over the strongest baseline",
    spec: str = ".1f",
    ci: str = "bca",
    rng: np.random.Generator | None = None,
) -> Table:
    """Throughput per configuration and scheduler, with the ratio to the strongest baseline.

    Args:
        runs: one row per run.
        value: the measured column; higher is better.
        config_cols: columns that define a configuration (each gets its own strongest baseline).
        scheduler_col: the column naming a run's scheduler.
        target: the scheduler under study; every other one is a baseline unless ``baselines``.
        extra: more columns to summarise per row (e.g. ``success_rate``), as ``mean [CI]``.
        ci: the interval of the cells: ``bca``, ``percentile`` or ``t``; ratios always get a
            bootstrap one (BCa unless ``percentile``).

    Returns:
        Rows per configuration and scheduler: n, value mean [CI], IQM, the ratio to the strongest
        baseline [CI] ("strongest baseline" on its own row) and P(target beats this scheduler).
    """
    rng = rng or np.random.default_rng(0)
    runs, target, baselines = _named(runs, scheduler_col, target, baselines)
    by = [*config_cols, scheduler_col]
    summ = stats.summarize(runs, value, by, ci=ci, rng=rng)
    # the ratio and the probability of improvement compare the same schedulers of the same configs
    common = {
        "target": target,
        "baselines": baselines,
        "config_cols": config_cols,
        "scheduler_col": scheduler_col,
        "rng": rng,
        "method": _ratio_method(ci),
    }
    sp = stats.speedup_over_baseline(runs, value, **common)
    pi = stats.improvement_probabilities(runs, value, **common)
    fell_back = _fell_back(ci, summ, sp[sp[scheduler_col] != sp["baseline"]])
    sp = sp[[*by, "baseline", "ratio", "ci_low", "ci_high", "n_baseline"]].rename(
        columns={"ci_low": "r_low", "ci_high": "r_high"}
    )
    pi = pi.rename(columns={"baseline": scheduler_col, "p": "p_improve"})[[*by, "p_improve"]]
    m = summ.merge(sp, on=by, how="left").merge(pi, on=by, how="left")
    for c in extra:
        e = stats.summarize(runs, c, by, ci=ci, rng=rng)
        fell_back += _fell_back(ci, e)
        e = e[[*by, "n", "mean", "ci_low", "ci_high"]]
        m = m.merge(
            e.rename(columns={k: f"{c}:{k}" for k in ("n", "mean", "ci_low", "ci_high")}),
            on=by,
            how="left",
        )
    header = [label(c) for c in by] + ["n", label(value), "IQM", *map(label, extra)]
    header += ["× strongest baseline", f"P({target} better)"]
    rows = []
    for _, r in _sort_key(m, by).iterrows():
        cells = [_cell(r[c]) for c in by] + [str(int(r["n"]))]
        cells += [fmt_ci(r["mean"], r["ci_low"], r["ci_high"], r["n"], spec), f"{r['iqm']:{spec}}"]
        cells += [
            fmt_ci(r[f"{c}:mean"], r[f"{c}:ci_low"], r[f"{c}:ci_high"], r[f"{c}:n"], ".2f")
            for c in extra
        ]
        if r[scheduler_col] == r["baseline"]:
            cells.append("1 (strongest baseline)")
        else:
            n = int(min(r["n"], r["n_baseline"]))
            cells.append(fmt_ci(r["ratio"], r["r_low"], r["r_high"], n, ".2f"))
        cells.append(DASH if pd.isna(r["p_improve"]) else f"{r['p_improve']:.2f}")
        rows.append(cells)
    notes = [
        f"{label(value)} (`{value}`); IQM: interquartile mean over seeds (25% trimmed mean, "
        "rliable's); × strongest baseline: ratio of means to the baseline with the highest mean "
        f"in the same configuration, {stats.ci_label(_ratio_method(ci))} (paired by seed when "
        "both ran the same seeds)",
        f"P({target} better): probability that a run of {target} beats a run of that scheduler",
        *_ci_notes(
            int(summ["n"].min()) if len(summ) else 0, ci, int(summ["n_missing"].sum()), fell_back
        ),
        *_pooled_notes(runs, by),
    ]
    return Table(title, header, rows, notes)


def scaling(
    runs: pd.DataFrame,
    *,
    scale_col: str = "param.num_envs",
    config_cols: Sequence[str] = ("simulator", "policy"),
    title: str = "Throughput as the workload scales",
    **kw,
) -> Table:
    """:func:`headline` with the scale column (envs, GPUs, nodes...) as part of the configuration,
    so each scale gets its own strongest baseline."""
    return headline(runs, config_cols=[*config_cols, scale_col], title=title, **kw)


def grpo(
    runs: pd.DataFrame,
    *,
    config_cols: Sequence[str] = ("simulator", "policy"),
    algo_col: str = "algo",
    extra: Sequence[str] = ("success_rate",),
    title: str = "Throughput and final success per algorithm (PPO, GRPO)",
    **kw,
) -> Table:
    """:func:`headline` per algorithm, with the final success rate beside throughput."""
    return headline(runs, config_cols=[*config_cols, algo_col], extra=extra, title=title, **kw)


def _is_on(v: object, on: object) -> bool:
    return str(v).lower() == str(on).lower()


def _on(levels_label: str) -> set[str]:
    """``"overlap+pipeline"`` -> {overlap, pipeline}; ``"none"`` -> {}."""
    return set(levels_label.split("+")) - {"none"}


def level_names(levels: Sequence[str]) -> list[str]:
    """``param.scheduler.step_level`` -> ``step_level``."""
    return [c.rsplit(".", 1)[-1] for c in levels]


def with_levels(
    runs: pd.DataFrame, levels: Mapping[str, object] = LEVELS
) -> tuple[pd.DataFrame, list[str], list[str]]:
    """Label each run by the ablation levels it has on.

    Only the level columns present in ``runs`` count (older exports lack the allocator).

    Returns:
        The runs that have every present level column, with a ``levels`` column
        ("overlap+pipeline", "none"...); the combinations in ablation order (by how many levels are
        on, then earlier levels first, so a cumulative sweep reads none -> overlap ->
        overlap+pipeline -> ... and leave-one-out rows sit just before all-on); the level names.

    Raises:
        ValueError: ``runs`` has none of the level columns (not an ablation export).
    """
    present = {c: on for c, on in levels.items() if c in runs}
    if not present:
        raise ValueError(f"the runs table has none of {list(levels)}: not an ablation export")
    names = level_names(list(present))
    df = runs.dropna(subset=list(present)).copy()
    flags = [[_is_on(v, on) for v in df[c]] for c, on in present.items()]  # (levels, runs)
    df["levels"] = ["+".join(n for n, f in zip(names, row) if f) or "none" for row in zip(*flags)]

    def rank(lv: str) -> tuple[int, list[bool]]:
        on = [n in lv.split("+") for n in names]
        return sum(on), [not o for o in on]

    return df, sorted(df["levels"].unique(), key=rank), names


def ablation(
    runs: pd.DataFrame,
    *,
    value: str = "throughput_e2e",
    config_cols: Sequence[str] = ("simulator", "policy"),
    levels: Mapping[str, object] = LEVELS,
    title: str = "Contribution of each scheduling level",
    spec: str = ".1f",
    ci: str = "bca",
    rng: np.random.Generator | None = None,
) -> Table:
    """Throughput per combination of levels, against all-off, one level fewer and all-on.

    Rows follow :func:`with_levels`' order. "× one fewer" compares a row with the first row
    that has the same levels but one (a cumulative sweep's previous step: that level's own
    contribution); "× all on" reads a leave-one-out row against full EBRL. Runs without the
    level params (other schedulers) are left out.
    """
    rng = rng or np.random.default_rng(0)
    df, ranked, lv_names = with_levels(names.display_runs(runs), levels)
    header = [label(c) for c in config_cols] + lv_names + ["n", label(value)]
    header += ["× none", "× one fewer", "× all on"]
    all_on = "+".join(lv_names)
    rows, n_min, missing, fell_back = [], [], 0, 0
    for key, g in stats.iter_groups(df, config_cols):
        summ = stats.summarize(g, value, ["levels"], ci=ci, rng=rng).set_index("levels")
        n_min.append(int(summ["n"].min()))
        missing += int(summ["n_missing"].sum())
        fell_back += _fell_back(ci, summ)
        present = [lv for lv in ranked if lv in summ.index]
        for lv in present:
            s = summ.loc[lv]
            on = _on(lv)
            fewer = [p for p in present if _on(p) < on and len(_on(p)) == len(on) - 1]
            cells = [_cell(v) for v in key] + ["✓" if n in on else "✗" for n in lv_names]
            cells += [str(int(s["n"])), _fmt(s, spec)]
            for ref in ("none", fewer[0] if fewer else None, all_on):
                if ref is None or ref == lv or ref not in present:
                    cells.append(DASH)
                    continue
                r = stats.pairwise_ratios(
                    g,
                    value,
                    target=lv,
                    baselines=[ref],
                    scheduler_col="levels",
                    rng=rng,
                    method=_ratio_method(ci),
                )
                fell_back += _fell_back(ci, r)
                cells.append(_fmt_ratio(r.iloc[0]))
            rows.append(cells)
    notes = [
        f"{label(value)} (`{value}`); ✓ level on; × none / × one fewer / × all on: ratio of "
        "means to the all-off row / to the row with this row's levels but one / to the all-on "
        f"row, {stats.ci_label(_ratio_method(ci))} (paired by seed where possible)",
        *_ci_notes(min(n_min, default=0), ci, missing, fell_back),
        *_pooled_notes(df, [*config_cols, "levels"]),
    ]
    if len(df) < len(runs):
        notes.append(f"{len(runs) - len(df)} run(s) without level params are not shown")
    return Table(title, header, rows, notes)


def _kstr(k: object) -> str:
    """A staleness bound as one spelling, whether it was read as 1, 1.0 or "1"."""
    try:
        f = float(k)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(k)
    return str(int(f)) if f.is_integer() else str(f)


def staleness(
    runs: pd.DataFrame,
    *,
    k_col: str = "param.scheduler.staleness",
    value: str = "throughput_e2e",
    success: str = "success_rate",
    config_cols: Sequence[str] = ("simulator", "policy"),
    scheduler_col: str = "scheduler_variant",
    title: str = "Throughput and final success against the staleness bound k",
    spec: str = ".1f",
    ci: str = "bca",
    rng: np.random.Generator | None = None,
) -> Table:
    """Per configuration, scheduler and k: throughput, final success, and throughput against the
    smallest k of the same scheduler. Schedulers without a k (synchronous: 0 by construction)
    show a dash for k and serve as a reference row."""
    rng = rng or np.random.default_rng(0)
    runs = names.display_runs(runs)
    by = [*config_cols, scheduler_col, k_col]
    header = [label(c) for c in by] + ["n", label(value), label(success), "× smallest k"]
    rows, n_min, missing, fell_back = [], [], 0, 0
    for key, g in stats.iter_groups(runs, [*config_cols, scheduler_col]):
        tp = stats.summarize(g, value, [k_col], ci=ci, rng=rng)
        sc = stats.summarize(g, success, [k_col], ci=ci, rng=rng)  # same groups, same order
        n_min.append(int(tp["n"].min()))
        missing += int(tp["n_missing"].sum() + sc["n_missing"].sum())
        fell_back += _fell_back(ci, tp, sc)
        ks = sorted(g[k_col].dropna().unique())
        gk = g.assign(_k=g[k_col].map(_kstr))
        for (_, t), (_, s) in zip(tp.iterrows(), sc.iterrows()):
            k = t[k_col]
            cells = [_cell(v) for v in key] + [_cell(k), str(int(t["n"]))]
            cells.append(fmt_ci(t["mean"], t["ci_low"], t["ci_high"], t["n"], spec))
            cells.append(fmt_ci(s["mean"], s["ci_low"], s["ci_high"], s["n"], ".2f"))
            if pd.isna(k) or k == ks[0]:
                cells.append(DASH)
            else:
                r = stats.pairwise_ratios(
                    gk,
                    value,
                    target=_kstr(k),
                    baselines=[_kstr(ks[0])],
                    scheduler_col="_k",
                    rng=rng,
                    method=_ratio_method(ci),
                )
                fell_back += _fell_back(ci, r)
                cells.append(_fmt_ratio(r.iloc[0]))
            rows.append(cells)
    notes = [
        f"{label(value)} (`{value}`) and {label(success)} (`{success}`); × smallest k: ratio of "
        f"mean throughput to the same scheduler at its smallest k, "
        f"{stats.ci_label(_ratio_method(ci))}",
        *_ci_notes(min(n_min, default=0), ci, missing, fell_back),
        *_pooled_notes(runs, by),
    ]
    return Table(title, header, rows, notes)


def convergence(
    runs: pd.DataFrame,
    curves: pd.DataFrame,
    *,
    key: str = "env/success_rate",
    success: str = "success_rate",
    threshold: float = 0.8,
    window: int = 5,
    config_cols: Sequence[str] = ("simulator", "policy"),
    scheduler_col: str = "scheduler_variant",
    target: str = TARGET,
    baselines: Sequence[str] | None = None,
    censored: str = "nan",
    ci: str = "bca",
    rng: np.random.Generator | None = None,
) -> Table:
    """Wall-clock time until the smoothed success curve first reaches ``threshold``.

    Rows per configuration and scheduler: runs that reached it, mean time [CI] over those runs,
    final success, and how many times sooner ``target`` gets there (baseline time / target time,
    ratio CI over seeds; NaN when a run of the pair never reached it, unless ``censored`` is
    ``"budget"``: see :func:`analysis.stats.time_to_threshold_ratios`).
    """
    rng = rng or np.random.default_rng(0)
    runs, target, baselines = _named(runs, scheduler_col, target, baselines)
    by = [*config_cols, scheduler_col]
    ttt = stats.time_to_threshold(curves, key=key, threshold=threshold, window=window)
    cols = ["run_id", *by, *(["seed"] if "seed" in runs else []), success, "wall_s"]
    df = runs[[c for c in cols if c in runs]].merge(ttt, on="run_id", how="left")
    df = df.rename(columns={success: "success_rate"}) if success != "success_rate" else df
    df["reached"] = df["reached"].astype("boolean").fillna(False).astype(bool)
    if "wall_s" in df:
        df["t_end"] = df["t_end"].fillna(df["wall_s"])
    if "success_rate" not in df:
        df["success_rate"] = np.nan
    header = [label(c) for c in by] + ["reached", f"s to {threshold:g}", label(success)]
    header += [f"{target} × sooner"]
    rows, n_min, fell_back = [], [], 0
    for ckey, cg in stats.iter_groups(df, config_cols):
        times = stats.summarize(
            cg[cg["reached"]], "time_to_threshold", [scheduler_col], ci=ci, rng=rng
        )
        succ = stats.summarize(cg, "success_rate", [scheduler_col], ci=ci, rng=rng)
        ratios = stats.time_to_threshold_ratios(
            cg,
            target=target,
            baselines=baselines,
            scheduler_col=scheduler_col,
            censored=censored,
            rng=rng,
            method=_ratio_method(ci),
        ).set_index("baseline")
        fell_back += _fell_back(ci, times, succ, ratios)
        times, succ = times.set_index(scheduler_col), succ.set_index(scheduler_col)
        n_min += times["n"].tolist()
        for sched, g in cg.groupby(scheduler_col, sort=True):
            cells = [_cell(v) for v in (*ckey, sched)] + [f"{int(g['reached'].sum())}/{len(g)}"]
            t = times.loc[sched] if sched in times.index else None
            cells.append("never" if t is None else _fmt(t, ".0f"))
            cells.append(_fmt(succ.loc[sched], ".2f"))
            if sched in ratios.index:
                r = ratios.loc[sched]
                ct, cb = r["censored_target"], r["censored_baseline"]
                prefix = {(0, 0): "", (0, 1): "≥ ", (1, 0): "≤ "}.get((ct > 0, cb > 0), "≈ ")
                cells.append(_fmt_ratio(r, prefix))
            else:
                cells.append(DASH)
            rows.append(cells)
    notes = [
        f"first wall-clock second at which the {window}-point trailing mean of `{key}` reaches "
        f"{threshold:g}; mean [95% CI] over the runs that reached it",
        f"{target} × sooner: mean time of the baseline / mean time of {target}, "
        f"{stats.ci_label(_ratio_method(ci))}; "
        + (
            "a dash where a run never reached the threshold"
            if censored == "nan"
            else "runs that never reached it count their whole run time, so a ratio is a bound "
            "(≥: baseline runs censored, ≤: target runs censored, ≈: both)"
        ),
        *_ci_notes(int(min(n_min, default=0)), ci, fell_back=fell_back),
        *_pooled_notes(df, by),
    ]
    return Table(f"Time to {threshold:g} success rate", header, rows, notes)
