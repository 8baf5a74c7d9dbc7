"""How the roles of a run share a GPU's SMs: decisions only, no side effects.

A role with a share below one GPU (``scheduler.gen_gpus`` / ``learner_gpus``) shares that GPU
with other roles. Its SM quota (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) is
``resources.gen_sm_pct`` / ``train_sm_pct`` where pinned, else its GPU share in percent. The
quota holds only under an MPS control daemon on the role's node (``ebrl.resources.mps`` starts
or joins one); where none can serve, the roles time-slice the GPU, and the run says so once and
records it (:data:`TAG`).

What changes the machine (the daemons, the roles' environments) is in ``ebrl.resources.mps``
and ``ebrl.runtime.placement_ray``; this module says what they should be and refuses what cannot be.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: the run parameter (MLflow) that says how the run's GPUs were shared
TAG = "gpu/sharing"
#: the resources keys that pin a role's SM quota, by role
QUOTA_KEYS = {"gen": "resources.gen_sm_pct", "learner": "resources.train_sm_pct"}
#: the scheduler keys that set a role's GPU share (the scale node feeds them)
SHARE_KEYS = {"gen": "scheduler.gen_gpus", "learner": "scheduler.learner_gpus"}


class Sharing(StrEnum):
    """How a run's roles used their GPUs."""

    #: SM quotas under an MPS daemon on every node with a shared GPU
    mps = "mps"
    #: MIG instances
    mig = "mig"
    #: shared GPUs without MPS or MIG: kernels take turns, the shares are not enforced
    time_sliced = "time-sliced"
    #: every GPU role has whole GPUs: nothing shared
    whole = "whole"


def is_share(gpus: float) -> bool:
    """A GPU ask below one GPU: the role shares its GPU."""
    return 0 < gpus < 1


def quotas(
    gen_gpus: float,
    learner_gpus: float,
    gen_sm_pct: int | None = None,
    train_sm_pct: int | None = None,
) -> dict[str, int | None]:
    """Each role's SM quota in percent: pinned where the resources group sets it, else the
    role's GPU share (``round(100 * share)``, 1..99) for a share below one GPU; None for a role
    with whole GPUs or none (no quota: it has its GPUs to itself)."""
    out: dict[str, int | None] = {}
    for role, share, pinned in (
        ("gen", gen_gpus, gen_sm_pct),
        ("learner", learner_gpus, train_sm_pct),
    ):
        if share <= 0:
            out[role] = None
        elif pinned is not None:
            out[role] = int(pinned)
        elif is_share(share):
            out[role] = max(1, min(99, round(100 * share)))
        else:
            out[role] = None
    return out


def check_quotas(
    gen_gpus: float,
    learner_gpus: float,
    gen_sm_pct: int | None = None,
    train_sm_pct: int | None = None,
    asked: str = "auto",
) -> None:
    """Refuse SM quotas, and a way of sharing (``asked``: ``resources.gpu_sharing``), that a
    run cannot honour, before any work starts.

    Raises:
        ValueError: a quota outside (0, 100]; a quota pinned for a role that asks no GPU; a
            generator and a learner that share one GPU (each asks a share, both fit on one GPU,
            so placement packs them together) with quotas past 100%; a way of sharing asked
            (not ``auto``) where no role shares a GPU; quotas pinned with ``time_sliced``
            (nothing would enforce them). The message names the key and the fix. Whether a
            node can serve ``mps`` or ``mig`` is found when the run places its roles, before
            any worker starts (``ebrl.schedulers.ebrl.gpu``).
    """
    _check_asked(asked, gen_gpus, learner_gpus, gen_sm_pct, train_sm_pct)
    shares = {"gen": gen_gpus, "learner": learner_gpus}
    pinned = {"gen": gen_sm_pct, "learner": train_sm_pct}
    for role, pct in pinned.items():
        if pct is None:
            continue
        key = QUOTA_KEYS[role]
        if not 0 < pct <= 100:
            raise ValueError(f"{key}={pct}: an SM quota is a percent in (0, 100]; or null")
        if shares[role] <= 0:
            raise ValueError(
                f"{key}={pct}, but {SHARE_KEYS[role]}=0: that role computes on the CPU cores "
                f"and has no SMs to cap; give it a GPU share (scale.{role}_gpus=0.5), or leave "
                f"{key} null"
            )
    got = quotas(gen_gpus, learner_gpus, gen_sm_pct, train_sm_pct)
    total = (got["gen"] or 0) + (got["learner"] or 0)
    if together(gen_gpus, learner_gpus) and total > 100:
        raise ValueError(
            f"{QUOTA_KEYS['gen']}={got['gen']} + {QUOTA_KEYS['learner']}={got['learner']} = "
            f"{total}% of one GPU's SMs, and the generator and the learner share one GPU "
            f"({SHARE_KEYS['gen']}={gen_gpus:g}, {SHARE_KEYS['learner']}={learner_gpus:g}): "
            "lower them to at most 100 together"
        )


