"""Unknown keys are refused before any work starts, with or without ``+`` (issue #15, item 5).

``+key=value`` lets Hydra add a key to any node, schema or not, and ``OmegaConf.to_object`` keeps
it as a stray attribute of the dataclass: ``+budget.env_step=1000`` used to train on the default
budget. ``validate()`` now compares the composed tree with each node's schema and names the key,
the closest valid one and the fix; without ``+``, Hydra refuses the key at composition.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf, open_dict

from ebrl.config import ConfigError, check_unknown_keys, validate
from ebrl.hardware import MachineFacts
from ebrl.launch.cli import main
from ebrl.train import CONF_DIR

from .conftest import make_cfg

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
CPU_MACHINE = MachineFacts(where="a 2-core CPU machine", cpus=2)
FIX = "drop the '+'"


def _refused(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        validate(make_cfg(overrides), machine=CPU_MACHINE)
    return str(e.value)


def test_the_issue_typo_is_refused_with_the_right_key():
    msg = _refused(["+budget.env_step=1000"])
    assert "unknown key budget.env_step:" in msg
    assert "did you mean budget.env_steps?" in msg
    assert FIX in msg


@pytest.mark.parametrize(
    "overrides, key, suggestion",
    [
        # top level
        (["+num_env=3"], "num_env", "did you mean num_envs?"),
        (["+foo=1"], "foo", "the top level has simulator, policy"),
        (["+schedular=ebrl"], "schedular", "did you mean scheduler=ebrl?"),
        # plain sub-configs
        (["+budget.iteration=3"], "budget.iteration", "budget.iterations"),
        (["++budget.env_step=3"], "budget.env_step", "budget.env_steps"),
        (["+tracking.experment=x"], "tracking.experment", "tracking.experiment"),
        (["+budget.extra.deep=1"], "budget.extra", "budget has env_steps, minutes, iterations"),
        (["+gpu.nme=h100"], "gpu.nme", "gpu.name"),
        (["+resources.sim_core=2"], "resources.sim_core", "resources.sim_cores"),
        (["+launcher.partiton=gpu"], "launcher.partiton", "launcher.partition"),
        # group nodes, under several options
        (["scheduler=ebrl", "+scheduler.stalenes=2"], "scheduler.stalenes", "scheduler.staleness"),
        (["scheduler=async", "+scheduler.stalenes=2"], "scheduler.stalenes", "scheduler.staleness"),
        (["scheduler=sync", "+scheduler.stalenes=2"], "scheduler.stalenes", "scheduler=ebrl"),
        (["+policy.hiden=3"], "policy.hiden", "did you mean policy.hidden?"),
        (["policy=transformer_s", "+policy.sise=M"], "policy.sise", "policy.size"),
        (["+algo.cfg.gama=0.9"], "algo.cfg.gama", "did you mean algo.cfg.gamma?"),
        (["algo=grpo", "+algo.cfg.group_sise=4"], "algo.cfg.group_sise", "algo.cfg.group_size"),
        (["+algo.cgf.gamma=0.9"], "algo.cgf", "did you mean algo.cfg?"),
        (["+simulator.taks=x"], "simulator.taks", "did you mean simulator.task?"),
        (["simulator=synthetic", "+simulator.step_cost=1"], "simulator.step_cost", "step_cost_ms"),
        (["simulator=counting", "+simulator.obs_dims=3"], "simulator.obs_dims", "obs_dim"),
    ],
)
def test_plus_unknown_key_is_refused(overrides, key, suggestion):
    msg = _refused(overrides)
    assert f"unknown key {key}:" in msg
    assert suggestion in msg and FIX in msg


def test_a_sync_scheduler_key_names_the_options_that_have_it():
    msg = _refused(["scheduler=sync", "+scheduler.stalenes=2"])
    assert "SyncSchedulerNode (scheduler=sync) has no such key" in msg
    assert "scheduler.staleness is a key of scheduler=async, scheduler=ebrl" in msg


def test_every_unknown_key_is_named_at_once():
    msg = _refused(["+budget.env_step=1", "+policy.hiden=3", "+scheduler.x=1"])
    for key in ("budget.env_step", "policy.hiden", "scheduler.x"):
        assert f"unknown key {key}" in msg


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["budget.env_step=1000"], "budget.env_step"),
        (["num_env=3"], "num_env"),
        (["schedular=ebrl"], "schedular"),
        (["scheduler=ebrl", "scheduler.stalenes=2"], "scheduler.stalenes"),
        (["scheduler=sync", "scheduler.staleness=2"], "scheduler.staleness"),
        (["policy.hiden=3"], "policy.hiden"),
        (["algo.cfg.gama=0.9"], "algo.cfg.gama"),
        (["simulator.taks=x"], "simulator.taks"),
    ],
)
def test_without_plus_hydra_refuses_at_composition(overrides, words):
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg(overrides)
    text = str(e.value) + str(e.value.__cause__ or "")
    assert f"Could not override '{words}'" in text and "not in" in text


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["scheduler=ebrll"], "Available options in 'scheduler'"),
        (["+schedular=ebrl", "scheduler=ebrll"], "Available options in 'scheduler'"),
        (["scheduler=ebrl", "scheduler.backend=rayy"], "expected one of [ray, inprocess]"),
        (["simulator=synthetic", "simulator.cost_mode=bunr"], "expected one of [burn, sleep]"),
    ],
)
def test_misspelt_choices_and_option_values_name_the_choices(overrides, words):
    with pytest.raises(Exception) as e:  # Hydra's MissingConfigException, composition errors
        make_cfg(overrides)
    assert words in str(e.value) + str(e.value.__cause__ or "")


def test_free_form_nodes_take_any_key():
    """``scheduler.resources`` (dict), ``scheduler.overrides`` (dict[str, Any]): not checked."""
    cfg = make_cfg(["scheduler=ebrl"])
    cfg.scheduler.resources = {"sim": {"CPU": 1.0}}  # (OmegaConf cannot merge into its None)
    OmegaConf.update(cfg, "scheduler.resources.gen", {"anything": 2.0}, force_add=True)  # a '+'
    run = validate(cfg, machine=CPU_MACHINE)
    assert run.scheduler.resources == {"sim": {"CPU": 1.0}, "gen": {"anything": 2.0}}
    # real RLinf cannot be built here (its __post_init__ refuses); the key check alone passes
    check_unknown_keys(make_cfg(["scheduler=rlinf_hybrid", "+scheduler.overrides.a.b.c=1"]))


def test_the_hydra_node_is_left_to_hydra():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(config_name="config", return_hydra_config=True)
    assert "hydra" in cfg
    check_unknown_keys(cfg)


def test_stray_key_added_in_code_is_refused_too():
    cfg = make_cfg()
    with open_dict(cfg.budget):
        cfg.budget.env_step = 1000
    with pytest.raises(ConfigError, match=r"did you mean budget\.env_steps\?"):
        validate(cfg, machine=CPU_MACHINE)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["budget.env_steps=1000", "budget.iterations=3", "budget.minutes=1.5"],
        ["scheduler=ebrl", "scheduler.staleness=2", "scheduler.backend=inprocess"],
        ["scheduler=async", "scheduler.staleness=2"],
        ["scheduler=colocated", "scheduler.threads=1"],
        ["scheduler=hybrid", "scheduler.train_threads=1"],
        ["policy.hidden=3", "policy.layers=1"],
        ["policy=transformer_s", "policy.size=M"],
        ["algo.cfg.gamma=0.9", "algo.cfg.update_epochs=1"],
        ["algo=grpo", "algo.cfg.group_size=4"],
        ["simulator.task=PickCube-v1", "simulator=pushcube"],
        ["simulator=synthetic", "simulator.step_cost_ms=0.5"],
        ["simulator=counting", "simulator.obs_dim=3"],
        ["resources=elastic", "launcher=submitit_local", "tracking.enabled=false"],
        ["+experiment=embedded"],
        ["+sweep=smoke"],
        ["+sweep=ablation", "+axis/ablation=full"],
        ["+run_dir=/tmp/x", "++budget.env_steps=5"],  # '+' on a key the schema has: allowed
    ],
)
def test_valid_overrides_still_pass(overrides):
    validate(make_cfg(overrides), machine=CPU_MACHINE)


def _all_options() -> list[str]:
    return [
        f"{'+' if p.parent.parent.name == 'axis' else ''}{p.parent.relative_to(CONF)}={p.stem}"
        for p in sorted(CONF.glob("*/**/*.yaml"))
        if p.parent.name not in ("experiment", "sweep")  # test_compose_all composes those
    ]


@pytest.mark.parametrize("option", _all_options())
def test_every_conf_option_sets_only_schema_keys(option):
    """Each yaml in conf/ composes and sets only keys its schema has (GPU options, real RLinf
    cannot be validated on this machine: only the key check runs on every option)."""
    check_unknown_keys(make_cfg([option]))


def test_launch_dry_run_refuses_the_typo(capsys):
    assert main(["--dry-run", "smoke", "+budget.env_step=1"]) == 1
    out = capsys.readouterr().out
    assert "unknown key budget.env_step: did you mean budget.env_steps?" in out


def test_train_refuses_the_typo_before_any_work(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ebrl.train",
            "+budget.env_step=1000",
            "tracking.enabled=false",
            f"run_dir={run_dir}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "unknown key budget.env_step: did you mean budget.env_steps?" in out, out[-2000:]
    assert FIX in out
    # no training happened: no run folder contents, no metrics anywhere under tmp_path
    assert not run_dir.exists() or not any(run_dir.iterdir())
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(("metrics", "summary"))]
