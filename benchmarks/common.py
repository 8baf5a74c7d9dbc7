"""What the benchmarks share: the synchronous-schedule overrides and the provenance block."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ebrl.tracking import git_commit, machine, portable

#: EBRL's worker processes with every level off: a lock-step rollout, then training
LEVELS_OFF = ["scheduler.overlap=false", "scheduler.pipeline=false", "scheduler.step_level=false"]


def provenance(seeds: list[int], **extra: Any) -> dict[str, Any]:
    """Commit, machine, the command as typed, seeds, date, plus benchmark-specific fields."""
    return {
        "commit": git_commit(),
        "machine": machine(),
        "command": portable(" ".join([Path(sys.executable).name, *sys.argv])),
        "seeds": seeds,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        **extra,
    }
