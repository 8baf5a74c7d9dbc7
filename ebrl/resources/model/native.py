"""The schedule model compiled to C with mypyc, and the guard that keeps a stale build unused.

The model's hot modules (``machine`` and ``engine``: about 200,000 events for EBRL's step level
on 16 GPUs) are plain, typed Python. ``make setup`` compiles them with mypyc (part of mypy, in
the ``dev`` extra) into extension modules beside their sources; Python imports an extension
before a source of the same name, so the planner and the resource manager then run the compiled
model, about 2x faster, with the same answers bit for bit (``tests/test_plan_speed.py`` holds
the model to the reference, ``tests/test_model_native.py`` the build to its sources). ``rules``
stays Python: the engine's workers call it too, with numpy values a compiled module refuses.

A build records the SHA-256 of the sources it compiled (``compiled.json``). When the package is
imported, :func:`guard` compares them with the sources on disk: after an edit the extensions no
longer match, and the sources are imported instead, with a warning naming the rebuild command,
so a stale build never answers for code it was not built from. An extension that does not load
is passed over the same way. ``EBRL_MODEL_PURE=1`` imports the sources whatever was built.
Without a C compiler or mypy nothing is built, and the sources run.

Usage: ``python -m ebrl.resources.model build`` (``make compile-model``), ``... clean``,
``... status``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import shutil
import sys
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "ebrl.resources.model"
HERE = Path(__file__).resolve().parent
#: compiled, in import order (each imports only those before it)
MODULES = ("machine", "engine")
#: the modules' shared library, ``ebrl/_model_native__mypyc.<suffix>``: a module of ``ebrl``,
#: which has finished importing when the modules' shims load it (a module of this package
#: would be loaded while the package is still importing, which mypyc's shims cannot do)
GROUP = "ebrl._model_native"
#: the build's record (beside the modules): the hashes of the sources it compiled
RECORD = "compiled.json"
PURE_ENV = "EBRL_MODEL_PURE"
REBUILD = "make compile-model (or: python -m ebrl.resources.model build)"


def source_hashes(folder: Path = HERE) -> dict[str, str]:
    """SHA-256 of each compiled module's source."""
    return {m: hashlib.sha256((folder / f"{m}.py").read_bytes()).hexdigest() for m in MODULES}


def extensions(folder: Path = HERE) -> list[Path]:
    """The built extension files: the modules' in ``folder``, the group's in ``ebrl/``."""
    group = folder.parents[1] / f"{GROUP.rsplit('.', 1)[1]}__mypyc"
    return sorted(
        p
        for base in (*(folder / m for m in MODULES), group)
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
        if (p := base.with_name(base.name + suffix)).exists()
    )


def state(folder: Path = HERE, environ: dict[str, str] | None = None) -> tuple[bool, str]:
    """(whether the compiled modules are to be imported, why)."""
    env = os.environ if environ is None else environ
    built = extensions(folder)
    if not built:
        return False, "not built"
    if env.get(PURE_ENV, "") not in ("", "0"):
        return False, f"{PURE_ENV}={env[PURE_ENV]}"
    record = folder / RECORD
    if not record.exists():
        return False, f"stale: {', '.join(p.name for p in built)} but no {record.name}"
    want = json.loads(record.read_text()).get("sources", {})
    have = source_hashes(folder)
    changed = [m for m in MODULES if want.get(m) != have[m]]
    if changed:
        return False, f"stale: {', '.join(f'{m}.py' for m in changed)} changed since the build"
    return True, "built from these sources"


def guard() -> bool:
    """Before the package imports its modules: import the sources when the build is not to be
    used (stale, or ``EBRL_MODEL_PURE``). Returns whether the compiled modules are in use."""
    use, why = state()
    if why == "not built":
        return False
    if use:
        try:
            for m in MODULES:
                importlib.import_module(f"{PACKAGE}.{m}")
            return True
        except ImportError as err:  # built for another Python, or a broken build
            for m in MODULES:
                sys.modules.pop(f"{PACKAGE}.{m}", None)
            why = f"stale: it does not load ({err})"
    if why.startswith("stale"):
        log.warning(
            "the compiled schedule model is %s: using the Python sources (the same answers, "
            "about 2x slower); rebuild with %s",
            why,
            REBUILD,
        )
    for m in MODULES:
        name = f"{PACKAGE}.{m}"
        spec = importlib.util.spec_from_file_location(name, HERE / f"{m}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return False


def clean(folder: Path = HERE) -> list[Path]:
    """Remove the built extensions and the record; returns what was removed."""
    gone = extensions(folder)
    if (folder / RECORD).exists():
        gone.append(folder / RECORD)
    for p in gone:
        p.unlink()
    return gone


def build(build_dir: Path, folder: Path = HERE) -> list[Path]:
    """Compile the modules with mypyc into extensions beside their sources and record the
    sources' hashes; ``build_dir`` (C sources, objects) is made empty first and removed after.
    Raises what mypyc or the C compiler raises (a type error, no compiler)."""
    from mypyc.build import mypycify  # type: ignore[import-untyped]  # the dev extra's mypy
    from setuptools import Distribution  # type: ignore[import-untyped]

    clean(folder)
    hashes = source_hashes(folder)
    root = folder.parents[2]  # the folder holding the ebrl package
    paths = [str((folder / f"{m}.py").relative_to(root)) for m in MODULES]
    # from scratch: mypyc skips C sources its cache says are current, and a rebuild over an
    # earlier one then links a shared library without its init function
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True)
    cwd = os.getcwd()
    os.chdir(root)  # mypyc names modules by their paths from here
    try:
        exts = mypycify(
            paths,
            opt_level="3",
            separate=[(paths, GROUP)],
            target_dir=str(build_dir / "c"),
        )
        dist = Distribution({"name": "ebrl-model-native", "ext_modules": exts})
        cmd = dist.get_command_obj("build_ext")
        cmd.inplace = True
        cmd.build_temp = str(build_dir / "temp")
        cmd.build_lib = str(build_dir / "lib")
        cmd.ensure_finalized()
        cmd.run()
    finally:
        os.chdir(cwd)
        shutil.rmtree(build_dir, ignore_errors=True)
    built = extensions(folder)
    if len(built) != len(MODULES) + 1:
        raise RuntimeError(f"mypyc built {[p.name for p in built]}: expected every module")
    from mypy.version import __version__ as mypy_version

    record = {
        "sources": hashes,
        "mypy": mypy_version,
        "python": sys.version.split()[0],
        "extensions": [p.name for p in built],
    }
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n")
    return built
