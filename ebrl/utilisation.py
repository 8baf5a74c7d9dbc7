"""Per-core CPU and per-GPU utilisation over a run, sampled into ``<run_dir>/utilisation.csv``.

The paper's motivation figures read the machine over time: how busy each CPU core is, how busy
each GPU is (NVML's utilisation: the fraction of the sample period a kernel ran) and how full
its SMs are (SM occupancy, from NVML's GPU performance monitoring, GPM, on the GPUs and drivers
that expose it: Hopper and later), and its memory. :class:`UtilisationSampler` reads them from
a thread of the driver every ``interval_s`` (0.2 s by default): reading ``/proc/stat`` and a few
NVML counters takes well under a millisecond, so the run does not notice it.

The CSV has one row per device per sample:

``t_s``: seconds since ``t0`` on ``time.perf_counter``'s clock (pass the run's
:class:`ebrl.timeline.Timeline` ``t0``, and samples line up with the stage spans of
``timeline.json``), at the end of the interval the row covers; ``device``: ``cpu`` or ``gpu``;
``index``: the core's or the GPU's number (NVML's); ``util_pct``: busy % over the interval (a core:
time not idle; a GPU: NVML's utilisation); ``sm_occupancy_pct``, ``sm_util_pct``: GPM's SM
occupancy and SM activity over the interval (empty where GPM is not available);
``mem_util_pct`` (NVML's memory-controller utilisation), ``mem_used_mib``, ``mem_total_mib``.

Only the cores this process may run on are sampled (a Slurm job given 16 of a node's 96 cores is
read on its 16), and only the GPUs it can see (``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

FILE = "utilisation.csv"
COLUMNS = (
    "t_s",
    "device",
    "index",
    "util_pct",
    "sm_occupancy_pct",
    "sm_util_pct",
    "mem_util_pct",
    "mem_used_mib",
    "mem_total_mib",
)


def _nvml() -> ModuleType | None:
    """pynvml, initialised; None without the library, a driver or a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no NVML library or no driver: the normal CPU case
        return None


def visible_gpus(nvml: Any) -> list[int]:
    """NVML indices of the GPUs this process can use: all of them, narrowed by
    ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs) when it is set; an empty value hides every GPU
    (Submitit's local executor sets it so for a job that asks for none)."""
    n = int(nvml.nvmlDeviceGetCount())
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    if mask is None:
        return list(range(n))
    out: list[int] = []
    for item in (x.strip() for x in mask.split(",")):
        if not item:
            continue
        if item.isdigit():
            if int(item) >= n:
                break  # CUDA stops at the first invalid entry
            out.append(int(item))
            continue
        uuids = {
            _text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))): i for i in range(n)
        }
        match = [i for u, i in uuids.items() if u.startswith(item)]
        if len(match) != 1:
            break
        out.append(match[0])
    return out


def ray_local_gpus(address: str, asks_gpu: bool) -> int | None:
    """GPUs to declare to a Ray instance a run starts itself (``address == "local"``) whose
    roles ask for a GPU: those NVML shows this process (``CUDA_VISIBLE_DEVICES`` narrows them;
    0 without NVML); None (Ray detects them) otherwise, or when joining a cluster (its nodes
    say what they have)."""
    if address != "local" or not asks_gpu:
        return None
    nvml = _nvml()
    if nvml is None:
        return 0
    try:
        return len(visible_gpus(nvml))
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _busy_pct(before: Any, after: Any) -> float:
    """A core's busy % between two ``psutil.cpu_times`` readings (time neither idle nor
    waiting for I/O, as psutil counts it)."""
    total = sum(after) - sum(before)
    if total <= 0:
        return 0.0
    idle = after.idle - before.idle + getattr(after, "iowait", 0) - getattr(before, "iowait", 0)
    return round(max(0.0, min(100.0, 100.0 * (1.0 - idle / total))), 2)


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def gpu_visible() -> bool:
    """Whether this process can see an NVIDIA GPU (NVML, ``CUDA_VISIBLE_DEVICES`` honoured)."""
    nvml = _nvml()
    if nvml is None:
        return False
    try:
        return bool(visible_gpus(nvml))
    except Exception:  # a driver that answers nothing useful: treat as no GPU
        return False
    finally:
        nvml.nvmlShutdown()


@dataclass
class _GPU:
    """One GPU's NVML handle and, where GPM works, its previous GPM sample."""

    index: int
    handle: Any
    gpm: Any = None  # the sample taken at the previous tick (None: GPM unsupported)
    spare: Any = None  # the sample buffer the next tick fills


