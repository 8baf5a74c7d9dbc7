"""The engine's scheduling rules, as pure functions the engine and the schedule model share.

``GenWorker._pick`` calls :func:`pick`, ``EBRLScheduler`` splits its env groups with
:func:`split_groups`; the model (``ebrl.resources.model.engine``) plays the same functions, so
the simulated schedule cannot drift from the real one. The rules the engine keeps inline (the
staleness gate ``GenWorker._eligible``, a replica's share of the groups ``GenWorker._reshape``,
the replica blocks ``Roles.replica_of``) have their twins here, and ``tests/test_plan.py`` holds
each pair together on the engine's own objects.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Sequence

import numpy as np


def split_groups(workers: Sequence[Sequence[int]], groups: int) -> list[list[int]]:
    """Group g = the g-th contiguous share of every worker's envs (the engine's ``env_groups``)."""
    out: list[list[int]] = [[] for _ in range(groups)]
    for ids in workers:
        for g, part in enumerate(np.array_split(np.array(ids, dtype=np.int64), groups)):
            out[g].extend(int(e) for e in part)
    return [g for g in out if g]


def pick(
    ready: OrderedDict[int, float],
    eligible: Callable[[int], bool],
    groups: Sequence[Sequence[int]],
    step_level: bool,
    batch_min: int,
    timeout_s: float,
    now: float,
    batch_max: int | None = None,
) -> list[int]:
    """The generator's next batch: the engine's rule (``GenWorker._pick`` calls this).

    Lock step: the first group whose acting envs (those the staleness gate lets act) are all
    ready. Step level: once ``batch_min`` eligible envs are ready, the first ``batch_max``
    (default ``batch_min``: the first M of N) of them in the order they became ready; or, once
    the oldest has waited ``timeout_s``, every eligible one (up to the cap). ``ready`` maps env
    -> when it became ready, oldest first. Empty: nothing to do yet.
    """
    if not step_level:
        for g in groups:
            acting = []
            for e in g:
                if eligible(e):
                    if e not in ready:  # an acting env still stepping: not this group
                        break
                    acting.append(e)
            else:
                if acting:
                    return acting
        return []
    ok = [e for e in ready if eligible(e)]
    cap = max(batch_min, batch_max or batch_min)
    if len(ok) >= batch_min:
        return ok[:cap]
    if ok and now - ready[ok[0]] >= timeout_s - 1e-9:  # (a timer set for it fires exactly)
        return ok[:cap]
    return []


def admits(decisions: int, decisions_per_env: int, staleness: int, version: int) -> bool:
    """The staleness gate (``GenWorker._eligible``): an env that has taken ``decisions`` may act
    with policy ``version`` iff the segment the decision lands in (``decisions // T``, trained by
    learner version = that index) is at most ``staleness`` (k) versions ahead of it."""
    return decisions // decisions_per_env - staleness <= version


def replica_blocks(workers: int, replicas: int) -> tuple[int, ...]:
    """Env worker -> the replica that acts for it: contiguous blocks (``Roles.replica_of``)."""
    blocks = np.array_split(np.arange(workers), replicas)
    return tuple(int(r) for r, b in enumerate(blocks) for _ in b)


def served_groups(groups: Sequence[Sequence[int]], served: set[int]) -> list[list[int]]:
    """A replica's lock-step groups: each group restricted to the envs it serves, empty ones
    dropped (``GenWorker._reshape``)."""
    mine = ([e for e in g if e in served] for g in groups)
    return [g for g in mine if g]


def pinned_batch_min(num_envs: int, groups: int, replicas: int) -> int:
    """M when a run pins the step level without a batch size: half of one replica's share of a
    group (``EBRLScheduler.pinned_shape``)."""
    return max(1, math.ceil(num_envs / groups / replicas / 2))
