"""How a shared GPU's SMs are split between the generator and the learner (issue 42): pinned
quotas win; unpinned, Algorithm 1 chooses them from a GPU stage profile
(``resources.gpu_profile``); without one, each role's GPU share. At run time Algorithm 1 splits
again when the stages drift from the plan. The profile here is the planner's shipped one
(``conf/plan/example_gpu_profile.json``: pi0 on an H100 at shares 0.25, 0.5 and 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ebrl.config import ConfigError, validate
from ebrl.hardware import MachineFacts
from ebrl.plan.profile import Profile
from ebrl.resources import sharing
from ebrl.resources.split import profile_curve
from ebrl.train import _refuse_unwired_resources

from .alloc_reference import balance_brute_force
from .conftest import make_cfg

ROOT = Path(__file__).resolve().parents[1]
PROFILE = str(ROOT / "conf" / "plan" / "example_gpu_profile.json")
G1 = ["scheduler=ebrl", "+axis/scale=g1", "gpu=h100", "scheduler.device=cpu"]
H100 = MachineFacts(where="the test machine", gpus=("NVIDIA H100 80GB HBM3",), cuda=False, cpus=16)


@pytest.mark.parametrize(("gen_batch", "train_samples"), [(1, 16), (8, 64), (16, 256)])
def test_algorithm_1_gives_the_split_whose_slower_stage_is_fastest(gen_batch, train_samples):
    got = sharing.decide_split(
        0.5, 0.5, profile=PROFILE, gen_batch=gen_batch, train_samples=train_samples
    )
    assert got.how == sharing.ALGORITHM1
    assert got.quotas["gen"] + got.quotas["learner"] == 100
    prof = sharing.sm_rates(Profile.load(PROFILE), gen_batch, train_samples)
    gen = profile_curve(prof.curve("gen", gen_batch))
    train = profile_curve(prof.curve("train", train_samples))
    best = balance_brute_force(gen, train, 100, 5)
    assert min(gen(got.quotas["gen"]), train(got.quotas["learner"])) == pytest.approx(best.value)
    params = got.params()
    assert params["gpu/split"] == "algorithm1"
    assert params["gpu/gen_sm_pct"] == str(got.quotas["gen"])
    assert params["gpu/split_gen_batch"] == str(gen_batch)


def test_pinned_quotas_win_over_the_profile():
    got = sharing.decide_split(0.5, 0.5, 70, None, profile=PROFILE, gen_batch=1, train_samples=16)
    assert (got.how, got.quotas) == (sharing.PINNED, {"gen": 70, "learner": 50})


def test_without_a_profile_each_role_gets_its_share():
    got = sharing.decide_split(0.5, 0.25)
    assert (got.how, got.quotas) == (sharing.SHARES, {"gen": 50, "learner": 25})


def test_a_gpu_profile_for_roles_that_do_not_share_a_gpu_is_refused():
    over = ["scheduler=ebrl", "gpu=h100", "scheduler.device=cpu", "scale.gen_gpus=1"]
    over += ["scale.learner_gpus=1", f"resources.gpu_profile={PROFILE}"]
    with pytest.raises(ConfigError) as e:
        _refuse_unwired_resources(validate(make_cfg(over), machine=H100))
    assert "resources.gpu_profile=" in str(e.value) and "leave it null" in str(e.value)


def test_a_missing_gpu_profile_is_refused_naming_the_key_and_the_fix(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError) as e:
        _refuse_unwired_resources(
            validate(make_cfg([*G1, f"resources.gpu_profile={missing}"]), machine=H100)
        )
    assert f"resources.gpu_profile={missing}: no such file" in str(e.value)
    assert "ebrl.plan.measure --device cuda" in str(e.value)


def test_a_shipped_gpu_profile_is_taken_under_ebrl():
    _refuse_unwired_resources(validate(make_cfg([*G1, f"resources.gpu_profile={PROFILE}"]), H100))


def planned(r: sharing.SMResplitter) -> tuple[float, float]:
    a = r.allocator.current
    return a.gen_throughput, a.train_throughput


def test_no_re_split_while_the_stages_run_as_planned():
    r = sharing.SMResplitter(PROFILE, 1, 16, threshold=0.15, window=3)
    gen, train = planned(r)
    assert [r.observe(gen, train, step) for step in range(10)] == [None] * 10


def test_a_generator_slower_than_planned_for_a_window_gets_more_sms():
    r = sharing.SMResplitter(PROFILE, 1, 16, threshold=0.15, window=3)
    start = r.quotas
    gen, train = planned(r)
    got = [r.observe(gen * 0.5, train, step) for step in range(3)]
    assert got[:2] == [None, None]  # not before a whole window
    done = got[2]
    assert done is not None and done.stage == "gen" and done.old == start
    assert done.new["gen"] > start["gen"] and done.new["gen"] + done.new["learner"] == 100
    assert r.quotas == done.new and r.history == [done]
    assert "diverged more than 15%" in done.cause


def fake_nvml(monkeypatch, tmp_path, mig: str | None):
    """The fake NVML of tests/test_gpu_fake.py, imported here, showing one H100."""
    import importlib.util

    from .test_gpu_fake import FAKE_NVML

    path = tmp_path / "pynvml.py"
    path.write_text(FAKE_NVML)
    spec = importlib.util.spec_from_file_location("fake_pynvml", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA H100 80GB HBM3")
    if mig is None:
        monkeypatch.delenv("FAKE_NVML_MIG", raising=False)
    else:
        monkeypatch.setenv("FAKE_NVML_MIG", mig)
    return mod


def test_each_role_gets_the_mig_instance_closest_to_its_quota(monkeypatch, tmp_path):
    from ebrl.resources.topology import discover_gpus

    (gpu,) = discover_gpus(fake_nvml(monkeypatch, tmp_path, "16:10,32:20,60:40"))
    assert gpu.mig_enabled and [m.sms for m in gpu.mig_instances] == [16, 32, 60]
    # of 132 SMs: 12%, 24%, 45%
    got = sharing.mig_choice(gpu, [("gen", 15), ("learner", 85)])
    assert {w: m.uuid for w, m in got.items()} == {"learner": "MIG-fake-0-2", "gen": "MIG-fake-0-0"}
    taken: set[str] = set()
    got = sharing.mig_choice(gpu, [("gen", 50), ("learner", 50)], taken)
    assert {w: m.uuid for w, m in got.items()} == {"gen": "MIG-fake-0-2", "learner": "MIG-fake-0-1"}
    assert taken == {"MIG-fake-0-2", "MIG-fake-0-1"}
    assert sharing.mig_choice(gpu, [("gen2", 50), ("gen3", 50)], taken).keys() == {"gen2"}


def test_without_mig_mode_nvml_shows_no_instances(monkeypatch, tmp_path):
    from ebrl.resources.topology import discover_gpus

    (gpu,) = discover_gpus(fake_nvml(monkeypatch, tmp_path, None))
    assert not gpu.mig_enabled and gpu.mig_instances == ()


def test_a_re_split_that_saves_less_than_a_restart_over_the_time_left_is_declined():
    """Once a re-split's cost is known, the same drift near the end of a run (10 s left) is
    worth less than a 4 s restart: the split stays, the profile keeps what was measured, and it
    is said why; with an hour left it is applied."""
    first = sharing.SMResplitter(PROFILE, 1, 16, threshold=0.15, window=3)
    gen, train = planned(first)
    assert [first.observe(gen * 0.5, train, s, left_s=5.0) for s in range(3)][2] is not None
    assert first.restart_s is None  # the first applies whatever is left: its cost is unknown

    for left, applied in ((10.0, False), (3600.0, True)):
        r = sharing.SMResplitter(PROFILE, 1, 16, threshold=0.15, window=3)
        r.applied(4.0)  # a re-split before this one took 4 s from decision to effect
        start = r.quotas
        gen, train = planned(r)
        got = [r.observe(gen * 0.5, train, s, left_s=left) for s in range(3)]
        if applied:
            assert got[2] is not None and r.quotas != start and r.declined == []
            continue
        assert got == [None, None, None] and r.quotas == start
        (no,) = r.declined
        assert no.old == start and no.new["gen"] > start["gen"] and no.restart_s == 4.0
        assert 0 < no.saved_s < 4.0 and no.left_s == 10.0
        assert "less than a generator restart (4.0 s): kept" in no.describe()
        # the profile moved halfway to what was measured: the drift fires a window later on it,
        # and is weighed again (a larger move, a larger saving, still under the restart)
        assert [r.observe(gen * 0.5, train, s, left_s=left) for s in range(3, 6)] == [None] * 3
        assert len(r.declined) == 2 and r.quotas == start
        assert r.declined[1].new["gen"] >= no.new["gen"] and r.declined[1].saved_s >= no.saved_s


def test_the_time_left_a_re_split_is_weighed_against_comes_from_the_runs_budget():
    """The controller's ``Pace``: unknown before the pace is measured (an update budget), the
    minutes left of a minutes budget from the run's start, the least of what each budget
    leaves."""
    from ebrl.resources.meters import Pace

    # started at 100; first report at 100; one update later at 110; two more at 130
    assert Pace({"iterations": 20}, 100.0).seconds_left(4, 400, 100.0) is None  # no pace yet
    pace = Pace({"iterations": 20}, 100.0)
    pace.seconds_left(4, 400, 100.0)
    assert pace.seconds_left(5, 500, 110.0) == pytest.approx(15 * 10.0)
    # 3 updates in 30 s since update 4; 1000 env steps left at 100 a update: 10 updates
    budget = {"iterations": 20, "env_steps": 1700, "minutes": 1}
    pace = Pace(budget, 100.0)
    pace.seconds_left(4, 400, 100.0)
    assert pace.seconds_left(7, 700, 130.0) == pytest.approx(min(13 * 10, 10 * 10, 60 - 30))


def test_the_run_controller_re_splits_the_sms_on_a_drift_and_records_it(tmp_path, monkeypatch):
    """The one run-time controller feeds Algorithm 1 over the SMs each report's capacities
    (from the warm-up on); after a window with the generator at half its planned rate it sends
    the new quotas out, keeps what the fabric says is in force (the learner keeps its cap), and
    records the re-split once: ``gpu_resplits.jsonl``, the ``gpu/*`` metrics, an MLflow param."""
    import time

    from ebrl.resources.allotment import ResourceSettings, initial_resources
    from ebrl.resources.controller import RunController
    from ebrl.resources.topology import fake_topology

    sm = sharing.SMResplitter(PROFILE, 1, 16, threshold=0.15, window=3)
    start = sm.quotas
    topo = fake_topology(numa_nodes=1, cores_per_node=8, gpus=0)
    res = initial_resources(ResourceSettings(), topo, 2, None, max_gen_batch=8)
    c = RunController(res, 16, warmup=2, out_dir=tmp_path)
    sent: list[dict[str, int]] = []

    def requota(new: dict[str, int]) -> dict[str, int]:
        sent.append(new)
        return {"gen": new["gen"], "learner": start["learner"]}

    c.connect(send_quota=requota)
    c.split_sms(sm, start, {"iterations": 100}, time.perf_counter())
    gen, train = planned(sm)
    monkeypatch.setattr(c, "_rates", lambda: (gen * 0.5, gen * 0.5))  # rollout, generator
    outs = [c.report(i, 100 * i, {"resource/train_per_s_update": train}) for i in range(6)]
    # updates 0 and 1 are the warm-up; 2, 3, 4 the window; it fires at 4
    assert [o["gpu/resplits"] for o in outs] == [0, 0, 0, 0, 1, 1]
    (new,) = sent
    assert new["gen"] > start["gen"] and new["gen"] + new["learner"] == 100
    assert outs[3]["gpu/gen_sm_pct"] == start["gen"]
    assert outs[4]["gpu/gen_sm_pct"] == outs[5]["gpu/gen_sm_pct"] == new["gen"]
    assert outs[4]["gpu/train_sm_pct"] == start["learner"]  # in force: the learner's cap kept
    assert outs[4]["gpu/resplit_gen_sm_pct_old"] == start["gen"] and outs[4]["gpu/resplit_s"] >= 0
    rows = [json.loads(ln) for ln in (tmp_path / "gpu_resplits.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["step"] == 4 and rows[0]["stage"] == "gen"
    assert rows[0]["old"] == start and rows[0]["new"] == new
    assert rows[0]["applied"] == {"gen": new["gen"], "learner": start["learner"]}
    params = c.unlogged_params()
    assert list(params) == ["gpu/resplit1"] and "gen drifted" in params["gpu/resplit1"]
    assert c.unlogged_params() == {}  # once


def test_without_a_fabric_to_apply_it_the_controller_does_not_re_split(tmp_path, monkeypatch):
    """Algorithm 1 over the SMs decides only where something puts its quotas in force."""
    import time

    from ebrl.resources.allotment import ResourceSettings, initial_resources
    from ebrl.resources.controller import RunController
    from ebrl.resources.topology import fake_topology

    sm = sharing.SMResplitter(PROFILE, 1, 16, threshold=0.15, window=3)
    topo = fake_topology(numa_nodes=1, cores_per_node=8, gpus=0)
    c = RunController(initial_resources(ResourceSettings(), topo, 2, None, max_gen_batch=8), 16)
    c.split_sms(sm, sm.quotas, None, time.perf_counter())
    gen, train = planned(sm)
    monkeypatch.setattr(c, "_rates", lambda: (gen * 0.5, gen * 0.5))
    outs = [c.report(i, i, {"resource/train_per_s_update": train}) for i in range(6)]
    assert all(not any(k.startswith("gpu/") for k in o) for o in outs) and sm.history == []
