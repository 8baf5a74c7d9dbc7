"""Level 3's core rebinding: the greedy decision on fakes, and the generator applying it."""

from __future__ import annotations

import os

import pytest

from ebrl.schedulers.ebrl import EBRLScheduler
from ebrl.schedulers.ebrl.gen_worker import GenWorker
from ebrl.schedulers.ebrl.rebind import home_cores, rebind_plan

from .test_ebrl_scheduler import context, fake_cfg

H = {0: frozenset({0}), 1: frozenset({1}), 2: frozenset({2}), 3: frozenset({3})}


def test_everyone_home_when_nobody_or_everybody_is_idle():
    assert rebind_plan(H, {0: 2, 1: 1, 2: 3, 3: 1}) == H
    assert rebind_plan(H, dict.fromkeys(H, 0)) == H


def test_idle_cores_go_to_the_biggest_stragglers_first():
    got = rebind_plan(H, {0: 0, 1: 3, 2: 0, 3: 1})
    assert got[0] == {0} and got[2] == {2}  # idle workers keep their home
    assert got[1] == {1, 0} and got[3] == {3, 2}  # dealt one by one, most pending first
    got = rebind_plan(H, {0: 0, 1: 5, 2: 0, 3: 0})
    assert got[1] == {0, 1, 2, 3}


def test_cores_are_never_taken_from_a_busy_worker():
    got = rebind_plan(H, {0: 1, 1: 0, 2: 4, 3: 2})
    for w in (0, 2, 3):
        assert H[w] <= got[w]
    assert got[1] == H[1]
    # only idle workers' cores are handed out
    assert set().union(*(got[w] - H[w] for w in H)) <= H[1]


def test_home_cores_round_robin():
    assert home_cores(3, [4, 5]) == {0: {4}, 1: {5}, 2: {4}}
    with pytest.raises(ValueError):
        home_cores(2, [])


def test_generator_applies_the_plan_when_pending_work_changes():
    """GenWorker._rebind, driven directly: lend, keep, and give back cores as work moves."""
    moves = []
    gen = GenWorker.__new__(GenWorker)  # the applier only; no stage, no sockets
    gen.plan = type("P", (), {"rebind": True, "home": {0: frozenset({0}), 1: frozenset({1})}})()
    gen.rebinder = lambda m: moves.append(dict(m))
    gen.pids = {0: 100, 1: 101}
    gen.home = dict(gen.plan.home)  # the replica's own env workers' home cores
    gen.bound = dict(gen.plan.home)
    gen.rebinds = 0
    gen.pending = {0: 0, 1: 3}  # worker 0 idle, worker 1 straggling
    gen._rebind()
    assert moves == [{101: frozenset({0, 1})}]
    gen._rebind()  # nothing changed: no new move
    assert len(moves) == 1
    gen.pending = {0: 2, 1: 3}  # worker 0 has work again: everyone home
    gen._rebind()
    assert moves[-1] == {101: frozenset({1})} and gen.rebinds == 2


def test_rebinding_run_keeps_moves_within_this_machines_cpus(monkeypatch):
    moves = []
    monkeypatch.setattr(GenWorker, "rebinder", staticmethod(lambda m: moves.append(dict(m))))
    cfg = fake_cfg(["simulator.delay_jitter_s=0.002"])
    sched = EBRLScheduler(backend="inprocess", rebind=True, batch_timeout_ms=1.0)
    _, ctx = context(cfg)
    gen = sched.run(ctx)
    try:
        reports = [next(gen) for _ in range(3)]
    finally:
        gen.close()
    assert [r.iteration for r in reports] == [0, 1, 2]
    cpus = set(os.sched_getaffinity(0))
    for m in moves:  # whether a round leaves a worker idle depends on timing; moves must be valid
        for cores in m.values():
            assert set(cores) <= cpus


def test_rebind_needs_step_level():
    with pytest.raises(ValueError, match="step_level"):
        EBRLScheduler(rebind=True, step_level=False)


# --- every thread moves ------------------------------------------------------------------------
CHILD = """
import threading, time
for _ in range(3):
    threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
print("up", flush=True)
time.sleep(30)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to move between")
def test_rebinding_moves_every_thread_of_an_env_worker_process():
    import subprocess
    import sys

    from ebrl.resources.apply import rebind_threads, threads_of

    core = max(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        tids = threads_of(child.pid)
        assert len(tids) >= 4  # the main thread and its three
        rebind_threads({child.pid: {core}})
        assert all(os.sched_getaffinity(t) == {core} for t in tids)
    finally:
        child.kill()
        child.wait()


def test_an_in_process_workers_thread_moves_alone():
    import threading

    from ebrl.resources.apply import affinity, rebind_threads, threads_of

    started, done = threading.Event(), threading.Event()
    tid: list[int] = []

    def worker():
        tid.append(threading.get_native_id())
        started.set()
        done.wait(10)

    t = threading.Thread(target=worker)
    t.start()
    started.wait(10)
    mine = affinity(0)
    try:
        assert threads_of(tid[0]) == tid  # a thread of this process: not the whole process
        rebind_threads({tid[0]: {min(mine)}})
        assert os.sched_getaffinity(tid[0]) == {min(mine)}
        assert affinity(0) == mine  # the host's (the driver's) own thread did not move
    finally:
        done.set()
        t.join()
