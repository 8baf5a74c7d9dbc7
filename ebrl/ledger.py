"""The step ledger: every env step a run collected, written where a killed process cannot lose it.

A resumed or fault-hit run must train on no transition twice and drop none it counted. The
learner's checkpoint counts what was trained (``trained_env_steps``); this module counts, on the
other side of the data path, what was *collected*, so the two can be held against each other:

    trained = collected - discarded

where a step is *discarded* when the segment it belongs to was never trained: the partial
rollout in flight when an attempt stopped (a signal, a dead driver, the budget), or the part of a
dead env worker that its replacement collected again.

How it is recorded. Each process that builds segments (an env worker, or the driver under the
sync and Colocated schedules) appends one line per batch of decisions to a file of its own,
``<run_dir>/ledger/attempt-<a>/<writer>-<incarnation>.log``: the segment of the attempt each
decision lands in and the env steps it ran. ``os.write`` on an ``O_APPEND`` file goes to the
kernel at once, so a SIGKILLed writer (or driver) loses nothing it wrote. Each attempt's folder
also holds ``start.json``: the learner version the attempt started at. Segment ``i`` of attempt
``a`` is trained by version ``start(a) + i``, so it was trained iff ``i < start(a+1) - start(a)``
(the last attempt: up to the final checkpoint's version). A replacement env worker's file says
the segment it starts at: its predecessor's steps from there on were superseded (discarded).

Reading (:func:`account`) is a pure function of the files and the final version.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

LEDGER = "ledger"
_ATTEMPT = re.compile(r"attempt-(\d+)$")


class StepLedger:
    """One writer's record of the decisions it collected, by segment of the attempt.

    Args:
        path: the file (created; appended to).
        first_segment: the attempt's segment this writer's first decisions land in (a replacement
            env worker continues where its predecessor's part is missing).
    """

    def __init__(self, path: Path, first_segment: int = 0) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.first_segment = first_segment
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(self._fd, (json.dumps({"first_segment": first_segment}) + "\n").encode())

    def add(self, steps_by_segment: dict[int, int]) -> None:
        """Record decisions just collected: ``{segment of the attempt: env steps}``."""
        if steps_by_segment:
            line = " ".join(f"{s}:{n}" for s, n in steps_by_segment.items()) + "\n"
            os.write(self._fd, line.encode())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def attempt_dir(run_dir: Path, start_version: int) -> Path:
    """The folder of a new attempt of the run in ``run_dir``, with its starting learner version
    recorded (a fresh run removes the folder first: ``ebrl.run.resume.resume``)."""
    root = run_dir / LEDGER
    root.mkdir(parents=True, exist_ok=True)
    n = len([p for p in root.iterdir() if _ATTEMPT.match(p.name)])
    d = root / f"attempt-{n}"
    d.mkdir()
    (d / "start.json").write_text(json.dumps({"version": start_version}))
    return d


def writer_path(attempt: Path, writer: str, incarnation: int = 0) -> Path:
    return attempt / f"{writer}-{incarnation}.log"


@dataclass
class Account:
    """What the ledger says of a run (env steps, every attempt so far).

    Attributes:
        collected: env steps every writer collected.
        trained: env steps in segments a learner version trained.
        discarded: collected - trained: segments no version trained (stops, the budget), and
            the steps of dead env workers that their replacements collected again.
        superseded: the part of ``discarded`` that dead env workers' replacements redid.
        by_attempt: per attempt, (collected, trained, discarded).
    """

    collected: int = 0
    trained: int = 0
    discarded: int = 0
    superseded: int = 0
    by_attempt: list[tuple[int, int, int]] = field(default_factory=list)


def _read(path: Path) -> tuple[int, dict[int, int]]:
    """A writer's first segment and its steps by segment (a torn last line is ignored)."""
    lines = path.read_text().split("\n")
    first = int(json.loads(lines[0])["first_segment"])
    steps: dict[int, int] = defaultdict(int)
    for line in lines[1:-1]:  # the last is "" after a complete line, or a torn write
        for item in line.split():
            s, n = item.split(":")
            steps[int(s)] += int(n)
    return first, steps


def account(run_dir: Path, final_version: int) -> Account:
    """Hold the ledger of ``run_dir`` against the learner's versions.

    Args:
        run_dir: the run folder.
        final_version: the learner's version now (the last checkpoint's): attempt ``a`` trained
            its segments ``0 .. end(a) - start(a) - 1``, with ``end`` the next attempt's start.
    """
    root = run_dir / LEDGER
    attempts = sorted(
        (int(m.group(1)), p) for p in root.glob("attempt-*") if (m := _ATTEMPT.match(p.name))
    )
    starts = [int(json.loads((p / "start.json").read_text())["version"]) for _, p in attempts]
    out = Account()
    for i, (_, folder) in enumerate(attempts):
        end = starts[i + 1] if i + 1 < len(attempts) else final_version
        n_trained = end - starts[i]
        # writer -> its incarnations in order (a replacement supersedes its predecessor's steps
        # from the segment it starts at)
        writers: dict[str, list[tuple[int, int, dict[int, int]]]] = defaultdict(list)
        for f in folder.glob("*.log"):
            name, inc = f.stem.rsplit("-", 1)
            first, steps = _read(f)
            writers[name].append((int(inc), first, steps))
        collected = trained = superseded = 0
        for incs in writers.values():
            incs.sort()
            for j, (_, _, steps) in enumerate(incs):
                cut = incs[j + 1][1] if j + 1 < len(incs) else None
                for s, n in steps.items():
                    collected += n
                    if cut is not None and s >= cut:
                        superseded += n
                    elif s < n_trained:
                        trained += n
        out.by_attempt.append((collected, trained, collected - trained))
        out.collected += collected
        out.trained += trained
        out.superseded += superseded
    out.discarded = out.collected - out.trained
    return out