def _check_asked(
    asked: str, gen_gpus: float, learner_gpus: float, gen_pct: int | None, train_pct: int | None
) -> None:
    """``resources.gpu_sharing``'s part of :func:`check_quotas`."""
    if asked == "auto":
        return
    if not (is_share(gen_gpus) or is_share(learner_gpus)):
        raise ValueError(
            f"resources.gpu_sharing={asked}, but no role shares a GPU "
            f"({SHARE_KEYS['gen']}={gen_gpus:g}, {SHARE_KEYS['learner']}={learner_gpus:g}): "
            "give the roles shares below one GPU (+axis/scale=g1: half a GPU each), or leave "
            "resources.gpu_sharing=auto"
        )
    pinned = [f"{QUOTA_KEYS[r]}={p}" for r, p in (("gen", gen_pct), ("learner", train_pct))
              if p is not None]  # fmt: skip
    if asked == Sharing.time_sliced and pinned:
        raise ValueError(
            f"{', '.join(pinned)} with resources.gpu_sharing=time_sliced: nothing enforces a "
            "quota on a time-sliced GPU; leave the quotas null, or share by mps or mig"
        )


def together(gen_gpus: float, learner_gpus: float) -> bool:
    """The generator and the learner each ask a share and both fit on one GPU: placement packs
    them onto one GPU, and their quotas split its SMs."""
    return is_share(gen_gpus) and is_share(learner_gpus) and gen_gpus + learner_gpus <= 1


#: how a run's SM quotas were chosen (MLflow param ``gpu/split``)
PINNED, ALGORITHM1, SHARES = "pinned", "algorithm1", "shares"


@dataclass(frozen=True)
class SplitDecision:
    """The run's SM quotas and how they were chosen.

    Attributes:
        quotas: role (``gen``, ``learner``) -> SM percent (None: no quota).
        how: :data:`PINNED` (``resources.gen_sm_pct`` / ``train_sm_pct``), :data:`ALGORITHM1`
            (the split searched on the GPU stage profile) or :data:`SHARES` (each role's GPU
            share: no profile to search, or the roles do not share one GPU).
        inputs: what the decision read (the profile, the batch sizes, the predicted rates).
    """

    quotas: dict[str, int | None]
    how: str
    inputs: dict[str, Any] = field(default_factory=dict)

    def params(self) -> dict[str, str]:
        """The decision as MLflow params (``gpu/*``)."""
        out = {"gpu/split": self.how}
        for role, key in (("gen", "gpu/gen_sm_pct"), ("learner", "gpu/train_sm_pct")):
            if self.quotas.get(role) is not None:
                out[key] = str(self.quotas[role])
        out.update({f"gpu/split_{k}": str(v) for k, v in self.inputs.items()})
        return out


def sm_rates(profile: Any, gen_batch: int, train_samples: int) -> Any:
    """A GPU stage profile (``ebrl-plan-profile/1``: gen and train measured at GPU shares, an
    MPS quota each; ``python -m ebrl.plan.measure --device cuda``) as Algorithm 1's input
    (:func:`~ebrl.resources.profiler.rate_table`): each stage's decisions/s at each measured
    share, in SM percent, at the run's generator batch and learner samples per update.

    Raises:
        ValueError: the profile was measured on CPU threads, not GPU shares.
    """
    from ebrl.resources.profiler import rate_table

    for stage, prof in (("gen", profile.gen), ("train", profile.train)):
        if prof.device != "gpu":
            raise ValueError(
                f"the profile's {stage} points were measured on CPU threads, not GPU shares: "
                "measure one on the GPU (python -m ebrl.plan.measure --device cuda --levels "
                "0.25,0.5,1), or leave resources.gpu_profile null"
            )
    return rate_table(profile, {"gen": gen_batch, "train": train_samples})


