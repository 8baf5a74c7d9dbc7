"""The names tables, figures and log lines use: the paper's, keyed by the config names users type.

A run's ``scheduler``, ``policy`` and ``simulator`` tags hold either the config option
(``scheduler=ebrl``, ``policy=transformer_l``, ``simulator=pushcube``) or, in runs recorded before
that, a class name or a task (``EBRLScheduler``, ``TransformerPolicy`` with ``policy.size=L``,
``PushCube-v1``). Both, and the display names themselves, map to one key (the config option) and
from it to what the paper calls it (``EBRL``, ``Transformer-L (VLA-shaped)``,
``ManiSkill PushCube``). A value this module does not know is kept as it is.

Everything here is a pure function of strings or of a runs table (``analysis.export``'s
``runs.csv``); :func:`display_runs` is what the tables, figures and the report apply.
"""

from __future__ import annotations

import re

import pandas as pd

#: scheduler config option -> the paper's name. ``sync`` is ebrl's plain synchronous loop (no
#: offload, no pipelining): not one of the paper's baselines. The replicas of RLinf's modes on
#: ebrl's own stages are the paper's Colocated, Hybrid and Async; real RLinf is "RLinf <mode>".
SCHEDULERS = {
    "sync": "Sync",
    "colocated": "Colocated",
    "hybrid": "Hybrid",
    "async": "Async",
    "ebrl": "EBRL",
    "rlinf_colocated": "RLinf Colocated",
    "rlinf_hybrid": "RLinf Hybrid",
    "rlinf_async": "RLinf Async",
}
#: policy config option -> the paper's name (the transformers are ebrl's VLA-shaped stand-ins)
POLICIES = {
    "mlp": "MLP",
    "transformer_s": "Transformer-S (VLA-shaped)",
    "transformer_m": "Transformer-M (VLA-shaped)",
    "transformer_l": "Transformer-L (VLA-shaped)",
    "transformer_vla": "Transformer-VLA (VLA-shaped, 302M, bf16)",
    "pi0": "π0",
    "pi05": "π0.5",
    "pi0_tiny": "π0 (tiny, CPU)",
    "gr00t": "GR00T N1.5",
    "openvla_oft": "OpenVLA-OFT",
    "dreamzero": "DreamZero",
    "rlinf_mlp": "RLinf MLP",
}
#: simulator config option -> the paper's name
SIMULATORS = {
    "pushcube": "ManiSkill PushCube",
    "pushcube_rgb": "ManiSkill PushCube (camera)",
    "pickcube": "ManiSkill PickCube",
    "synthetic": "Synthetic (step-cost model)",
    "counting": "Counting (test env)",
    "libero": "LIBERO",
    "libero_vla": "LIBERO (the VLAs' observation)",
    "robocasa": "RoboCasa",
    "behavior": "BEHAVIOR-1K",
    "rlinf_maniskill": "ManiSkill (RLinf's env)",
}
#: a simulator's task (``simulator.task``) -> its name: runs of two tasks must never share a name,
#: or a table would pool them into one configuration
SIMULATOR_TASKS = {
    "libero_spatial": "LIBERO-Spatial",
    "libero_object": "LIBERO-Object",
    "libero_goal": "LIBERO-Goal",
    "libero_10": "LIBERO-Long (LIBERO-10)",
    "libero_90": "LIBERO-90",
    "PnPCounterToCab": "RoboCasa PnPCounterToCab",
    "turning_on_radio": "BEHAVIOR-1K turning_on_radio",
}
#: what older runs stored -> config option: class names (the scheduler and policy tags were a
#: component's class name) and tasks (the simulator tag was its ``task``)
_OLD = {
    "scheduler": {
        "SyncScheduler": "sync",
        "ColocatedScheduler": "colocated",
        "HybridScheduler": "hybrid",
        "AsyncScheduler": "async",
        "EBRLScheduler": "ebrl",
    },
    "policy": {"MLPPolicy": "mlp"},
    "simulator": {
        "PushCube-v1": "pushcube",
        "PickCube-v1": "pickcube",
        "SyntheticCostEnv": "synthetic",
        "CountingEnv": "counting",
    },
}
_DISPLAY = {
    "scheduler": SCHEDULERS,
    "policy": POLICIES,
    "simulator": SIMULATORS | SIMULATOR_TASKS,
}
#: runs.csv columns that hold a name of each kind
COLUMNS = {
    "scheduler": "scheduler",
    "scheduler_variant": "scheduler",
    "policy": "policy",
    "simulator": "simulator",
}
#: the real-RLinf launcher's class, whose mode is a param (``scheduler.mode``)
_RLINF = "RLinfScheduler"
#: a variant: the scheduler, then what is switched off and the allocator (analysis.export)
_VARIANT = re.compile(r"^(?P<base>[^\[+]*)(?P<rest>.*)$")


