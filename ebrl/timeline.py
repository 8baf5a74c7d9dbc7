"""Stage spans on a shared clock: busy time per stage and a Chrome-trace timeline.

Every stage call a scheduler makes is recorded as a span ``(stage, track, start, end)``. From the
spans come per-stage busy time, the engine's own overhead (wall time covered by no span) and the
trace file a person opens in chrome://tracing or https://ui.perfetto.dev.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


def covered_s(
    intervals: Iterable[tuple[float, float]],
    lo: float = float("-inf"),
    hi: float = float("inf"),
) -> float:
    """Length of ``[lo, hi]`` covered by at least one interval ``(start, end)``."""
    total, end = 0.0, lo
    for s, e in sorted(intervals):
        s, e = max(s, end), min(e, hi)
        if e > s:
            total += e - s
            end = e
    return total


@dataclass(frozen=True, slots=True)
class Span:
    stage: str  # "sim", "gen", "train", "sync", ...
    track: str  # a lane in the trace: a worker, an env group, the learner
    start: float  # seconds on time.perf_counter's clock
    end: float
    args: tuple[tuple[str, float | int | str], ...] = ()


class Timeline:
    """Thread-safe span recorder with a bounded memory footprint.

    Args:
        max_spans: spans kept for the trace file; accounting (busy time) is always exact.
    """

    def __init__(self, max_spans: int = 200_000) -> None:
        self.t0 = time.perf_counter()
        self.spans: list[Span] = []
        self.busy: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        #: stage -> the tracks (workers) it ran on: a stage's capacity is one lane per track
        self.tracks: dict[str, set[str]] = {}
        self.max_spans = max_spans
        self._lock = threading.Lock()

    def add(self, span: Span) -> None:
        with self._lock:
            self.busy[span.stage] = self.busy.get(span.stage, 0.0) + (span.end - span.start)
            self.tracks.setdefault(span.stage, set()).add(span.track)
            cpu = dict(span.args).get("cpu")
            if cpu is not None:
                self.cpu[span.stage] = self.cpu.get(span.stage, 0.0) + float(cpu)
            if len(self.spans) < self.max_spans:
                self.spans.append(span)

    @contextmanager
    def span(self, stage: str, track: str, **args: float | int | str) -> Iterator[None]:
        """Record a stage call. ``cpu`` (process CPU seconds during the span) is added to its
        args: in a process that runs one stage, that is the stage's real work, whatever the
        contention for cores (wall time is not)."""
        start, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            args["cpu"] = time.process_time() - cpu
            self.add(Span(stage, track, start, time.perf_counter(), tuple(args.items())))

    def covered(
        self,
        since: float | None = None,
        until: float | None = None,
        stages: tuple[str, ...] | None = None,
    ) -> float:
        """Seconds of wall time in ``[since, until]`` covered by at least one span of ``stages``."""
        lo = float("-inf") if since is None else since
        hi = float("inf") if until is None else until
        with self._lock:
            iv = [(s.start, s.end) for s in self.spans if stages is None or s.stage in stages]
        return covered_s(iv, lo, hi)

    def write_chrome_trace(self, path: str | Path) -> Path:
        """Write the spans as Chrome trace JSON (complete events, microseconds)."""
        path = Path(path)
        tracks: dict[str, int] = {}
        events: list[dict] = []
        with self._lock:
            spans = list(self.spans)
        for s in spans:
            tid = tracks.setdefault(s.track, len(tracks) + 1)
            events.append(
                {
                    "name": s.stage,
                    "cat": s.stage,
                    "ph": "X",
                    "pid": os.getpid(),
                    "tid": tid,
                    "ts": (s.start - self.t0) * 1e6,
                    "dur": (s.end - s.start) * 1e6,
                    "args": dict(s.args),
                }
            )
        for name, tid in tracks.items():
            events.append(
                {
                    "name": "thread_name",
                    "ph": "M",
                    "pid": os.getpid(),
                    "tid": tid,
                    "args": {"name": name},
                }
            )
        path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
        return path
