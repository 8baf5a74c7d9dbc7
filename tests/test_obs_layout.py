"""The simulator's declaration of its observation's parts (ebrl.envs.layout)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ebrl.envs.fake import CountingEnv
from ebrl.envs.layout import ObsField, ObsLayout


def test_a_simulator_that_declares_nothing_is_one_state():
    env = CountingEnv(0, obs_dim=6)
    layout = env.spec.obs_layout()
    assert env.spec.layout is None and layout.names() == ["states"] and layout.size("states") == 6
    obs = torch.arange(12.0).reshape(2, 6)
    torch.testing.assert_close(layout.view(obs, "states"), obs)
    assert layout.instructions_of(obs) == ["", ""]


def test_views_give_the_state_uint8_pixels_and_each_rows_instruction():
    envs = [CountingEnv(e, obs_dim=5, tasks=3, camera_size=2) for e in range(4)]
    layout = envs[0].spec.obs_layout()
    assert envs[0].spec.obs_dim == 5 + 3 + 2 * 2 * 3
    assert layout.names() == ["states", "task", "main_images"]
    obs = torch.from_numpy(np.stack([env.reset(0) for env in envs]))
    assert layout.view(obs, "states")[:, 0].tolist() == [0, 1, 2, 3]
    assert layout.view(obs, "task").tolist() == [0, 1, 2, 0]
    pixels = layout.view(obs, "main_images")
    assert pixels.dtype == torch.uint8 and pixels.shape == (4, 2, 2, 3)
    assert pixels[:, 1, 1, 2].tolist() == [0, 16, 32, 48]  # 16 * env id at step 0
    assert layout.instructions_of(obs) == [f"count task {e % 3}" for e in range(4)]
    envs[1].step(np.zeros(2))
    after = torch.from_numpy(envs[1].step(np.zeros(2)).obs)[None]
    assert layout.view(after, "main_images").unique().tolist() == [18]  # step 2
    with pytest.raises(KeyError, match=r"no field 'wrist_images'.*\['states', 'task'"):
        layout.view(obs, "wrist_images")


@pytest.mark.parametrize(
    ("fields", "instructions", "error"),
    [
        ((ObsField("states", 0, (4,)), ObsField("x", 3, (2,))), (), "'states' and 'x' overlap"),
        ((ObsField("states", 0, (9,)),), (), r"spans \[0, 9\), outside the observation's 6"),
        ((ObsField("img", 0, (2, 3), "image"),), (), "not \\[H, W, C\\]"),
        ((ObsField("s", 0, (1,), "bytes"),), (), "kind 'bytes'"),
        ((ObsField("s", 0, (1,)), ObsField("s", 1, (1,))), (), "appears twice"),
        ((ObsField("task", 0, (3,), "onehot"),), ("a", "b"), "one-hot over the 2 instructions"),
        ((ObsField("states", 0, (6,)),), ("a", "b"), "2 instructions but no 'task'"),
    ],
)
def test_a_layout_that_does_not_fit_its_vector_is_refused_naming_the_field(
    fields, instructions, error
):
    with pytest.raises(ValueError, match=error):
        ObsLayout(fields, instructions).check(6)


def test_one_instruction_is_every_envs():
    layout = ObsLayout.flat(3, "pick up the cube").check(3)
    assert layout.instructions_of(torch.zeros(2, 3)) == ["pick up the cube"] * 2
