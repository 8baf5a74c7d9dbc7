"""Level 3's core rebinding: idle cores go to the env workers that still have envs to step.

Env workers are pinned to home cores. When a worker has no env left to step in this round (all its
envs wait on the generator) its cores are idle; a straggler worker (envs still stepping) is then
allowed onto them, so it need not wait for its own core while the generator or another process
holds it. When the idle worker gets work back, everyone returns home. The decision is a pure
function (tested on fakes); the generator applies it with ``ebrl.resources.apply.rebind``.
"""

from __future__ import annotations

from collections.abc import Mapping


def rebind_plan(
    home: Mapping[int, frozenset[int]], pending: Mapping[int, int]
) -> dict[int, frozenset[int]]:
    """Cores each env worker may run on now.

    Args:
        home: worker -> its home cores.
        pending: worker -> envs it is stepping or has queued (0: idle).

    Returns:
        worker -> cores: idle workers keep their home; the idle workers' cores are dealt one by
        one to the busy workers, most pending envs first (greedy); with no idle or no busy worker,
        everyone is at home.
    """
    out = {w: frozenset(c) for w, c in home.items()}
    idle = sorted({c for w, cs in home.items() if pending.get(w, 0) == 0 for c in cs})
    busy = sorted((w for w in home if pending.get(w, 0) > 0), key=lambda w: (-pending[w], w))
    if not idle or not busy:
        return out
    extra: dict[int, set[int]] = {w: set() for w in busy}
    for i, core in enumerate(idle):
        extra[busy[i % len(busy)]].add(core)
    for w in busy:
        out[w] = out[w] | extra[w]
    return out


def home_cores(workers: int, cpus: list[int]) -> dict[int, frozenset[int]]:
    """Home cores of ``workers`` env workers over the allowed ``cpus``: round robin."""
    if not cpus:
        raise ValueError("no CPUs to pin env workers to")
    return {w: frozenset({cpus[w % len(cpus)]}) for w in range(workers)}
