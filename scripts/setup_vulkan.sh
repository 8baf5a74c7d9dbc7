#!/usr/bin/env bash
# Installs a CPU Vulkan driver (Mesa lavapipe) that SAPIEN/ManiSkill3 accepts, project-locally.
#
# Why: SAPIEN creates a Vulkan device even for state observations on CPU physics. Debian 12's own
# lavapipe (Mesa 22.3) is rejected ("Failed to find a supported physical device"); Mesa 25 from the
# bookworm-backports suite works. We fetch that one .so without touching the system's apt sources
# and point the Vulkan loader at it through an ICD file (VK_ICD_FILENAMES, set by ebrl at run time).
#
# Usage: scripts/setup_vulkan.sh [DEST]   (DEST defaults to .cache/vulkan under the repo root)
# Idempotent: does nothing when DEST/lvp_icd.json already points at an existing driver.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dest="$(mkdir -p "${1:-$root/.cache/vulkan}" && cd "${1:-$root/.cache/vulkan}" && pwd)"
icd="$dest/lvp_icd.json"
lib="$dest/libvulkan_lvp.so"
if [[ -f "$icd" && -f "$lib" ]]; then
  echo "vulkan: lavapipe already set up at $dest"; exit 0
fi
if [[ "$(uname -s)" != Linux ]] || ! command -v apt-get >/dev/null; then
  echo "vulkan: this set-up needs a Debian/Ubuntu machine with apt-get; install a Vulkan driver" \
       "(Mesa >= 24 lavapipe or a GPU driver) yourself and set VK_ICD_FILENAMES" >&2
  exit 1
fi
sudo=""; [[ $(id -u) -ne 0 ]] && sudo="sudo"
# 1. The loader and the runtime libraries lavapipe needs (from the machine's own suite).
if ! dpkg -s libvulkan1 mesa-vulkan-drivers >/dev/null 2>&1; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    libvulkan1 mesa-vulkan-drivers >/dev/null
fi
# 2. A newer lavapipe from backports, downloaded into $dest only.
. /etc/os-release
suite="${VERSION_CODENAME:-bookworm}-backports"
uri="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
uri="${uri:-http://deb.debian.org/debian}"
work="$dest/apt"; mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/root"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" > "$work/sources.list"
aptopt=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o APT::Sandbox::User=root)
apt-get -qq "${aptopt[@]}" update
(cd "$work" && apt-get -qq "${aptopt[@]}" download "mesa-vulkan-drivers/$suite")
dpkg -x "$work"/mesa-vulkan-drivers_*.deb "$work/root"
cp "$(find "$work/root" -name libvulkan_lvp.so | head -1)" "$lib"
rm -rf "$work"
printf '{"file_format_version":"1.0.0","ICD":{"library_path":"%s","api_version":"1.4.305"}}\n' "$lib" > "$icd"
echo "vulkan: lavapipe set up at $dest (export VK_ICD_FILENAMES=$icd)"
