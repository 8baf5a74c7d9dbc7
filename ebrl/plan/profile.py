"""The stage-profile file the capacity planner and a run's Algorithm 1 read
(``ebrl.resources.profiler.rate_table``): what each stage costs, alone, at each device share it
may get.

Format ``ebrl-plan-profile/1`` (JSON; ``docs/plan-profile.md`` is the field-by-field reference):

.. code-block:: json

    {
      "format": "ebrl-plan-profile/1",
      "illustrative": false,
      "source": "how these numbers were made (a run folder, gpu_check.sh, hand-written)",
      "chunk_size": 4,
      "sim": {"chunk_s": [0.011, 0.012], "cpu_busy": 1.0, "episode_steps": 50},
      "gen": {"points": [{"threads": 1, "busy": 1.0, "batch": 16, "seconds": 0.045}]},
      "train": {"points": [{"threads": 2, "busy": 1.6, "samples": 192, "seconds": 0.8}],
                "param_bytes": 0, "allreduces": 0},
      "sync": {"publish_s": 0.005, "load_s": 0.001, "offload_s": 0.0, "reload_s": 0.0,
               "state_bytes": 0},
      "message_s": 0.0002
    }

- ``sim.chunk_s``: seconds of one env's chunk (K physics steps), samples whose spread is the
  step-latency tail the model replays; or ``sim.chunk_dist`` ``{"mean_s", "p99_over_mean"}``
  (a lognormal with that tail). ``cpu_busy``: cores a stepping env keeps busy.
- ``gen.points`` / ``train.points``: measured calls. A point on a CPU has ``threads`` (the
  torch threads) and ``busy`` (the cores the call keeps busy); a point on a GPU has ``share``
  (of one GPU: an MPS quota) and ``busy`` (the host cores it keeps busy meanwhile). Generation
  is ``batch`` envs a call, training ``samples`` decisions per rank an update (every epoch).
  At each share the cost is fitted as fixed + per-unit (least squares over the points there);
  between two measured shares it is interpolated in log-log; a share outside them is refused.
- ``train.param_bytes`` and ``train.allreduces``: the gradient bytes all-reduced, and how many
  times per update (the optimiser steps), for a learner of several ranks.
- ``sync``: the learner's publish per update, a replica's load per version, Colocated's
  offload after the rollout and reload before the next, and the bytes of the state a replica
  on another node receives.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "ebrl-plan-profile/1"


class ProfileError(ValueError):
    """A profile that cannot be read, or cannot answer what the plan asks of it."""


@dataclass(frozen=True)
class Point:
    """One measured call.

    Attributes:
        size: envs in the call (generation) or decisions per rank (training).
        seconds: its wall seconds, alone.
        threads: torch threads (a CPU point), else None.
        share: the GPU share (a GPU point), else None.
        busy: cores the call keeps busy (CPU: its threads' work; GPU: its host thread's).
        repeats_s: the call's seconds in each timed repeat, where kept (their spread is the
            noise; ``seconds`` is their median).
    """

    size: int
    seconds: float
    threads: int | None = None
    share: float | None = None
    busy: float = 1.0
    repeats_s: tuple[float, ...] = ()

    @property
    def device(self) -> str:
        return "gpu" if self.share is not None else "cpu"

    @property
    def level(self) -> float:
        """What the call was given: threads on a CPU, the share of a GPU."""
        return float(self.share if self.share is not None else self.threads or 1)


@dataclass(frozen=True)
class Curve:
    """A stage's cost at one level (threads or share): ``fixed + per_unit * size`` seconds,
    keeping ``busy`` cores busy."""

    fixed: float
    per_unit: float
    busy: float

    def seconds(self, size: float) -> float:
        return self.fixed + self.per_unit * size


@dataclass(frozen=True)
class StageProfile:
    """A stage's measured calls (generation or training) and what they cost at any level."""

    points: tuple[Point, ...]
    unit: str  # "batch" or "samples": what a point's size counts

    def __post_init__(self) -> None:
        if not self.points:
            raise ProfileError(f"a stage profile needs at least one point ({self.unit})")
        if len({p.device for p in self.points}) > 1:
            raise ProfileError(
                "a stage's points are all on a CPU (threads) or all on a GPU (share)"
            )
        for p in self.points:
            if p.seconds <= 0 or p.size <= 0:
                raise ProfileError(f"a point needs {self.unit} > 0 and seconds > 0: {p}")

    @property
    def device(self) -> str:
        return self.points[0].device

    def levels(self) -> list[float]:
        return sorted({p.level for p in self.points})

    def _at(self, level: float) -> Curve:
        pts = [p for p in self.points if math.isclose(p.level, level)]
        sizes = np.array([p.size for p in pts], dtype=float)
        secs = np.array([p.seconds for p in pts], dtype=float)
        busy = float(np.mean([p.busy for p in pts]))
        if len(set(sizes.tolist())) < 2:  # one size: all of it scales with the size
            return Curve(0.0, float(np.mean(secs / sizes)), busy)
        slope, fixed = np.polyfit(sizes, secs, 1)
        if fixed < 0:  # a negative intercept is noise: all of it per unit
            return Curve(0.0, float(np.sum(secs * sizes) / np.sum(sizes**2)), busy)
        if slope < 0:
            return Curve(float(np.mean(secs)), 0.0, busy)
        return Curve(float(fixed), float(slope), busy)

    def curve(self, level: float) -> Curve:
        """The cost at ``level`` threads or GPU share: a measured level's own fit, or the
        log-log interpolation between the two measured levels around it.

        Raises:
            ProfileError: ``level`` lies outside the measured levels.
        """
        levels = self.levels()
        for lv in levels:
            if math.isclose(lv, level, rel_tol=1e-6):
                return self._at(lv)
        if not levels[0] < level < levels[-1]:
            if self.device == "cpu":  # a CPU profile's levels are torch threads
                fix = (
                    f"plan at the threads it has (--set gen_threads={levels[-1]:g} "
                    f"train_threads={levels[-1]:g}) or measure more (python -m "
                    "ebrl.plan.measure --device cpu --levels 1,2)"
                )
            else:
                fix = "measure it (scripts/gpu_check.sh measures shares 0.25, 0.5, 1)"
            what = "threads" if self.device == "cpu" else "GPU share"
            raise ProfileError(
                f"the profile's {self.unit} points are at {what} {levels}; the plan asks "
                f"{level:g}: {fix}"
            )
        hi = next(lv for lv in levels if lv > level)
        lo = max(lv for lv in levels if lv < level)
        a, b = self._at(lo), self._at(hi)
        w = math.log(level / lo) / math.log(hi / lo)

        def mix(x: float, y: float) -> float:
            if x <= 0 or y <= 0:
                return x + (y - x) * w
            return math.exp(math.log(x) + (math.log(y) - math.log(x)) * w)

        return Curve(
            mix(a.fixed, b.fixed), mix(a.per_unit, b.per_unit), a.busy + (b.busy - a.busy) * w
        )

    def to_json(self) -> list[dict[str, Any]]:
        out = []
        for p in self.points:
            d: dict[str, Any] = {self.unit: p.size, "seconds": p.seconds, "busy": p.busy}
            d["share" if p.share is not None else "threads"] = (
                p.share if p.share is not None else p.threads
            )
            if p.repeats_s:
                d["repeats_s"] = list(p.repeats_s)
            out.append(d)
        return out

    @staticmethod
    def from_json(raw: Sequence[Mapping[str, Any]], unit: str) -> StageProfile:
        pts = []
        for i, d in enumerate(raw):
            try:
                share = d.get("share")
                pts.append(
                    Point(
                        size=int(d[unit]),
                        seconds=float(d["seconds"]),
                        threads=None if share is not None else int(d.get("threads", 1)),
                        share=None if share is None else float(share),
                        busy=float(d.get("busy", 1.0)),
                        repeats_s=tuple(float(x) for x in d.get("repeats_s", ())),
                    )
                )
            except (KeyError, TypeError, ValueError) as e:
                raise ProfileError(f"{unit} point {i} ({dict(d)}): {e}") from e
        return StageProfile(tuple(pts), unit)