def decide_split(
    gen_gpus: float,
    learner_gpus: float,
    gen_sm_pct: int | None = None,
    train_sm_pct: int | None = None,
    *,
    profile: str | None = None,
    gen_batch: int = 1,
    train_samples: int = 1,
    min_pct: int = 5,
) -> SplitDecision:
    """The run's SM quotas: pinned values win; else, where the generator and the learner share
    one GPU and a GPU stage profile is given, Algorithm 1 (:func:`ebrl.resources.split.allocate`,
    the binary search over the gen/train split of the GPU's 100 SM percent) chooses them; else
    each role's GPU share (:func:`quotas`).

    Args:
        gen_gpus: ``scheduler.gen_gpus``.
        learner_gpus: ``scheduler.learner_gpus``.
        gen_sm_pct: ``resources.gen_sm_pct`` (pinned).
        train_sm_pct: ``resources.train_sm_pct`` (pinned).
        profile: ``resources.gpu_profile``: a GPU stage profile file.
        gen_batch: the generator's batch (envs per call).
        train_samples: decisions each learner update trains on.
        min_pct: the least SM percent Algorithm 1 gives a stage.
    """
    if gen_sm_pct is not None or train_sm_pct is not None:
        return SplitDecision(quotas(gen_gpus, learner_gpus, gen_sm_pct, train_sm_pct), PINNED)
    shares = quotas(gen_gpus, learner_gpus)
    if profile is None or not together(gen_gpus, learner_gpus):
        return SplitDecision(shares, SHARES)
    from ebrl.plan.profile import Profile
    from ebrl.resources.split import Pool, allocate

    prof = sm_rates(Profile.load(profile), gen_batch, train_samples)
    alloc = allocate(prof, Pool(100, "sm_percent", min_units=min_pct))
    chosen = {"gen": alloc.gen_units, "learner": alloc.train_units}
    inputs = {
        "profile": Path(profile).name,
        "gen_batch": gen_batch,
        "train_samples": train_samples,
        "gen_per_s": f"{alloc.gen_throughput:.1f}",
        "train_per_s": f"{alloc.train_throughput:.1f}",
        "evaluations": alloc.evaluations,
    }
    log.info(
        "GPU split (Algorithm 1 on %s, gen batch %d, train %d samples): gen %d%% (%.1f/s), "
        "train %d%% (%.1f/s) of the GPU's SMs",
        profile, gen_batch, train_samples, alloc.gen_units, alloc.gen_throughput,
        alloc.train_units, alloc.train_throughput,
    )  # fmt: skip
    return SplitDecision(chosen, ALGORITHM1, inputs)


def check_gpu_profile(profile: str | None, gen_gpus: float, learner_gpus: float) -> None:
    """Refuse a ``resources.gpu_profile`` the run cannot split SMs from, before any work.

    Raises:
        ValueError: the generator and the learner do not share one GPU; the file is missing,
            not a stage profile, or measured on CPU threads. The message names the key and
            the fix.
    """
    if profile is None:
        return
    key = f"resources.gpu_profile={profile}"
    if not together(gen_gpus, learner_gpus):
        raise ValueError(
            f"{key}: Algorithm 1 splits the SMs of a GPU the generator and the learner share, "
            f"but {SHARE_KEYS['gen']}={gen_gpus:g}, {SHARE_KEYS['learner']}={learner_gpus:g} "
            "do not share one (each must ask a share below one GPU, together at most 1: "
            "+axis/scale=g1): leave it null"
        )
    from ebrl.plan.profile import Profile, ProfileError

    if not Path(profile).is_file():
        raise ValueError(f"{key}: no such file; give a profile from python -m ebrl.plan.measure "
                         "--device cuda, or leave it null")  # fmt: skip
    try:
        loaded = Profile.load(profile)
    except (ProfileError, OSError, ValueError) as e:
        raise ValueError(f"{key}: not a stage profile ({e})") from e
    sm_rates(loaded, 1, 1)  # measured at GPU shares, or refused naming the fix


