"""Config composition and validation: wrong keys, values and choices fail early, by name."""

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from ebrl.config import ConfigError, validate

from .conftest import make_cfg


def test_default_composes_and_validates():
    run = validate(make_cfg())
    assert run.num_envs == 16 and run.chunk_size == 4
    assert run.decisions_per_env == 50 // 4


@pytest.mark.parametrize(
    "override, words",
    [
        ("simulator.taks=PushCube-v1", "taks"),
        ("num_envz=3", "num_envz"),
        ("num_envs=many", "num_envs"),
        ("simulator=nonexistent", "nonexistent"),
        ("policy.size=XL", "size"),
        ("algo.cfg.gamma=high", "gamma"),
    ],
)
def test_bad_overrides_fail_at_composition(override, words):
    with pytest.raises((ConfigCompositionException, ConfigKeyError, ValidationError)) as e:
        make_cfg([override] if "size" not in override else ["policy=transformer_s", override])
    text = str(e.value) + str(e.value.__cause__ or "")
    assert words in text


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["env_groups=20"], "env_groups=20"),
        (["chunk_size=0"], "chunk_size=0"),
        (["rollout_steps=2", "chunk_size=4"], "rollout_steps=2"),
        (["algo=grpo", "algo.cfg.group_size=3"], "group_size=3"),
        (["simulator=synthetic", "simulator.tail_ratio=0.5"], "tail_ratio"),
    ],
)
def test_bad_values_fail_validation(overrides, words):
    with pytest.raises(ConfigError, match=words):
        validate(make_cfg(overrides))


@pytest.mark.parametrize("choice", ["mlp", "transformer_s", "transformer_m", "transformer_l"])
def test_policy_choices_compose(choice):
    validate(make_cfg([f"policy={choice}"]))