@dataclass(frozen=True)
class SyncCosts:
    """Moving weights: the learner's publish per update, a replica's load per version,
    Colocated's offload and reload, and the bytes a replica on another node receives."""

    publish_s: float = 0.0
    load_s: float = 0.0
    offload_s: float = 0.0
    reload_s: float = 0.0
    state_bytes: float = 0.0


@dataclass(frozen=True)
class Profile:
    """A workload's stage costs (the planner's input, ``ebrl-plan-profile/1``).

    Attributes:
        chunk_s: seconds of one env's chunk, samples (the step-latency tail the model replays).
        sim_busy: cores a stepping env keeps busy.
        gen: generation's measured calls.
        train: training's measured updates.
        sync: weight movement.
        chunk_size: K, env steps per chunk.
        episode_steps: env steps per episode (None: episodes never cut a chunk short).
        param_bytes: gradient bytes a learner of several ranks all-reduces ...
        allreduces: ... this many times per update.
        message_s: the engine's own CPU seconds per message (a Ready or a Go).
        illustrative: True when the numbers were not measured (an example to plan with).
        source: where the numbers come from.
    """

    chunk_s: tuple[float, ...]
    sim_busy: float
    gen: StageProfile
    train: StageProfile
    sync: SyncCosts = field(default_factory=SyncCosts)
    chunk_size: int = 1
    episode_steps: int | None = None
    param_bytes: float = 0.0
    allreduces: int = 0
    message_s: float = 2e-4
    illustrative: bool = False
    source: str = ""

    def __post_init__(self) -> None:
        if not self.chunk_s or min(self.chunk_s) <= 0:
            raise ProfileError("sim.chunk_s: at least one positive sample")
        if self.chunk_size < 1:
            raise ProfileError(f"chunk_size={self.chunk_size}: must be >= 1")

    @property
    def steps_per_chunk(self) -> float:
        return steps_per_chunk(self.episode_steps, self.chunk_size)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "illustrative": self.illustrative,
            "source": self.source,
            "chunk_size": self.chunk_size,
            "sim": {
                "chunk_s": list(self.chunk_s),
                "cpu_busy": self.sim_busy,
                "episode_steps": self.episode_steps,
            },
            "gen": {"points": self.gen.to_json()},
            "train": {
                "points": self.train.to_json(),
                "param_bytes": self.param_bytes,
                "allreduces": self.allreduces,
            },
            "sync": asdict(self.sync),
            "message_s": self.message_s,
        }

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1) + "\n")
        return path

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> Profile:
        """Read a profile, naming what is missing or wrong.

        Raises:
            ProfileError: not a profile of this format, or a field is missing or invalid.
        """
        if raw.get("format") is None and "points" in raw:
            raise ProfileError(
                "an untagged file of stage points is the run profile ebrl wrote before "
                f"{FORMAT}, which it no longer reads: measure a new one (run without "
                "resources.profile: the run writes profile.json in its folder; or python -m "
                "ebrl.plan.measure --device cpu --levels 1,2 --out profile.json <overrides>)"
            )
        if raw.get("format") != FORMAT:
            raise ProfileError(f"format {raw.get('format')!r}: this planner reads {FORMAT!r}")
        try:
            sim, gen, train = raw["sim"], raw["gen"], raw["train"]
        except KeyError as e:
            raise ProfileError(f"a profile needs the sections sim, gen, train: {e} missing") from e
        if "chunk_s" in sim:
            chunk = tuple(float(x) for x in sim["chunk_s"])
        elif "chunk_dist" in sim:
            d = sim["chunk_dist"]
            chunk = lognormal_samples(float(d["mean_s"]), float(d.get("p99_over_mean", 1.0)))
        else:
            raise ProfileError("sim needs chunk_s (samples) or chunk_dist (mean_s, p99_over_mean)")
        sync = raw.get("sync") or {}
        unknown = set(sync) - {f for f in SyncCosts.__dataclass_fields__}
        if unknown:
            raise ProfileError(f"sync: unknown fields {sorted(unknown)}")
        return Profile(
            chunk_s=chunk,
            sim_busy=float(sim.get("cpu_busy", 1.0)),
            gen=StageProfile.from_json(gen["points"], "batch"),
            train=StageProfile.from_json(train["points"], "samples"),
            sync=SyncCosts(**{k: float(v) for k, v in sync.items()}),
            chunk_size=int(raw.get("chunk_size", 1)),
            episode_steps=None if sim.get("episode_steps") is None else int(sim["episode_steps"]),
            param_bytes=float(train.get("param_bytes", 0.0)),
            allreduces=int(train.get("allreduces", 0)),
            message_s=float(raw.get("message_s", 2e-4)),
            illustrative=bool(raw.get("illustrative", False)),
            source=str(raw.get("source", "")),
        )

    @staticmethod
    def load(path: str | Path) -> Profile:
        try:
            raw = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ProfileError(f"{path}: {e}") from e
        return Profile.from_dict(raw)


