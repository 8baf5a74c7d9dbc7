"""The paper's result tables from the tidy run table, as Markdown and LaTeX.

One function per table kind; each takes the runs DataFrame (``analysis.export``'s ``runs.csv``)
and the columns that define a configuration and a scheduler, and returns a :class:`Table`:
``headline`` (throughput per configuration and scheduler, speedup over the strongest baseline),
``scaling`` (the same along a scale column), ``ablation`` (EBRL's levels), ``staleness``
(throughput and final success per k), ``grpo`` (throughput and success per algorithm) and
``convergence`` (time to a success threshold, from the curves). Cells read ``mean [95% CI]``;
each column header and each table's notes name the interval (by default the one of each
statistic that ``python -m analysis.coverage`` measured to cover: Student t for a mean, t on
paired log ratios for a ratio, Wilson's on effective episodes for a success rate; see
``analysis.stats``) and how often it covers with that few seeds. Schedulers, policies and
simulators carry the paper's names (``analysis.names``), whatever spelling the runs recorded.
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
#: a success-rate column -> the runs.csv column with the episodes behind each run's rate
TRIALS = {"eval_success_rate": "eval_episodes"}


def is_rate(col: str) -> bool:
    """Whether a runs.csv column is a success rate in [0, 1] (its interval: ``rate``)."""
    return "success" in col


def _stat(col: str) -> str:
    return "rate" if is_rate(col) else "mean"


def summarize_column(
    runs: pd.DataFrame,
    col: str,
    by: Sequence[str],
    ci: str | None,
    rng: np.random.Generator | None,
) -> pd.DataFrame:
    """:func:`analysis.stats.summarize` of ``col`` with the interval of its statistic (a
    success rate's where :func:`is_rate`, with its episodes where :data:`TRIALS` names them)."""
    trials = TRIALS.get(col)
    return stats.summarize(runs, col, by, ci=ci, statistic=_stat(col), trials_col=trials, rng=rng)


def head(col: str, ci: str | None) -> str:
    """A column header naming the interval of its cells: ``final success rate, mean [95%
    Wilson CI]``."""
    return f"{label(col)}, mean [{_short(stats.method_for(_stat(col), ci))}]"


def _short(method: str) -> str:
    """The interval's name in a header: ``95% Student t CI``."""
    return f"95% {stats.CI_NAMES[method]} CI"


def ratio_head(what: str, ci: str | None) -> str:
    """A ratio column's header naming its interval: ``× none [95% Student t CI, log ratio]``."""
    m = stats.method_for("ratio", ci)
    return f"{what} [{_short(m)}{', log ratio' if m == 't-log' else ''}]"


def ratio_point(ci: str | None) -> str:
    """What a ratio cell's point is, by its interval method (:func:`analysis.stats.ratio_ci`)."""
    if stats.method_for("ratio", ci) == "t-log":
        return (
            "geometric mean of the per-seed ratios where paired by seed (the ratio of geometric "
            "means where not)"
        )
    return "ratio of means"


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


def _ratio_method(ci: str | None) -> str:
    """The interval of ratios (:func:`analysis.stats.method_for`)."""
    return stats.method_for("ratio", ci)


def _fell_back(ci: str | None, *frames: pd.DataFrame) -> int:
    """How many intervals of ``frames`` (``ci_method`` columns) are percentile where BCa was
    asked for: BCa is undefined there (see ``analysis.stats``)."""
    if ci != "bca":
        return 0
    return int(sum((f["ci_method"] == "percentile").sum() for f in frames if "ci_method" in f))


def _ci_notes(
    n_min: int,
    ci: str | None,
    missing: int = 0,
    fell_back: int = 0,
    statistics: Sequence[str] = ("mean",),
) -> list[str]:
    """Which interval the cells of each statistic show, how often it covers with this few
    seeds (:data:`analysis.stats.COVERAGE`), what is missing."""
    notes = []
    measured = []
    for s in statistics:
        m = stats.method_for(s, ci)
        if s != "ratio":  # a ratio's interval is named where the table says what its ratio is
            cells = "cells: mean" if s == "mean" else "success rates: mean"
            notes.append(f"{cells} [{stats.ci_label(m)}]")
        cov = stats.COVERAGE.get(s, {}).get(m, {})
        if cov:
            at = ", ".join(f"{v:.0%} at n={n}" for n, v in cov.items())
            spread = ": read them as a spread" if min(cov.values()) < 0.93 else ""
            measured.append(f"{stats.CI_NAMES[m]} ({s}; {stats.COVERAGE_SCENARIO[s]}) {at}{spread}")
    if 0 < n_min <= 10 and measured:
        notes.append(
            f"fewest seeds in a cell: {n_min}; measured coverage of these nominal 95% intervals "
            f"(`python -m analysis.coverage`): {'; '.join(measured)}"
        )
    if fell_back:
        notes.append(
            f"{fell_back} interval(s) are percentile bootstrap instead of BCa: BCa is undefined "
            "where every resample gives the same value (all seeds equal, or the same ratio)"
        )
    if missing:
        notes.append(f"{missing} run(s) lack the value and are left out of their cell")
    return notes


def _rate_notes(runs: pd.DataFrame, cols: Sequence[str]) -> list[str]:
    """A warning for success-rate columns whose runs recorded no episode count: their Wilson
    interval has no binomial floor, so seeds that all agree show a zero-width interval."""
    bare = [c for c in cols if is_rate(c) and TRIALS.get(c) not in runs]
    if not bare:
        return []
    return [
        f"{', '.join(f'`{c}`' for c in bare)}: no episode count per run, so no binomial floor "
        "under the interval: where every seed scored the same it has zero width"
    ]


def _statistics(cols: Sequence[str]) -> list[str]:
    """The statistics the cells of ``cols`` show (``mean``, ``rate``), each once, in order."""
    return list(dict.fromkeys(_stat(c) for c in cols))


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
    ci: str | None = None,
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
        ci: the intervals (:func:`analysis.stats.method_for`): None, each statistic's default
            (t for means, t on log ratios for ratios, Wilson for success rates); ``t``,
            ``bca``, ``percentile`` or ``wilson`` to ask for one.

    Returns:
        Rows per configuration and scheduler: n, value mean [CI], IQM, the ratio to the strongest
        baseline [CI] ("strongest baseline" on its own row) and P(target beats this scheduler).
    """
    rng = rng or np.random.default_rng(0)
    runs, target, baselines = _named(runs, scheduler_col, target, baselines)
    by = [*config_cols, scheduler_col]
    summ = summarize_column(runs, value, by, ci, rng)
    # the ratio and the probability of improvement compare the same schedulers of the same configs
    common = {
        "target": target,
        "baselines": baselines,
        "config_cols": config_cols,
        "scheduler_col": scheduler_col,
        "rng": rng,
    }
    sp = stats.speedup_over_baseline(runs, value, method=_ratio_method(ci), **common)
    # only its point is shown; its interval is a bootstrap one (it is not a mean)
    boot = "percentile" if ci == "percentile" else "bca"
    pi = stats.improvement_probabilities(runs, value, method=boot, **common)
    fell_back = _fell_back(ci, summ, sp[sp[scheduler_col] != sp["baseline"]])
    sp = sp[[*by, "baseline", "ratio", "ci_low", "ci_high", "n_baseline"]].rename(
        columns={"ci_low": "r_low", "ci_high": "r_high"}
    )
    pi = pi.rename(columns={"baseline": scheduler_col, "p": "p_improve"})[[*by, "p_improve"]]
    m = summ.merge(sp, on=by, how="left").merge(pi, on=by, how="left")
    for c in extra:
        e = summarize_column(runs, c, by, ci, rng)
        fell_back += _fell_back(ci, e)
        e = e[[*by, "n", "mean", "ci_low", "ci_high"]]
        m = m.merge(
            e.rename(columns={k: f"{c}:{k}" for k in ("n", "mean", "ci_low", "ci_high")}),
            on=by,
            how="left",
        )
    header = [label(c) for c in by] + ["n", head(value, ci), "IQM"]
    header += [head(c, ci) for c in extra]
    header += [ratio_head("× strongest baseline", ci), f"P({target} better)"]
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
        "rliable's); × strongest baseline: ratio to the baseline with the highest mean in the "
        f"same configuration, the {ratio_point(ci)}, {stats.ci_label(_ratio_method(ci))} "
        "(paired by seed when both ran the same seeds)",
        f"P({target} better): probability that a run of {target} beats a run of that scheduler",
        *_ci_notes(
            int(summ["n"].min()) if len(summ) else 0,
            ci,
            int(summ["n_missing"].sum()),
            fell_back,
            [*_statistics([value, *extra]), "ratio"],
        ),
        *_pooled_notes(runs, by),
        *_rate_notes(runs, [value, *extra]),
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
    ci: str | None = None,
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
    header = [label(c) for c in config_cols] + lv_names + ["n", head(value, ci)]
    header += [ratio_head(w, ci) for w in ("× none", "× one fewer", "× all on")]
    all_on = "+".join(lv_names)
    rows, n_min, missing, fell_back = [], [], 0, 0
    for key, g in stats.iter_groups(df, config_cols):
        summ = summarize_column(g, value, ["levels"], ci, rng).set_index("levels")
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
        f"{label(value)} (`{value}`); ✓ level on; × none / × one fewer / × all on: ratio to the "
        "all-off row / to the row with this row's levels but one / to the all-on row, the "
        f"{ratio_point(ci)}, {stats.ci_label(_ratio_method(ci))} (paired by seed where possible)",
        *_ci_notes(min(n_min, default=0), ci, missing, fell_back, [*_statistics([value]), "ratio"]),
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
    ci: str | None = None,
    rng: np.random.Generator | None = None,
) -> Table:
    """Per configuration, scheduler and k: throughput, final success, and throughput against the
    smallest k of the same scheduler. Schedulers without a k (synchronous: 0 by construction)
    show a dash for k and serve as a reference row."""
    rng = rng or np.random.default_rng(0)
    runs = names.display_runs(runs)
    by = [*config_cols, scheduler_col, k_col]
    header = [label(c) for c in by] + ["n", head(value, ci), head(success, ci)]
    header.append(ratio_head("× smallest k", ci))
    rows, n_min, missing, fell_back = [], [], 0, 0
    for key, g in stats.iter_groups(runs, [*config_cols, scheduler_col]):
        tp = summarize_column(g, value, [k_col], ci, rng)
        sc = summarize_column(g, success, [k_col], ci, rng)  # same groups, same order
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
        f"{label(value)} (`{value}`) and {label(success)} (`{success}`); × smallest k: "
        f"throughput against the same scheduler at its smallest k, the {ratio_point(ci)}, "
        f"{stats.ci_label(_ratio_method(ci))}",
        *_ci_notes(
            min(n_min, default=0),
            ci,
            missing,
            fell_back,
            [*_statistics([value, success]), "ratio"],
        ),
        *_pooled_notes(runs, by),
        *_rate_notes(runs, [value, success]),
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
    ci: str | None = None,
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
    header = [label(c) for c in by] + ["reached"]
    header += [f"s to {threshold:g}, mean [{_short(stats.method_for('mean', ci))}]"]
    header += [head(success, ci), ratio_head(f"{target} × sooner", ci)]
    rows, n_min, fell_back = [], [], 0
    for ckey, cg in stats.iter_groups(df, config_cols):
        times = summarize_column(cg[cg["reached"]], "time_to_threshold", [scheduler_col], ci, rng)
        succ = summarize_column(cg, "success_rate", [scheduler_col], ci, rng)
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
        f"{target} × sooner: time of the baseline / time of {target}, the {ratio_point(ci)}, "
        f"{stats.ci_label(_ratio_method(ci))}; "
        + (
            "a dash where a run never reached the threshold"
            if censored == "nan"
            else "runs that never reached it count their whole run time, so a ratio is a bound "
            "(≥: baseline runs censored, ≤: target runs censored, ≈: both)"
        ),
        *_ci_notes(
            int(min(n_min, default=0)),
            ci,
            fell_back=fell_back,
            statistics=("mean", "rate", "ratio"),
        ),
        *_pooled_notes(df, by),
        *_rate_notes(runs, [success]),
    ]
    return Table(f"Time to {threshold:g} success rate", header, rows, notes)
