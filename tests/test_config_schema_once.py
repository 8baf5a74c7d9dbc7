"""Scheduler settings are declared once, in the scheduler classes (issue: config schema once).

A scheduler's config node is derived from its dataclass (``ebrl.config.schema_of``): a field added
to the class is a key of its node, with its type, default, help (the docstring's ``Args:``) and
value checks (``__post_init__``). The baselines register their nodes through the
``ebrl.schedulers`` entry point, so ``ebrl.config`` imports nothing of ``baselines/``. The run
folder and whether the resource manager applies come to the scheduler in ``RunContext``.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import pickle
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from omegaconf.errors import ValidationError

from ebrl.config import (
    BackendKind,
    ConfigError,
    class_of,
    docstring_args,
    schema_of,
    schemas,
    validate,
)
from ebrl.hardware import MachineFacts
from ebrl.resources.topology import Topology, discover_cores
from ebrl.schedulers.base import IterationReport, RunContext
from ebrl.schedulers.ebrl import EBRLScheduler, control
from ebrl.schedulers.sync import SyncScheduler
from ebrl.stages.factory import StageFactory
from ebrl.timeline import Timeline

from .conftest import TINY, make_cfg

ROOT = Path(__file__).resolve().parents[1]
CPU_MACHINE = MachineFacts(where="a 2-core CPU machine", cpus=2)
FIX = "drop the '+'"


# --- a throwaway scheduler: what a field added to a class does -------------------------------
class Mode(StrEnum):
    fast = "fast"
    slow = "slow"


@dataclass
class ToyScheduler:
    """A scheduler for this test only.

    Args:
        workers: worker processes.
        mode: ``fast`` or ``slow``.
        limit: an upper bound
            (None: none).
        table: free-form per-role settings.
    """

    workers: int = 2
    mode: str = "fast"
    limit: float | None = None
    table: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"scheduler.workers={self.workers}: must be >= 1")


@dataclass
class ToySchedulerPlus(ToyScheduler):
    """The same, one field later.

    Args:
        replicas: generator replicas.
    """

    replicas: int = 1
    shape: tuple[int, ...] = (1, 2)  # a type OmegaConf cannot hold: the node takes it as Any


def test_the_node_is_the_classs_fields_types_defaults_and_help():
    node = schema_of(ToyScheduler, "tests.ToyScheduler", choices={"mode": Mode})
    assert node.__name__ == "ToySchedulerNode" and class_of(node) is ToyScheduler
    got = {f.name: f for f in dataclasses.fields(node)}
    assert list(got) == ["_target_", "workers", "mode", "limit", "table"]
    assert got["_target_"].default == "tests.ToyScheduler"
    assert got["workers"].type is int and got["workers"].default == 2
    assert got["mode"].type is Mode and got["mode"].default is Mode.fast
    assert got["table"].default_factory() == {}
    assert got["limit"].metadata["help"] == "an upper bound (None: none)."
    assert got["workers"].metadata["help"] == "worker processes."
    # the same derivation twice is the same class (isinstance checks, pickled configs)
    assert schema_of(ToyScheduler, "tests.ToyScheduler", choices={"mode": Mode}) is node


def test_a_field_added_to_the_class_is_a_key_of_its_node():
    node = schema_of(ToySchedulerPlus, "tests.ToySchedulerPlus")
    cfg = OmegaConf.structured(node)
    assert {"replicas", "shape", "workers", "mode", "limit", "table"} <= set(cfg)
    assert cfg.replicas == 1 and list(cfg.shape) == [1, 2]
    assert docstring_args(ToySchedulerPlus)["replicas"] == "generator replicas."
    assert docstring_args(ToySchedulerPlus)["workers"] == "worker processes."  # the base's
    cfg.replicas = 3
    with pytest.raises(ValidationError):  # typed: OmegaConf refuses a wrong type, by key
        cfg.replicas = "three"


def test_the_classs_own_checks_run_when_the_node_is_built():
    node = schema_of(ToyScheduler, "tests.ToyScheduler")
    cfg = OmegaConf.structured(node)
    cfg.workers = 0
    with pytest.raises(ValueError, match=r"scheduler\.workers=0: must be >= 1"):
        OmegaConf.to_object(cfg)
    assert OmegaConf.to_object(OmegaConf.structured(node)).workers == 2


@pytest.mark.parametrize(
    "option, cls_path",
    [
        ("ebrl", "ebrl.schedulers.ebrl.EBRLScheduler"),
        ("sync", "ebrl.schedulers.sync.SyncScheduler"),
        ("colocated", "baselines.colocated.ColocatedScheduler"),
        ("hybrid", "baselines.hybrid.HybridScheduler"),
        ("async", "baselines.async_ppo.AsyncScheduler"),
        ("rlinf_async", "baselines.rlinf.launch.RLinfScheduler"),
    ],
)
def test_every_scheduler_option_has_exactly_its_classs_fields(option, cls_path):
    """Whatever fields a scheduler class has now (new ones included) are its option's keys."""
    import importlib

    module, name = cls_path.rsplit(".", 1)
    cls = getattr(importlib.import_module(module), name)
    cfg = make_cfg([f"scheduler={option}"])
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    assert set(cfg.scheduler) == {"_target_", *fields}
    node = cfg.scheduler._metadata.object_type
    assert class_of(node) is cls
    undocumented = [f.name for f in dataclasses.fields(node) if not f.metadata.get("help")]
    assert not undocumented, f"{cls.__name__}'s docstring (Args:) does not document {undocumented}"


