"""``python -m ebrl.resources.model build|clean|status``: the mypyc-compiled schedule model
(:mod:`ebrl.resources.model.native`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ebrl.resources.model.native import build, clean, state


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ebrl.resources.model")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the schedule model with mypyc")
    b.add_argument("--build-dir", default=".cache/mypyc", help="scratch: C sources, objects")
    b.add_argument(
        "--optional",
        action="store_true",
        help="a failed build (no mypy, no C compiler) warns and exits 0: the sources run",
    )
    sub.add_parser("clean", help="remove the compiled model")
    sub.add_parser("status", help="whether the compiled model is built and current")
    args = ap.parse_args(argv)
    if args.cmd == "clean":
        for p in clean():
            print(f"removed {p.name}")
        return 0
    if args.cmd == "status":
        use, why = state()
        print(f"compiled schedule model: {'in use' if use else 'not in use'} ({why})")
        return 0
    try:
        built = build(Path(args.build_dir).resolve())
    except (Exception, SystemExit) as err:  # no mypy, no compiler, a type error: the sources run
        clean()
        msg = f"the schedule model was not compiled ({type(err).__name__}: {err})"
        if not args.optional:
            raise SystemExit(msg) from err
        print(f"warning: {msg}; the Python sources run it, about 2x slower", file=sys.stderr)
        return 0
    print(f"compiled schedule model: {', '.join(p.name for p in built)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
