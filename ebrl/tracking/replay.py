"""``python -m ebrl.tracking replay <run_dir>``: send what a run's spool holds unsent.

The command line of :mod:`ebrl.tracking` (``python -m ebrl.tracking`` runs :func:`main`): for a
run whose tracking server was down when it ended, the rest of its spool (:mod:`ebrl.tracking.spool`)
goes to the run it belongs to, once the server is back.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ebrl.tracking.spool import SPOOL_NAME, Spool


def main(argv: list[str] | None = None) -> int:
    """``python -m ebrl.tracking replay <run_dir>``: send what a run's spool holds unsent.

    For a run that ended while its tracking server was down: its metrics, then its final status,
    then its artifacts go to the run id and URI recorded in the spool's sidecar.

    Returns:
        0 when the server has everything, 1 when it is still unreachable.
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ebrl.tracking")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="send a run's unsent metrics, final status and artifacts")
    rp.add_argument("path", type=Path, help=f"run folder holding {SPOOL_NAME}, or a spool file")
    rp.add_argument("--timeout", type=float, default=30.0, help="seconds to keep trying")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    path = args.path / SPOOL_NAME if args.path.is_dir() else args.path
    state = Spool.read_state(path)
    if not path.exists() or "run_id" not in state:
        parser.error(f"{path}: no MLflow spool with its .state.json sidecar")
    from mlflow.tracking import MlflowClient

    spool = Spool(path, state["uri"], state["run_id"])
    todo = spool.left()
    where = f"MLflow run {state['run_id']} at {state['uri']}"
    if spool.deliver(MlflowClient(tracking_uri=state["uri"]), None, args.timeout, 10.0):
        print(f"{path}: sent {todo} to {where}")
        return 0
    print(f"{path}: {where} still unreachable; left: {spool.left()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