def mig_choice(
    gpu: Any, roles: Iterable[tuple[str, int]], taken: set[str] | None = None
) -> dict[str, Any]:
    """The MIG instance of ``gpu`` each role runs on: the free one whose SMs are closest to its
    quota (largest quota first; ties: the smaller instance, the bigger are kept for later).

    Args:
        gpu: a :class:`~ebrl.resources.topology.Gpu` in MIG mode.
        roles: (worker, SM percent) of each role placed on it.
        taken: MIG uuids already given out (updated).

    Returns:
        worker -> its :class:`~ebrl.resources.topology.MigInstance` (a role left without a free
        instance is absent).
    """
    taken = set() if taken is None else taken
    out = {}
    sms = gpu.sms or max((m.sms for m in gpu.mig_instances), default=1)
    for worker, pct in sorted(roles, key=lambda r: (-r[1], r[0])):
        free = [m for m in gpu.mig_instances if m.uuid not in taken]
        if not free:
            continue
        best = min(free, key=lambda m: (abs(100 * m.sms / sms - pct), m.sms, m.uuid))
        taken.add(best.uuid)
        out[worker] = best
    return out


def over_subscribed(per_gpu: Mapping[tuple[str, int], Iterable[tuple[str, int]]]) -> list[str]:
    """The GPUs whose roles' quotas sum past 100%, described (empty: none).

    Args:
        per_gpu: (node, GPU slot) -> the (worker, quota) of each role placed on it.
    """
    out = []
    for (node, slot), roles in sorted(per_gpu.items()):
        roles = list(roles)
        total = sum(q for _, q in roles)
        if total > 100:
            who = ", ".join(f"{w} {q}%" for w, q in roles)
            out.append(f"GPU {slot} of node {node}: {who} = {total}%")
    return out


def time_sliced_warning(why: str, gen_gpus: float, learner_gpus: float) -> str:
    """The one warning of a run whose shared GPUs are time-sliced: why, and what to install or
    enable."""
    return (
        f"GPU shares below one GPU (scheduler.gen_gpus={gen_gpus:g}, "
        f"learner_gpus={learner_gpus:g}) become SM quotas only under an MPS daemon, and {why}; "
        "the roles time-slice the GPU (kernels take turns, the shares are not enforced). "
        "Install the NVIDIA driver's MPS tools (nvidia-cuda-mps-control on PATH on every GPU "
        "node) or enable MIG (nvidia-smi -mig 1), or give each role whole GPUs"
    )


@dataclass(frozen=True)
class Resplit:
    """One run-time re-split of a shared GPU's SMs (Algorithm 1 fired on a drift).

    Attributes:
        step: the update at the decision.
        stage: the stage that drifted most from its planned rate (``gen`` or ``train``).
        old: role -> SM percent before.
        new: role -> SM percent Algorithm 1 chose.
        cause: the monitor's account of the drift.
        decided_at: ``time.perf_counter()`` at the decision.
    """

    step: int
    stage: str
    old: dict[str, int]
    new: dict[str, int]
    cause: str
    decided_at: float

    def describe(self) -> str:
        return (
            f"update {self.step}: {self.stage} drifted; gen {self.old['gen']}% -> "
            f"{self.new['gen']}%, learner {self.old['learner']}% -> {self.new['learner']}%"
        )


@dataclass(frozen=True)
class Declined:
    """A re-split Algorithm 1 chose and the run did not apply: over the time left, the faster
    split would save less than a generator restart costs.

    Attributes:
        step: the update at the decision.
        old: role -> SM percent kept.
        new: role -> SM percent Algorithm 1 chose.
        saved_s: seconds the new split would save over ``left_s`` (on the rescaled profile).
        left_s: the run's seconds left, as estimated at the decision.
        restart_s: what the last applied re-split took from decision to effect.
    """

    step: int
    old: dict[str, int]
    new: dict[str, int]
    saved_s: float
    left_s: float
    restart_s: float

    def describe(self) -> str:
        return (
            f"update {self.step}: gen {self.old['gen']}% -> {self.new['gen']}% would save "
            f"~{self.saved_s:.1f} s of the ~{self.left_s:.0f} s left, less than a generator "
            f"restart ({self.restart_s:.1f} s): kept"
        )


