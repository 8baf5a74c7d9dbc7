"""What the benchmarks share: the synchronous-schedule overrides and the provenance block."""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path
from typing import Any

from ebrl.tracking.provenance import git_commit, machine, portable

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


def write_results(
    out: Path,
    rows: list[dict[str, Any]],
    keep: tuple[str, ...],
    title: str,
    table: str,
    prov: dict[str, Any],
) -> None:
    """A benchmark's ``runs.csv`` (the ``keep`` columns of each run) and ``table.md`` (its
    printed table under ``title``, then the provenance), and where they went."""
    with (out / "runs.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keep, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    (out / "table.md").write_text(
        f"# {title}\n\n{table}\n\n```json\n{json.dumps(prov, indent=2)}\n```\n"
    )
    print(f"\nwritten to {out}")
