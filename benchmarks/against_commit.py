"""One benchmark configuration on two commits, side by side: is a change free?

Each commit is checked out as a snapshot (``git archive``, no work tree of yours touched) and the
throughput benchmark's runs (``benchmarks/scheduler_throughput.py``'s workload and configs) run
from each snapshot in turn, commit-interleaved within every seed, so the slow drifts of a shared
machine hit both alike. Prints, per configuration, each commit's end-to-end throughput and glue
CPU fraction (the engine's own cost) and the paired ratio new / old with a bootstrap 95% CI.

Usage: python benchmarks/against_commit.py --old <rev> --new <rev> [--configs ebrl,async]
       [--seeds 0,1,2] [--iterations 10] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from analysis.stats import ratio_ci  # noqa: E402
from benchmarks.common import provenance  # noqa: E402


def snapshot(rev: str, into: Path) -> tuple[str, Path]:
    """``rev``'s tree under ``into``; (full sha, folder)."""
    sha = subprocess.run(
        ["git", "rev-parse", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()
    folder = into / sha[:10]
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", sha], cwd=ROOT, check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return sha, folder


def run_in(tree: Path, sha: str, config: str, seed: int, iters: int, out: Path) -> dict:
    """One run of ``config`` from ``tree`` (its own code: PYTHONPATH and cwd there)."""
    code = (
        "import sys, json; from pathlib import Path; sys.path.insert(0, '.');"
        "import benchmarks.scheduler_throughput as b;"
        f"s = b.run({config!r}, {seed}, {iters}, 3, Path({str(out)!r}), 'against-commit');"
        "print('RESULT ' + json.dumps({k: s[k] for k in ('throughput_e2e', 'glue_cpu_frac')}))"
    )
    env = {**os.environ, "PYTHONPATH": str(tree), "EBRL_COMMIT": sha}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, env=env, check=True, capture_output=True, text=True
    )
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True)
    ap.add_argument("--new", default="HEAD")
    ap.add_argument("--configs", default="ebrl,async")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--out", default="outputs/against-commit")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    configs = args.configs.split(",")
    out = Path(args.out).resolve()
    rows: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="ebrl-commits-") as tmp:
        trees = [snapshot(args.old, Path(tmp)), snapshot(args.new, Path(tmp))]
        for seed in seeds:
            for config in configs:
                for sha, tree in trees if seed % 2 == 0 else trees[::-1]:
                    r = run_in(tree, sha, config, seed, args.iterations, out / sha[:10])
                    rows.setdefault((config, sha), []).append({**r, "seed": seed})
                    print(
                        f"  {config:8s} {sha[:10]} seed {seed}: {r['throughput_e2e']:7.1f} "
                        f"steps/s, glue cpu {r['glue_cpu_frac']:.3f}",
                        flush=True,
                    )
    (old, _), (new, _) = trees
    lines = [
        f"| config | {old[:10]} steps/s | {new[:10]} steps/s | new / old [95% CI] "
        "| glue cpu old | glue cpu new |",
        "|---|---|---|---|---|---|",
    ]
    for config in configs:
        a = sorted(rows[(config, old)], key=lambda r: r["seed"])
        b = sorted(rows[(config, new)], key=lambda r: r["seed"])
        ta, tb = [r["throughput_e2e"] for r in a], [r["throughput_e2e"] for r in b]
        r = ratio_ci(np.array(tb), np.array(ta))
        glue = [sum(r["glue_cpu_frac"] for r in x) / len(x) for x in (a, b)]
        lines.append(
            f"| {config} | {sum(ta) / len(ta):.1f} | {sum(tb) / len(tb):.1f} "
            f"| {r.value:.3f} [{r.low:.3f}, {r.high:.3f}] | {glue[0]:.3f} | {glue[1]:.3f} |"
        )
    table = "\n".join(lines)
    print("\n" + table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table + "\n")
    prov = provenance(seeds, old=old, new=new, configs=configs, iterations=args.iterations)
    (out / "provenance.json").write_text(json.dumps(prov, indent=1) + "\n")


if __name__ == "__main__":
    main()
