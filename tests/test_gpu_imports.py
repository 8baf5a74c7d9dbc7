"""The GPU tests (``tests/gpu``, run by ``scripts/gpu_check.sh`` on a lent GPU box) import with
none of the dev extra but pytest itself: such a box may have no package registry, and one missing
dev-only package at import time aborts the whole GPU session, not one test."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: dev-extra packages a GPU box needs anyway: pytest runs the tests; nvidia-ml-py is also the
#: ``gpu`` extra (NVML); setuptools builds the editable install
NEEDED = {"pytest", "pytest-timeout", "nvidia-ml-py", "setuptools"}
#: a dev package's import name where it differs from its distribution name
IMPORT_NAME: dict[str, str] = {}

#: imports every module of tests/gpu with the named top-level packages unimportable
IMPORT_ALL = textwrap.dedent(
    """
    import importlib, importlib.abc, pathlib, sys

    blocked = set(sys.argv[1].split(","))

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
            return None

    sys.meta_path.insert(0, Block())
    for f in sorted(pathlib.Path("tests/gpu").glob("test_*.py")):
        importlib.import_module("tests.gpu." + f.stem)
        print("imported", f.stem)
    """
)


def dev_only() -> list[str]:
    """Import names of the dev extra's packages a GPU box need not have."""
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    out = []
    for req in meta["project"]["optional-dependencies"]["dev"]:
        name = req.split(";")[0].split("[")[0]
        for sep in "<>=!~ ":
            name = name.split(sep)[0]
        if name not in NEEDED:
            out.append(IMPORT_NAME.get(name, name.replace("-", "_")))
    return out


def test_the_gpu_tests_import_without_the_dev_only_packages():
    blocked = dev_only()
    assert "hypothesis" in blocked  # what the GPU session once died of
    out = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL, ",".join(blocked)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    modules = sorted(f.stem for f in (REPO / "tests" / "gpu").glob("test_*.py"))
    assert out.stdout.split() == [w for m in modules for w in ("imported", m)]