class SMResplitter:
    """Algorithm 1 at run time over a shared GPU's SMs: the elastic allocator
    (:class:`~ebrl.resources.elastic.ElasticAllocator`) on the SM-percent profile the run's
    split was chosen from (:func:`sm_rates`), fed each update's measured stage capacities;
    when they drift from the plan by more than ``threshold`` for ``window`` updates it searches
    the split again on the profile rescaled to what was measured.

    A new split takes a generator restart, so one is applied only where it pays: once a
    re-split's cost is known (:meth:`applied`), a later one whose predicted saving over the
    run's time left is smaller is declined (:class:`Declined`; the profile keeps what was
    measured, the split stays). The first is always applied: its cost is what is measured.

    Args:
        profile: ``resources.gpu_profile``.
        gen_batch: as for :func:`decide_split`.
        train_samples: as for :func:`decide_split`.
        threshold: ``resources.rebalance_threshold``.
        window: ``resources.rebalance_patience`` (scaled to the run where unset).
        min_pct: the least SM percent a stage gets.
    """

    def __init__(
        self,
        profile: str,
        gen_batch: int,
        train_samples: int,
        threshold: float,
        window: int,
        min_pct: int = 5,
    ) -> None:
        import time

        from ebrl.plan.profile import Profile
        from ebrl.resources.elastic import ElasticAllocator
        from ebrl.resources.monitors import DivergenceMonitor
        from ebrl.resources.split import Pool

        self._clock = time.perf_counter
        prof = sm_rates(Profile.load(profile), gen_batch, train_samples)
        self.allocator = ElasticAllocator(
            prof, Pool(100, "sm_percent", min_units=min_pct), DivergenceMonitor(threshold, window)
        )
        self.history: list[Resplit] = []
        self.declined: list[Declined] = []
        #: seconds the last applied re-split took from decision to effect (None: none yet)
        self.restart_s: float | None = None

    @property
    def quotas(self) -> dict[str, int]:
        """The split in force (as decided: the caller applies it)."""
        a = self.allocator.current
        return {"gen": a.gen_units, "learner": a.train_units}

    def applied(self, seconds: float) -> None:
        """The last re-split took ``seconds`` from decision to effect: the cost of the next."""
        self.restart_s = float(seconds)

    def observe(
        self, gen_per_s: float, train_per_s: float, step: int, left_s: float | None = None
    ) -> Resplit | None:
        """One update's measured capacities (decisions per busy second of the generator and
        of the learner); a :class:`Resplit` when Algorithm 1 fired and chose another split
        that pays for its restart over ``left_s``, the run's seconds left (None: unknown,
        every re-split pays)."""
        old = self.quotas
        r = self.allocator.observe(gen_per_s, train_per_s, step=step)
        if r is None or not r.changed:
            return None
        if (kept := self._worth_less_than_a_restart(r, left_s)) is not None:
            self.declined.append(kept)
            log.info("GPU re-split declined at %s", kept.describe())
            return None
        # the stage that drifted from its own level, else the one further from its planned rate
        stage = self.allocator.drift.stage if "drifted" in r.cause else ""
        if stage not in ("gen", "train"):
            off = {
                "gen": abs(r.measured_gen / r.old.gen_throughput - 1.0),
                "train": abs(r.measured_train / r.old.train_throughput - 1.0),
            }
            stage = max(off, key=off.__getitem__)
        out = Resplit(step, stage, old, self.quotas, r.cause, self._clock())
        self.history.append(out)
        log.info("GPU re-split at %s (%s)", out.describe(), r.cause)
        return out

    def _worth_less_than_a_restart(self, r: Any, left_s: float | None) -> Declined | None:
        """Where the split ``r`` chose saves less over ``left_s`` than the last restart cost:
        the old split is put back, priced on the rescaled profile (so the monitors compare
        what is measured with what that profile says), and the refusal returned."""
        if left_s is None or self.restart_s is None:
            return None
        import dataclasses

        from ebrl.resources.split import predict

        prof, cur = self.allocator.profile, r.old
        kept = dataclasses.replace(
            cur,
            gen_throughput=predict(prof, "gen", cur.gen_units, cur.gen_batch),
            train_throughput=predict(prof, "train", cur.train_units, cur.train_batch),
        )
        if kept.throughput <= 0:
            return None  # the old split cannot be priced: apply the new one
        saved = max(0.0, left_s) * max(0.0, 1.0 - kept.throughput / r.new.throughput)
        if saved >= self.restart_s:
            return None
        self.allocator.current = kept
        old = {"gen": cur.gen_units, "learner": cur.train_units}
        new = {"gen": r.new.gen_units, "learner": r.new.train_units}
        return Declined(int(r.step or 0), old, new, saved, float(left_s), self.restart_s)