def steps_per_chunk(episode_steps: int | None, chunk_size: int) -> float:
    """Env steps a chunk makes on average: an episode's end cuts its last chunk short."""
    if not episode_steps:
        return float(chunk_size)
    return episode_steps / math.ceil(episode_steps / chunk_size)


def lognormal_samples(mean_s: float, p99_over_mean: float, n: int = 512) -> tuple[float, ...]:
    """``n`` deterministic quantiles of a lognormal with this mean and P99/mean (1: constant)."""
    if mean_s <= 0:
        raise ProfileError(f"chunk_dist.mean_s={mean_s}: must be > 0")
    if p99_over_mean <= 1.0 + 1e-9:
        return (mean_s,)
    from scipy import optimize, stats

    z = stats.norm.ppf(0.99)

    def gap(sigma: float) -> float:  # P99 / mean of a lognormal: exp(z sigma - sigma^2 / 2)
        return math.exp(z * sigma - sigma**2 / 2) - p99_over_mean

    if gap(z) < 0:
        raise ProfileError(
            f"chunk_dist.p99_over_mean={p99_over_mean}: a lognormal reaches "
            f"at most {math.exp(z * z / 2):.1f}"
        )
    sigma = optimize.brentq(gap, 1e-9, z)
    q = stats.norm.ppf((np.arange(n) + 0.5) / n)
    x = np.exp(sigma * q)
    return tuple(float(v) for v in x / x.mean() * mean_s)