def test_real_rlinfs_colocated_and_hybrid_nodes_leave_out_staleness():
    assert "staleness" not in make_cfg(["scheduler=rlinf_hybrid"]).scheduler
    assert make_cfg(["scheduler=rlinf_async"]).scheduler.staleness == 1


# --- misspelt keys, bad values -----------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, key, suggestion",
    [
        (
            ["scheduler=ebrl", "+scheduler.hang_timeout=3"],
            "scheduler.hang_timeout",
            "hang_timeout_s",
        ),
        (["scheduler=ebrl", "+scheduler.max_restart=1"], "scheduler.max_restart", "max_restarts"),
        (
            ["scheduler=hybrid", "+scheduler.train_thread=1"],
            "scheduler.train_thread",
            "train_threads",
        ),
        (["scheduler=colocated", "+scheduler.ofload=false"], "scheduler.ofload", "offload"),
    ],
)
def test_a_misspelt_scheduler_key_with_plus_is_refused_naming_the_fix(overrides, key, suggestion):
    with pytest.raises(ConfigError) as e:
        validate(make_cfg(overrides), machine=CPU_MACHINE)
    msg = str(e.value)
    assert f"unknown key {key}: did you mean scheduler.{suggestion}?" in msg
    assert FIX in msg


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["scheduler=ebrl", "scheduler.hang_timeout=3"], "scheduler.hang_timeout"),
        (["scheduler=hybrid", "scheduler.train_thread=1"], "scheduler.train_thread"),
        (["scheduler=async", "scheduler.stalenes=2"], "scheduler.stalenes"),
    ],
)
def test_a_misspelt_scheduler_key_without_plus_is_refused_at_composition(overrides, key):
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg(overrides)
    text = str(e.value) + str(e.value.__cause__ or "")
    assert f"Could not override '{key}'" in text and "not in" in text