class _GPUReader:
    """Utilisation, memory and (GPM) SM occupancy of the visible GPUs."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.gpus = [_GPU(i, nvml.nvmlDeviceGetHandleByIndex(i)) for i in visible_gpus(nvml)]
        for g in self.gpus:
            try:
                if nvml.nvmlGpmQueryDeviceSupport(g.handle).isSupportedDevice:
                    g.gpm, g.spare = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
                    nvml.nvmlGpmSampleGet(g.handle, g.gpm)
            except Exception:  # an older GPU or driver: no SM occupancy, the rest still works
                g.gpm = g.spare = None
        if self.gpus and not any(g.gpm is not None for g in self.gpus):
            log.info("utilisation: this GPU or driver has no GPM: SM occupancy is not recorded")

    def _gpm(self, g: _GPU) -> tuple[float | None, float | None]:
        """(SM occupancy %, SM activity %) between the previous tick and now."""
        if g.gpm is None:
            return None, None
        nv = self.nvml
        try:
            nv.nvmlGpmSampleGet(g.handle, g.spare)
            req = nv.c_nvmlGpmMetricsGet_t()
            req.version = nv.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = 2
            req.sample1, req.sample2 = g.gpm, g.spare
            req.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_OCCUPANCY
            req.metrics[1].metricId = nv.NVML_GPM_METRIC_SM_UTIL
            nv.nvmlGpmMetricsGet(req)
        except Exception:
            return None, None
        finally:
            g.gpm, g.spare = g.spare, g.gpm  # this tick's sample starts the next interval
        vals = [m.value if int(m.nvmlReturn) == 0 else None for m in req.metrics[:2]]
        return vals[0], vals[1]

    def read(self) -> list[dict[str, Any]]:
        nv, rows = self.nvml, []
        for g in self.gpus:
            row: dict[str, Any] = {"device": "gpu", "index": g.index}
            try:
                rates = nv.nvmlDeviceGetUtilizationRates(g.handle)
                mem = nv.nvmlDeviceGetMemoryInfo(g.handle)
                row |= {
                    "util_pct": float(rates.gpu),
                    "mem_util_pct": float(rates.memory),
                    "mem_used_mib": mem.used / 2**20,
                    "mem_total_mib": mem.total / 2**20,
                }
            except Exception as e:  # a GPU that fell off the bus: say so once per tick
                log.warning("utilisation: GPU %d not read (%s)", g.index, e)
            row["sm_occupancy_pct"], row["sm_util_pct"] = self._gpm(g)
            rows.append(row)
        return rows

    def close(self) -> None:
        for g in self.gpus:
            for s in (g.gpm, g.spare):
                if s is not None:
                    with contextlib.suppress(Exception):
                        self.nvml.nvmlGpmSampleFree(s)
        self.nvml.nvmlShutdown()


class UtilisationSampler:
    """Samples every allowed CPU core and every visible GPU into a CSV, from a thread.

    Args:
        path: the CSV (``<run_dir>/utilisation.csv``), written anew.
        interval_s: seconds between samples.
        t0: ``time.perf_counter()`` value that ``t_s`` counts from (the run's timeline's).
        gpus: read GPUs through NVML (False: CPU cores only).

    Use as a context manager, or :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self, path: str | Path, interval_s: float = 0.2, t0: float | None = None, gpus: bool = True
    ) -> None:
        self.path = Path(path)
        self.interval_s = interval_s
        self.t0 = time.perf_counter() if t0 is None else t0
        self.cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        nvml = _nvml() if gpus else None
        self._gpu = _GPUReader(nvml) if nvml is not None else None
        self.n_gpus = len(self._gpu.gpus) if self._gpu is not None else 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> UtilisationSampler:
        import psutil

        if not self.cores:
            self.cores = list(range(psutil.cpu_count(logical=True) or 1))
        # our own baseline, not psutil.cpu_percent's process-wide one (MLflow's system metrics
        # monitor would split our intervals)
        self._last, self._at = psutil.cpu_times(percpu=True), time.perf_counter()
        self._file = self.path.open("w", newline="")
        self._csv = csv.DictWriter(self._file, fieldnames=COLUMNS)
        self._csv.writeheader()
        self._thread = threading.Thread(target=self._loop, name="utilisation", daemon=True)
        self._thread.start()
        return self

    def _tick(self) -> None:
        import psutil

        now = psutil.cpu_times(percpu=True)
        per_core = [_busy_pct(a, b) for a, b in zip(self._last, now)]
        self._last, self._at = now, time.perf_counter()
        t = round(time.perf_counter() - self.t0, 4)
        rows = [
            {"device": "cpu", "index": c, "util_pct": per_core[c]}
            for c in self.cores
            if c < len(per_core)
        ]
        if self._gpu is not None:
            rows += self._gpu.read()
        for r in rows:
            self._csv.writerow({"t_s": t, **r})
        self.samples += 1

    def _loop(self) -> None:
        next_at = time.perf_counter() + self.interval_s
        flushed = time.perf_counter()
        while not self._stop.wait(max(0.0, next_at - time.perf_counter())):
            next_at += self.interval_s
            try:
                self._tick()
            except Exception as e:  # never let the sampler take the run down
                log.warning("utilisation: sampling stopped (%s: %s)", type(e).__name__, e)
                return
            if time.perf_counter() - flushed > 1.0:  # a killed run keeps all but the last second
                self._file.flush()
                flushed = time.perf_counter()

    def stop(self) -> Path:
        """Stop sampling; returns the CSV's path."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5.0)
            # one last sample for the time since the previous one, unless that is too short
            # for the kernel's 10 ms CPU-time ticks to say anything
            if not self._thread.is_alive() and time.perf_counter() - self._at > 0.05:
                with contextlib.suppress(Exception):
                    self._tick()
            self._thread = None
            self._file.close()
        if self._gpu is not None:
            self._gpu.close()
            self._gpu = None
        return self.path

    def __enter__(self) -> UtilisationSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
