"""The schedule model made faster plays the same schedule, bit for bit: its machine and its
engine against the model as it was before (``tests/model_reference.py``), on random small
workloads and layouts and on the planner's own settings."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ebrl.plan.cli import EXAMPLE, PAPER_WORKLOAD, workload_for
from ebrl.plan.machine import from_conf
from ebrl.plan.profile import Profile, lognormal_samples
from ebrl.plan.schedulers import SCHEDULERS, PlanWorkload, build
from ebrl.resources.model import (
    Layout,
    Machine,
    Played,
    Shape,
    StageCall,
    StageCosts,
    Workload,
    play,
)
from tests import model_reference as ref
from tests.test_plan import CPU, cpu_profile


def same(got: Played, want: Played) -> None:
    """Every figure, event and span equal (floats compared exactly)."""
    assert got.events == want.events
    assert [(s.stage, s.track, s.start, s.end, s.args) for s in got.spans] == [
        (s.stage, s.track, s.start, s.end, s.args) for s in want.spans
    ]
    assert got.update_end == want.update_end
    assert got.staleness_counts == want.staleness_counts
    assert got.window == want.window
    assert got.prediction == want.prediction


#: layouts of the random cases: one pool; a pool whose nominal cores exceed its effective ones
#: (a job alone gets more); GPUs, the learner over two of them (a job on several pools) with
#: its host thread and the replicas' as loads on the cores
LAYOUTS = ("single", "nominal", "gpus")


def layout_for(kind: str, n_workers: int, replicas: int) -> Layout:
    if kind == "single":
        return Layout(
            {"cpu": 2.0}, ("cpu",) * n_workers, ((("cpu", 1.0),),) * replicas, (("cpu", 1.0),)
        )
    if kind == "nominal":
        return Layout(
            {"cpu": 1.5},
            ("cpu",) * n_workers,
            ((("cpu", 1.0),),) * replicas,
            (("cpu", 1.0),),
            nominal={"cpu": 2.0},
        )
    return Layout(
        {"cpu": 3.0, "gpu0": 1.0, "gpu1": 1.0},
        ("cpu",) * n_workers,
        tuple(((f"gpu{r % 2}", 0.5),) for r in range(replicas)),
        (("gpu0", 0.5), ("gpu1", 0.5)),
        nominal={"cpu": 4.0},
        gen_loads=((("cpu", 1.0),),) * replicas,
        learner_loads=(("cpu", 2.0),),
    )


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    k=st.integers(0, 2),
    n_workers=st.integers(1, 3),
    per_worker=st.integers(1, 5),
    t=st.integers(1, 4),
    groups=st.integers(1, 3),
    step=st.booleans(),
    m=st.integers(1, 6),
    cap=st.sampled_from([None, 4, 16]),
    tail=st.sampled_from([1.0, 3.0]),
    train_s=st.sampled_from([0.001, 0.05, 0.3]),
    replicas=st.integers(1, 3),
    kind=st.sampled_from(LAYOUTS),
    sync=st.sampled_from([(0.0, 0.0, 0.0), (0.002, 0.004, 0.0), (0.002, 0.004, 0.003)]),
    seed=st.integers(0, 3),
)
def test_the_model_plays_what_the_reference_plays(
    k, n_workers, per_worker, t, groups, step, m, cap, tail, train_s, replicas, kind, sync, seed
):
    ids = np.arange(n_workers * per_worker)
    workers = tuple(tuple(int(x) for x in b) for b in np.array_split(ids, n_workers))
    sync_s, load_s, offload_s = sync
    costs = StageCosts(
        lognormal_samples(0.01, tail, n=64),
        0.5,
        0.003,
        0.001,
        1.0,
        train_s,
        1.0,
        sync_s=sync_s,
        load_s=load_s,
        offload_s=offload_s,
    )
    work = Workload(workers, t, k, 2.0, 4)
    layout = layout_for(kind, n_workers, min(replicas, n_workers))
    shape = Shape(groups, step, m, 0.002, cap)
    args = (costs, work, shape, layout, 5, 1, seed)
    same(play(*args), ref.play(*args))


def test_the_planners_settings_play_what_the_reference_plays():
    """Every scheduler as the planner builds it: the example GPU profile's g1 and g2 scale
    points (placement, GPU shares, host loads, EBRL's search's first shape and its levels with
    several replicas) and a CPU machine."""
    example = Profile.load(EXAMPLE)
    cases: list[tuple[Profile, object, PlanWorkload]] = []
    for g in ("g1", "g2"):
        machine, roles = from_conf(f"scale/{g}")
        cases.append((example, machine, workload_for(roles, dict(PAPER_WORKLOAD))))
    cases.append((cpu_profile(), CPU, PlanWorkload()))
    for profile, machine, wl in cases:
        for name in SCHEDULERS:
            s = build(name, profile, wl, machine)  # type: ignore[arg-type]
            for shape in s.shapes or (s.shape,):
                args = (s.costs, s.work, shape, s.layout, 3, 1, 0)
                same(play(*args), ref.play(*args))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 10_000))
def test_the_machine_ends_jobs_when_the_reference_does(seed):
    """Random jobs (on one pool, on several, with loads, pure delays) started at random
    completions and timers: the same ends, in the same order, at the same instants."""
    rng = random.Random(seed)
    pools = {"cpu": 2.0, "gpu0": 1.0, "gpu1": 1.0}
    uses = [
        (("cpu", 1.0),),
        (("cpu", 0.5),),
        (("gpu0", 0.5),),
        (("gpu0", 1.0), ("gpu1", 1.0)),
        (),
    ]
    loads = [(), (("cpu", 1.0),)]
    ends: dict[str, list[tuple[int, float]]] = {"new": [], "ref": []}
    machines = {"new": Machine(pools, {"cpu": 3.0}), "ref": ref.Machine(pools, {"cpu": 3.0})}
    plan = [
        (rng.choice([0.01, 0.1, 0.37, 1.0]), rng.randrange(len(uses)), rng.randrange(2))
        for _ in range(60)
    ]
    for side, m in machines.items():
        job_cls = StageCall if side == "new" else ref.Job
        todo = list(plan)

        def start(i: int, m=m, job_cls=job_cls, todo=todo, side=side) -> None:
            if not todo:
                return
            work, u, ld = todo.pop()
            m.add(
                job_cls(
                    work,
                    uses[u],
                    lambda i=i, m=m, side=side: (ends[side].append((i, m.now)), start(i + 1)),
                    "x",
                    f"t{i}",
                    loads=loads[ld],
                )
            )

        for i in range(4):
            start(100 * i)
        m.timer(0.25)
        m.timer(0.5)
        while m.advance():
            pass
    assert ends["new"] == ends["ref"]
    assert len(ends["new"]) == len(plan)
    new, old = machines["new"], machines["ref"]
    assert (new.now, new.idle) == (old.now, old.idle)
    assert [(s.stage, s.track, s.start, s.end) for s in new.spans] == [
        (s.stage, s.track, s.start, s.end) for s in old.spans
    ]