@pytest.mark.parametrize("option", ["ebrl", "hybrid", "async"])
def test_a_backend_outside_the_choices_is_refused_listing_them(option):
    with pytest.raises(ConfigCompositionException) as e:
        make_cfg([f"scheduler={option}", "scheduler.backend=rayy"])
    assert "expected one of [ray, inprocess]" in str(e.value) + str(e.value.__cause__ or "")


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["scheduler=ebrl", "scheduler.staleness=9"], "scheduler.staleness=9"),
        (["scheduler=ebrl", "scheduler.max_restarts=-1"], "scheduler.max_restarts=-1"),
        (["scheduler=ebrl", "scheduler.rebind=true", "scheduler.step_level=false"], "rebind"),
        (["scheduler=ebrl", "scheduler.sim_workers=99"], "scheduler.sim_workers=99"),
        (["scheduler=colocated", "scheduler.threads=0"], "scheduler.threads=0"),
        (["scheduler=hybrid", "scheduler.train_threads=0"], "scheduler.train_threads=0"),
        (["scheduler=async", "scheduler.staleness=3"], "scheduler.staleness=3"),
    ],
)
def test_a_bad_value_is_refused_by_validate_naming_the_key(overrides, words):
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        validate(make_cfg(overrides), machine=CPU_MACHINE)


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["scheduler=ebrl"],
        ["scheduler=ebrl", "scheduler.backend=inprocess", "scheduler.staleness=2"],
        ["scheduler=colocated"],
        ["scheduler=hybrid"],
        ["scheduler=async"],
    ],
)
def test_the_composed_configs_still_validate(overrides):
    run = validate(make_cfg(overrides), machine=CPU_MACHINE)
    assert class_of(run.scheduler) is not None
    if "scheduler=ebrl" in overrides:
        assert run.scheduler.backend in (BackendKind.ray, BackendKind.inprocess)


def test_a_composed_config_with_a_baseline_node_pickles():
    """A launcher (submitit) pickles the composed config; its nodes' classes must be importable."""
    for option in ("ebrl", "hybrid", "rlinf_async"):
        cfg = make_cfg([f"scheduler={option}"])
        back = pickle.loads(pickle.dumps(cfg))
        assert back.scheduler._metadata.object_type is cfg.scheduler._metadata.object_type


# --- the baselines register themselves ---------------------------------------------------------
def test_ebrl_does_not_import_baselines():
    """No module of ebrl/ imports baselines (documentation may name it)."""
    offenders = []
    for path in sorted((ROOT / "ebrl").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            offenders += [
                f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] == "baselines"
            ]
    assert not offenders


