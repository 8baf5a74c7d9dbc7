"""Each config node documents its keys and checks its own values.

Every key of every node has a one-line doc that ``python -m ebrl.train --help`` shows, per group,
for the options the command composes; a node's value checks run when the node is built (its
``__post_init__``), so :func:`ebrl.config.validate` refuses a bad value in the node's words,
and the checks left in :mod:`ebrl.config.checks` are those that span components.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from ebrl.algos.grpo import GRPOConfig
from ebrl.algos.ppo import PPOConfig
from ebrl.config import (
    ConfigError,
    LauncherNode,
    PolicyReads,
    ResourcesNode,
    RunConfig,
    SyntheticSim,
    register,
    schemas,
    validate,
)
from ebrl.config.help import GROUPS, field_docs, help_text

from .conftest import make_cfg

ROOT = Path(__file__).resolve().parents[1]


def _all_nodes() -> set[type]:
    register()
    nodes = {schema for _, _, schema in schemas()} | {RunConfig, PolicyReads}
    nodes |= {PPOConfig, GRPOConfig}
    nodes |= {t for t in typing.get_type_hints(RunConfig).values() if dataclasses.is_dataclass(t)}
    return nodes


def test_every_key_of_every_node_has_a_doc():
    undocumented = [
        f"{node.__module__}.{node.__name__}.{key}"
        for node in _all_nodes()
        for key, doc in field_docs(node).items()
        if key != "_target_" and not doc.strip()
    ]
    assert undocumented == []


def test_the_help_shows_each_group_with_its_keys_and_docs():
    text = help_text(make_cfg(["scheduler=ebrl", "simulator=libero"]))
    for group in (*GROUPS, "run", "budget", "eval", "scale"):
        assert f"\n{group} (" in f"\n{text}", group
    # a hand-written node's `#:` doc, a derived node's Args: doc, a nested node's docstring
    assert "simulator.task_id=all" in text
    assert "a task's index in the suite" in text
    assert "scheduler.sim_workers=${scale.sim_workers}" in text
    assert "algo.cfg.gamma=0.8" in text and "Per-step discount" in text
    assert "budget.env_steps=200000" in text and "stop after training on this many" in text


def test_the_help_follows_the_options_given():
    sync = help_text(make_cfg(["scheduler=sync"]))
    assert "scheduler (SyncSchedulerNode)" in sync and "scheduler.sim_workers=" not in sync


def test_python_m_ebrl_train_help_shows_the_keys():
    proc = subprocess.run(
        [sys.executable, "-m", "ebrl.train", "scheduler=ebrl", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "== Config groups (group=option) ==" in out and "scheduler: async" in out
    assert "== Keys (key=value), per group, with this command's options ==" in out
    assert "scheduler (EBRLSchedulerNode)" in out
    assert "resources.gen_threads=${threads.gen}" in out  # `$` survives Hydra's template
    assert "launcher.time_min=60" in out and "wall-clock limit of one job, minutes" in out


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: ResourcesNode(gen_threads=0), "resources.*_threads must be >= 1"),
        (lambda: ResourcesNode(gen_sm_pct=150), "resources.gen_sm_pct=150: must be 1..100"),
        (lambda: LauncherNode(time_min=0), "launcher.time_min=0: must be >= 1 minute"),
        (lambda: SyntheticSim(tail_ratio=0.5), "simulator.tail_ratio (P99/mean) must be >= 1"),
        (lambda: RunConfig(num_envs=4, env_groups=8), "env_groups=8: must be between 1 and"),
    ],
)
def test_a_node_checks_its_own_values_when_built(build, message):
    with pytest.raises(ConfigError) as e:
        build()
    assert str(e.value).startswith(message)


@pytest.mark.parametrize(
    "override, message",
    [
        ("resources.gen_threads=0", "resources.*_threads must be >= 1"),
        ("launcher.max_requeues=-1", "launcher.max_requeues must be >= 0"),
        ("eval.curve_episodes=0", "eval.curve_episodes=0: a curve needs at least 1 episode"),
    ],
)
def test_validate_refuses_a_nodes_bad_value_in_the_nodes_words(override, message):
    more = ["eval.every_iters=1"] if override.startswith("eval.") else []
    with pytest.raises(ConfigError) as e:
        validate(make_cfg([override, *more]))
    assert str(e.value).startswith(message)  # no wrapper around it
