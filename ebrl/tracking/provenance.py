"""What a run records about where it ran: its commit, its machine, and text without local paths.

The run's tags and summary (``ebrl.train``), the sweep's run (:mod:`ebrl.launch.runs`), the
benchmarks and the analysis' outputs record these; none of it needs MLflow.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def portable(text: str) -> str:
    """``text`` with this checkout's, the working directory's and the home directory's absolute
    paths taken out (``<root>/results/x`` -> ``results/x``, ``<home>/y`` -> ``~/y``).

    For what a run records (its config, summary, provenance): results are committed and shared,
    and must not carry one machine's paths. ``sqlite:////abs/root/outputs/m.db`` becomes the
    relative ``sqlite:///outputs/m.db``, still a valid URI from the repository root.
    """
    root = str(Path(__file__).resolve().parents[2])
    prefixes = {str(Path.home()): "~/", os.getcwd(): "", root: ""}
    for prefix, repl in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):
        if prefix not in ("", "/"):
            text = text.replace(prefix.rstrip("/") + "/", repl)
    return text


def git_commit() -> str:
    """The checked-out commit of the ebrl source tree, with ``-dirty`` if it has local changes.

    ``EBRL_COMMIT`` overrides it: benchmarks run from an exported snapshot (no .git) set it.
    """
    if os.environ.get("EBRL_COMMIT"):
        return os.environ["EBRL_COMMIT"]
    root = Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def machine() -> str:
    """A one-line description of this machine (no hostnames or paths)."""
    import psutil

    gpu = os.environ.get("EBRL_GPU_NAME", "")
    if not gpu:
        try:
            import pynvml

            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            gpu = (
                f"{n}x {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))}"
                if n
                else ""
            )
            pynvml.nvmlShutdown()
        except Exception:  # no NVML or no GPU is the normal CPU case
            gpu = ""
    mem = psutil.virtual_memory().total / 2**30
    return (
        f"{platform.machine()} {psutil.cpu_count(logical=True)} cpus {mem:.0f} GiB, "
        f"{gpu or 'no GPU'}, {platform.system()} python {platform.python_version()}"
    )
