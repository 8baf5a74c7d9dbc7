"""The mypyc-compiled schedule model: used only when built from the sources on disk, and then
answering as the sources do (ebrl/resources/model/native.py)."""

from __future__ import annotations

import importlib.machinery
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ebrl.resources.model import native

ROOT = Path(__file__).resolve().parents[1]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def fake_build(folder: Path, content: bytes, sources: dict[str, str] | None) -> None:
    """Files where a build of the model in ``folder`` puts its extensions (holding
    ``content``), and its record of ``sources`` (None: the sources in ``folder``)."""
    for m in native.MODULES:
        (folder / f"{m}{SUFFIX}").write_bytes(content)
    (folder.parents[1] / f"_model_native__mypyc{SUFFIX}").write_bytes(b"")
    sources = native.source_hashes(folder) if sources is None else sources
    (folder / native.RECORD).write_text(json.dumps({"sources": sources}))


def fake_tree(tmp_path: Path, built: bool = True, record: bool = True) -> Path:
    """A copy of the compiled modules' sources in ``<tmp>/ebrl/resources/model``, with empty
    files where a build puts its extensions and, optionally, the build's record."""
    folder = tmp_path / "ebrl" / "resources" / "model"
    folder.mkdir(parents=True)
    for m in native.MODULES:
        (folder / f"{m}.py").write_bytes((native.HERE / f"{m}.py").read_bytes())
    if built:
        fake_build(folder, b"", None)
        if not record:
            (folder / native.RECORD).unlink()
    return folder


def test_a_build_from_these_sources_is_used(tmp_path: Path) -> None:
    folder = fake_tree(tmp_path)
    assert native.state(folder, environ={}) == (True, "built from these sources")
    assert len(native.extensions(folder)) == len(native.MODULES) + 1


def test_nothing_built_means_the_sources(tmp_path: Path) -> None:
    folder = fake_tree(tmp_path, built=False, record=False)
    assert native.state(folder, environ={}) == (False, "not built")


def test_an_edited_source_makes_the_build_stale(tmp_path: Path) -> None:
    folder = fake_tree(tmp_path)
    engine = folder / "engine.py"
    engine.write_text(engine.read_text() + "\n# edited\n")
    use, why = native.state(folder, environ={})
    assert not use
    assert why == "stale: engine.py changed since the build"


def test_a_build_without_its_record_is_stale(tmp_path: Path) -> None:
    folder = fake_tree(tmp_path, record=False)
    use, why = native.state(folder, environ={})
    assert not use and why.startswith("stale") and "compiled.json" in why


def test_the_pure_switch_keeps_a_current_build_unused(tmp_path: Path) -> None:
    folder = fake_tree(tmp_path)
    assert native.state(folder, environ={native.PURE_ENV: "1"}) == (False, "EBRL_MODEL_PURE=1")
    assert native.state(folder, environ={native.PURE_ENV: "0"})[0]


def test_clean_removes_the_build_and_its_record(tmp_path: Path) -> None:
    folder = fake_tree(tmp_path)
    assert len(native.clean(folder)) == len(native.MODULES) + 2
    assert native.state(folder, environ={}) == (False, "not built")
    assert all((folder / f"{m}.py").exists() for m in native.MODULES)


PLAY = """
import json, sys
import ebrl.resources.model as model
from ebrl.resources.model import Shape, StageCosts, Workload, play
costs = StageCosts(sim_chunk_s=(0.004, 0.005, 0.012), gen_fixed_s=0.003, gen_per_env_s=0.001,
                   train_s=0.2, sim_busy=1.0, gen_busy=1.0, train_busy=1.0, message_s=0.0002)
work = Workload(workers=((0, 1, 2, 3), (4, 5, 6, 7)), decisions_per_env=6, staleness=1, cores=2.0)
out = {}
for shape in (Shape(1, False, 8), Shape(2, False, 4), Shape(1, True, 2, 0.002)):
    p = play(costs, work, shape, updates=5, warmup=1, seed=3)
    out[shape.describe()] = [p.prediction.throughput, p.prediction.bubble,
                             list(p.prediction.staleness), [list(e[:2]) for e in p.events]]
engine = sys.modules["ebrl.resources.model.engine"].__file__
print(json.dumps({"compiled": model.COMPILED, "engine": engine, "out": out}))
"""


def _play(pure: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    if pure:
        env[native.PURE_ENV] = "1"
    res = subprocess.run(
        [sys.executable, "-c", PLAY], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_the_compiled_model_answers_as_its_sources() -> None:
    """Bit for bit: the same figures and the same order of stage calls. Where the model is not
    built here (no C compiler), both sides are the sources and this only checks the switch."""
    pure, default = _play(pure=True), _play(pure=False)
    assert pure["compiled"] is False and pure["engine"].endswith("engine.py")
    use, _ = native.state(environ={})  # what a run without the switch uses
    assert default["compiled"] is use
    assert default["engine"].endswith(SUFFIX if use else "engine.py")
    assert default["out"] == pure["out"]


@pytest.mark.skipif(not native.state()[0], reason="the compiled model is not built here")
def test_the_package_runs_the_compiled_modules_when_built() -> None:
    import ebrl.resources.model as model

    assert model.COMPILED
    for m in native.MODULES:
        assert sys.modules[f"ebrl.resources.model.{m}"].__file__.endswith(SUFFIX)


def _copy_of_ebrl(tmp_path: Path) -> Path:
    """This checkout's ``ebrl`` package in ``tmp_path``, without any build of the model."""
    import shutil

    skip = shutil.ignore_patterns("*.so", "__pycache__", native.RECORD)
    shutil.copytree(ROOT / "ebrl", tmp_path / "ebrl", ignore=skip)
    return tmp_path / "ebrl" / "resources" / "model"


def _import_in(tmp_path: Path) -> subprocess.CompletedProcess:
    code = (
        "import sys, ebrl.resources.model as m; "
        "print(m.COMPILED, sys.modules['ebrl.resources.model.engine'].__file__)"
    )
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    env["PYTHONPATH"] = str(tmp_path)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )


def test_an_extension_that_does_not_load_leaves_the_sources_in_charge(tmp_path: Path) -> None:
    """A build whose record matches but whose files do not load (another Python's, a cut-off
    copy): the package warns and runs the sources instead of failing the run."""
    folder = _copy_of_ebrl(tmp_path)
    fake_build(folder, b"not a shared library", None)
    res = _import_in(tmp_path)
    assert res.returncode == 0, res.stderr
    compiled, engine = res.stdout.split()
    assert compiled == "False" and engine == str(folder / "engine.py")
    assert "does not load" in res.stderr and "make compile-model" in res.stderr


def test_a_stale_build_is_passed_over_with_a_warning(tmp_path: Path) -> None:
    folder = _copy_of_ebrl(tmp_path)
    fake_build(folder, b"built from other sources", {"engine": "0" * 64})
    res = _import_in(tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["False", str(folder / "engine.py")]
    assert "stale: machine.py, engine.py changed since the build" in res.stderr