def test_baseline_nodes_are_registered_through_the_entry_point():
    code = """
import sys
import ebrl.config as c
assert not [m for m in sys.modules if m.split('.')[0] == 'baselines'], 'imported on import'
c.register()
from hydra.core.config_store import ConfigStore
names = ConfigStore.instance().list('scheduler')
print(' '.join(names))
print('baselines.config' in sys.modules)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names, loaded = proc.stdout.strip().splitlines()[-2:]
    for name in ("sync", "ebrl", "colocated", "hybrid", "async", "rlinf", "rlinf_async"):
        assert f"{name}_schema.yaml" in names.split()
    assert loaded == "True"  # by the entry point, not by ebrl.config
    from importlib.metadata import entry_points

    assert "baselines.config:register" in {ep.value for ep in entry_points(group="ebrl.schedulers")}


def test_unknown_key_hints_see_the_plugins_nodes():
    assert {"colocated_schema", "hybrid_schema", "async_schema"} <= {
        name for group, name, _ in schemas() if group == "scheduler"
    }


# --- RunContext: the run folder and the resource manager ---------------------------------------
def _capture(monkeypatch, cls) -> list[RunContext]:
    seen: list[RunContext] = []

    def run(self, ctx: RunContext) -> Iterator[IterationReport]:
        seen.append(ctx)
        yield from ()

    monkeypatch.setattr(cls, "run", run)
    return seen


@pytest.mark.parametrize(
    "option, cls_path, managed",
    [
        ("sync", "ebrl.schedulers.sync.SyncScheduler", False),
        ("ebrl", "ebrl.schedulers.ebrl.EBRLScheduler", True),
        ("hybrid", "baselines.hybrid.HybridScheduler", False),
        ("async", "baselines.async_ppo.AsyncScheduler", False),
    ],
)
def test_train_fills_the_run_context(option, cls_path, managed, monkeypatch, tmp_path):
    import importlib

    from ebrl.train import train

    module, name = cls_path.rsplit(".", 1)
    seen = _capture(monkeypatch, getattr(importlib.import_module(module), name))
    extra = ["scheduler.backend=inprocess"] if option != "sync" else []
    if option == "hybrid":
        extra.append("scheduler.sim_workers=1")
    train(make_cfg([*TINY, f"scheduler={option}", "tracking.enabled=false", *extra], tmp_path))
    (ctx,) = seen
    assert ctx.run_dir == (tmp_path / "run").resolve()
    assert ctx.manage_resources is managed


def _ebrl_factory(tmp_path: Path, extra=()) -> StageFactory:
    cfg = make_cfg([*TINY, "scheduler=ebrl", "tracking.enabled=false", *extra], tmp_path)
    return StageFactory.from_config(cfg)


def test_run_dir_reaches_manage_setup(tmp_path):
    """setup writes where the caller says (RunContext.run_dir), not where the config points."""
    factory = _ebrl_factory(tmp_path)  # its cfg's run_dir: tmp_path/run
    run_dir = tmp_path / "chosen"
    run_dir.mkdir()
    ctx = RunContext(factory, 4, 2, Timeline(), run_dir=run_dir, manage_resources=True)
    topo = Topology(tuple(discover_cores()))
    driver = control.setup(
        ctx.factory, 1, 2, ctx.decisions_per_env, topo,
        run_dir=ctx.run_dir, managed=ctx.manage_resources,
    )  # fmt: skip
    assert driver is not None
    info = json.loads((run_dir / "resources.json").read_text())
    assert info["allocator"] == "static"
    assert not (tmp_path / "run").exists()


def test_no_run_dir_writes_nothing_and_unmanaged_runs_get_no_manager(tmp_path):
    factory = _ebrl_factory(tmp_path)
    topo = Topology(tuple(discover_cores()))
    assert control.setup(factory, 1, 2, 4, topo, run_dir=None, managed=True) is not None
    assert not list(tmp_path.rglob("resources.json"))
    # the baselines on EBRL's workers (RunContext.manage_resources=False): their own split
    assert control.setup(factory, 1, 2, 4, topo, run_dir=tmp_path, managed=False) is None
    assert not list(tmp_path.rglob("resources.json"))


def test_the_resource_manager_is_still_refused_for_the_baselines_on_ebrls_workers():
    from ebrl.train import _refuse_unwired_resources

    for option in ("hybrid", "async", "sync"):
        run = validate(make_cfg([f"scheduler={option}", "resources.pin=true"]), CPU_MACHINE)
        with pytest.raises(ConfigError, match=r"not wired into scheduler \w+Scheduler"):
            _refuse_unwired_resources(run)
    _refuse_unwired_resources(
        validate(make_cfg(["scheduler=ebrl", "resources.pin=true"]), CPU_MACHINE)
    )


def test_rlinfs_launcher_writes_into_the_run_contexts_folder(tmp_path):
    from baselines.rlinf.launch import _out_dir

    cfg = make_cfg(["scheduler=rlinf_hybrid"], tmp_path)  # cfg's run_dir: tmp_path/run
    ctx = RunContext(StageFactory.from_config(cfg), 50, 2, Timeline(), run_dir=tmp_path / "ctx")
    assert _out_dir(ctx) == (tmp_path / "ctx" / "rlinf").resolve()
    without = RunContext(StageFactory.from_config(cfg), 50, 2, Timeline())
    assert _out_dir(without) == (tmp_path / "run" / "rlinf").resolve()


def test_sync_and_ebrl_nodes_are_reachable_by_name():
    import ebrl.config as c

    assert class_of(c.EBRLSchedulerNode) is EBRLScheduler
    assert class_of(c.SyncSchedulerNode) is SyncScheduler
    with pytest.raises(AttributeError):
        _ = c.NoSuchSchedulerNode