def _lookup(kind: str) -> dict[str, str]:
    """Every spelling of ``kind`` (option, old value, display name; any case) -> option."""
    table = {k.lower(): k for k in _DISPLAY[kind]}
    table |= {v.lower(): k for k, v in _DISPLAY[kind].items()}
    table |= {old.lower(): k for old, k in _OLD[kind].items()}
    return table


_LOOKUP = {kind: _lookup(kind) for kind in _DISPLAY}


def key(
    kind: str,
    value: str,
    *,
    mode: str | None = None,
    size: str | None = None,
    task: str | None = None,
) -> str:
    """The config option a name stands for (``EBRLScheduler`` -> ``ebrl``), else ``value``.

    Args:
        kind: ``scheduler``, ``policy`` or ``simulator``.
        mode: the run's ``scheduler.mode`` param: which mode an ``RLinfScheduler`` ran.
        size: the run's ``policy.size`` param: which size a ``TransformerPolicy`` was.
        task: the run's ``simulator.task`` param: a known task names the simulator (a LIBERO
            suite, say), whatever the tag says.
    """
    v = str(value).strip()
    if kind == "simulator" and task:
        known = _LOOKUP["simulator"].get(str(task).strip().lower())
        if known is not None:
            return known
    if kind == "scheduler" and v == _RLINF and mode:
        return f"rlinf_{str(mode).lower()}"
    if kind == "policy" and v == "TransformerPolicy" and size:
        return f"transformer_{str(size).lower()}"
    return _LOOKUP[kind].get(v.lower(), v)


def display(
    kind: str,
    value: str,
    *,
    mode: str | None = None,
    size: str | None = None,
    task: str | None = None,
) -> str:
    """The paper's name for a scheduler, policy or simulator (see :func:`key`)."""
    k = key(kind, value, mode=mode, size=size, task=task)
    unknown_task = kind == "simulator" and task and str(task).strip().lower() not in _LOOKUP[kind]
    if unknown_task and k in SIMULATORS:
        return f"{SIMULATORS[k]} {task}"  # a task this module does not know: keep it apart
    if k in _DISPLAY[kind]:
        return _DISPLAY[kind][k]
    if kind == "scheduler" and str(value).strip() == _RLINF:
        return "RLinf (mode unknown)"
    if kind == "policy" and str(value).strip() == "TransformerPolicy":
        return "Transformer (VLA-shaped)"
    return str(value)


def variant(value: str, *, mode: str | None = None) -> str:
    """A scheduler variant with the scheduler's paper name: ``EBRLScheduler[-overlap]+elastic``
    -> ``EBRL[-overlap]+elastic``."""
    m = _VARIANT.match(str(value))
    assert m is not None  # the pattern matches any string
    return display("scheduler", m["base"], mode=mode) + m["rest"]


def variant_key(value: str) -> str:
    """A variant by its scheduler's config option: ``EBRL[-overlap]`` -> ``ebrl[-overlap]``."""
    m = _VARIANT.match(str(value))
    assert m is not None
    return key("scheduler", m["base"]) + m["rest"]


def column_key(col: str, value: str) -> str:
    """What ``--where COL=value`` compares: the config option for a name column (any spelling
    matches), the text itself for any other column."""
    kind = COLUMNS.get(col)
    if kind is None:
        return str(value)
    if col == "scheduler_variant":
        return variant_key(value)
    return key(kind, value)


def display_value(col: str, value: str) -> str:
    """A value the user typed for column ``col`` (a target scheduler, say) as the tables show it."""
    kind = COLUMNS.get(col)
    if kind is None:
        return value
    return variant(value) if col == "scheduler_variant" else display(kind, value)


def _param(row: pd.Series, name: str) -> str | None:
    v = row.get(f"param.{name}")
    return None if v is None or pd.isna(v) else str(v)


def display_runs(runs: pd.DataFrame) -> pd.DataFrame:
    """A copy of a runs table with the paper's names in its scheduler, variant, policy and
    simulator columns (those it has); idempotent, so applying it twice changes nothing."""
    out = runs.copy()
    if out.empty:
        return out

    def each(col: str, f) -> None:
        if col in out:
            out[col] = [v if pd.isna(v) else f(v, r) for v, (_, r) in zip(out[col], out.iterrows())]

    mode = "scheduler.mode"
    each("scheduler", lambda v, r: display("scheduler", v, mode=_param(r, mode)))
    each("scheduler_variant", lambda v, r: variant(v, mode=_param(r, mode)))
    each("policy", lambda v, r: display("policy", v, size=_param(r, "policy.size")))
    each("simulator", lambda v, r: display("simulator", v, task=_param(r, "simulator.task")))
    return out
