"""SFT before RL: chunk targets, behaviour cloning, and ``init_checkpoint``, a fresh run that
starts from given policy weights under every scheduler (``python -m ebrl.train``).

The LIBERO expert itself is in ``tests/test_sft_libero.py`` (slow: it builds LIBERO tasks).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from ebrl.config import ConfigError, validate
from ebrl.sft.bc import CloneConfig, chunk_targets, clone
from ebrl.sft.checkpoint import load_init_weights, save_init_checkpoint
from ebrl.stages.factory import StageFactory

from .conftest import TINY, make_cfg

ROOT = Path(__file__).resolve().parents[1]


# --- chunk targets ----------------------------------------------------------------------------
def test_a_chunk_is_the_next_k_actions_of_its_episode_its_last_repeated_past_the_end():
    actions = np.arange(5, dtype=np.float32)[:, None]  # [5, 1]: steps 0..4
    episode = np.array([7, 7, 7, 3, 3])  # two episodes: rows 0-2 and 3-4
    chunks = chunk_targets(actions, episode, k=3)[..., 0]  # [5, 3]
    assert chunks.tolist() == [[0, 1, 2], [1, 2, 2], [2, 2, 2], [3, 4, 4], [4, 4, 4]]


def test_an_episode_split_in_two_runs_of_rows_is_refused():
    with pytest.raises(ValueError, match="not contiguous"):
        chunk_targets(np.zeros((3, 1)), np.array([0, 1, 0]), k=2)


# --- cloning ----------------------------------------------------------------------------------
def _tiny(extra=(), tmp_path=None):
    return make_cfg([*TINY, *extra], tmp_path)


def _policy(cfg):
    factory = StageFactory.from_config(cfg)
    spec = factory.make_env(0).spec
    return factory.with_spec(spec).policy()


def _demos(policy, n=256, seed=0):
    """Observations and a smooth chunk target the tiny MLP can fit."""
    rng = np.random.default_rng(seed)
    obs = rng.uniform(-1, 1, (n, policy.spec.obs_dim)).astype(np.float32)
    k, a = policy.spec.chunk_size, policy.spec.action_dim
    w = rng.uniform(-0.5, 0.5, (policy.spec.obs_dim, k * a)).astype(np.float32)
    return obs, np.tanh(obs @ w).reshape(n, k, a)


def test_cloning_fits_the_chunk_mean_and_sets_the_log_std_to_the_residual():
    policy = _policy(_tiny())
    obs, chunks = _demos(policy)
    before = float(
        ((policy.dist(torch.from_numpy(obs)).mean.detach() - torch.from_numpy(chunks)) ** 2).mean()
    )
    m = clone(policy, obs, chunks, CloneConfig(epochs=60, batch_size=64, lr=3e-3, min_std=1e-3))
    assert m["bc/mse"] < 0.2 * before and m["bc/mse"] < m["bc/mse_first"]
    with torch.no_grad():
        resid = policy.dist(torch.from_numpy(obs)).mean - torch.from_numpy(chunks)
    rms = resid.pow(2).mean(0).sqrt().clamp(1e-3, 0.5)  # [K, A]
    assert torch.allclose(policy.log_std.exp(), rms, rtol=1e-4)
    assert policy.version == 0


def test_the_log_std_is_clipped_to_the_bounds():
    policy = _policy(_tiny())
    obs, chunks = _demos(policy)
    clone(policy, obs, chunks, CloneConfig(epochs=1, min_std=0.3, max_std=0.4))
    std = policy.log_std.exp()
    assert bool(((std >= 0.3 - 1e-6) & (std <= 0.4 + 1e-6)).all())


def test_demonstrations_of_another_shape_are_refused_with_the_fix():
    policy = _policy(_tiny())
    obs, chunks = _demos(policy)
    with pytest.raises(ValueError, match="same simulator settings and chunk_size"):
        clone(policy, obs, chunks[:, :1], CloneConfig(epochs=1))


# --- init_checkpoint: loading and its errors --------------------------------------------------
def test_a_missing_init_checkpoint_is_refused_by_validate_with_the_fix(tmp_path):
    cfg = _tiny([f"init_checkpoint={tmp_path / 'nope.pt'}"], tmp_path)
    with pytest.raises(ConfigError, match=r"init_checkpoint=.*nope\.pt: no such file.*null"):
        validate(cfg)


def test_init_checkpoint_is_a_key_of_the_run_config_null_by_default(tmp_path):
    assert validate(_tiny((), tmp_path)).init_checkpoint is None


def test_a_checkpoint_of_another_policy_shape_is_refused_naming_the_parameters(tmp_path):
    policy = _policy(_tiny())  # chunk_size=2
    path = save_init_checkpoint(tmp_path / "bc.pt", policy, {"chunk_size": 2})
    other = _policy(_tiny(["chunk_size=4", "rollout_steps=8"]))
    with pytest.raises(ValueError, match=r"does not fit .*chunk_size=4.*log_std: file \(2, 2\)"):
        load_init_weights(other, path)


def test_a_file_without_policy_weights_is_refused(tmp_path):
    torch.save({"weights": {}}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match="not an ebrl policy file"):
        load_init_weights(_policy(_tiny()), tmp_path / "x.pt")


def test_the_factory_builds_every_stage_from_the_init_weights_at_version_0(tmp_path):
    policy = _policy(_tiny())
    obs, chunks = _demos(policy)
    clone(policy, obs, chunks, CloneConfig(epochs=2))
    path = save_init_checkpoint(tmp_path / "bc.pt", policy, {})
    factory = StageFactory.from_config(_tiny([f"init_checkpoint={path}"]))
    factory = factory.with_spec(factory.make_env(0).spec)
    gen, learner = factory.gen(), factory.train()
    for built in (gen.policy, learner.algo.policy):
        assert built.version == 0
        for k, v in policy.state_dict().items():
            assert torch.equal(built.state_dict()[k], v), k


def test_init_std_scale_narrows_the_clones_gaussian_in_every_stage_and_nothing_else(tmp_path):
    policy = _policy(_tiny())
    path = save_init_checkpoint(tmp_path / "bc.pt", policy, {})
    factory = StageFactory.from_config(_tiny([f"init_checkpoint={path}", "init_std_scale=0.25"]))
    factory = factory.with_spec(factory.make_env(0).spec)
    for built in (factory.gen().policy, factory.train().algo.policy):
        for k, v in policy.state_dict().items():
            if k == "log_std":  # std x 0.25
                assert torch.allclose(built.log_std.exp(), v.exp() * 0.25), k
            else:
                assert torch.equal(built.state_dict()[k], v), k


@pytest.mark.parametrize("bad", ["0", "-0.5"])
def test_a_bad_init_std_scale_is_refused_naming_the_key(tmp_path, bad):
    with pytest.raises(ConfigError, match=rf"init_std_scale={bad}.*> 0"):
        validate(_tiny([f"init_std_scale={bad}"], tmp_path))


def test_init_std_scale_narrows_a_fresh_policy_too(tmp_path):
    one = StageFactory.from_config(_tiny())
    one = one.with_spec(one.make_env(0).spec)
    half = StageFactory.from_config(_tiny(["init_std_scale=0.5"]))
    half = half.with_spec(half.make_env(0).spec)
    assert torch.allclose(half.policy().log_std.exp(), one.policy().log_std.exp() * 0.5)


# --- init_checkpoint through python -m ebrl.train ---------------------------------------------
def _bc_checkpoint(tmp_path: Path) -> tuple[Path, dict[str, torch.Tensor]]:
    policy = _policy(_tiny())
    obs, chunks = _demos(policy)
    clone(policy, obs, chunks, CloneConfig(epochs=5))
    path = save_init_checkpoint(tmp_path / "bc.pt", policy, {"what": "test"})
    return path, {k: v.clone() for k, v in policy.state_dict().items()}


def _train(tmp_path: Path, name: str, extra: list[str]) -> Path:
    run = tmp_path / name
    over = [o for o in TINY if not o.startswith("budget.iterations")]
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *over,
        "budget.iterations=2",
        # lr 0: the learner's weights stay what the run started from, so the final checkpoint
        # shows them, and a generator acting with other weights shows in the ratio (approx_kl)
        "algo.cfg.lr=0",
        f"run_dir={run}",
        f"tracking.store={tmp_path / 'mlflow'}",
        *extra,
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return run


SCHEDULERS = {
    "sync": ["scheduler=sync"],
    "ebrl": ["scheduler=ebrl", "scheduler.backend=inprocess", "scheduler.staleness=1"],
}
SLOW_SCHEDULERS = {
    "colocated": ["scheduler=colocated"],
    "hybrid": ["scheduler=hybrid", "scheduler.backend=inprocess"],
    "async": ["scheduler=async", "scheduler.backend=inprocess"],
    "ebrl-ray": ["scheduler=ebrl", "scheduler.backend=ray"],
}


def _starts_from(tmp_path: Path, name: str, extra: list[str]) -> None:
    path, weights = _bc_checkpoint(tmp_path)
    run = _train(tmp_path, name, [*extra, f"init_checkpoint={path}"])
    ckpt = torch.load(run / "checkpoint.pt", weights_only=True)
    assert ckpt["version"] == 2  # a fresh run: two updates of its own, from version 0
    for k, v in weights.items():
        assert torch.equal(ckpt["policy"][k], v), k
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # the generator acted with the same weights as the learner scored with: ratio 1
    assert max(abs(r["train/approx_kl"]) for r in rows) < 1e-5, rows
    # and without the key the run starts elsewhere (the test above can fail)
    fresh = torch.load(_train(tmp_path, name + "-fresh", extra) / "checkpoint.pt")
    assert not torch.equal(fresh["policy"]["log_std"], weights["log_std"])


@pytest.mark.slow  # two runs of python -m ebrl.train each: ~30 s idle, minutes on a loaded machine
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_a_run_starts_from_the_cloned_weights(tmp_path, name):
    _starts_from(tmp_path, name, SCHEDULERS[name])


@pytest.mark.slow  # the other schedulers, and EBRL on Ray
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", sorted(SLOW_SCHEDULERS))
def test_a_run_starts_from_the_cloned_weights_under_every_scheduler(tmp_path, name):
    _starts_from(tmp_path, name, SLOW_SCHEDULERS[name])


@pytest.mark.slow  # a run of python -m ebrl.train
def test_a_checkpoint_that_does_not_fit_stops_the_run_with_the_fix(tmp_path):
    path, _ = _bc_checkpoint(tmp_path)  # chunk_size=2
    run = tmp_path / "bad"
    over = [o for o in TINY if not o.startswith("chunk_size")]
    cmd = [
        sys.executable,
        "-m",
        "ebrl.train",
        *over,
        "chunk_size=4",
        f"run_dir={run}",
        f"tracking.store={tmp_path / 'mlflow'}",
        f"init_checkpoint={path}",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "does not fit this run's policy" in done.stderr, done.stderr[-3000:]


def test_meta_from_a_structured_config_is_stored_as_plain_values_that_load(tmp_path):
    """The meta of ``clone`` holds the simulator's config node, whose values include enums
    (``ebrl.config.LiberoSuite``); torch's weights-only loader refuses such globals."""
    from ebrl.config import LiberoSuite

    policy = _policy(_tiny())
    path = save_init_checkpoint(tmp_path / "bc.pt", policy, {"task": LiberoSuite("libero_object")})
    assert load_init_weights(_policy(_tiny()), path) == {"task": "libero_object"}
