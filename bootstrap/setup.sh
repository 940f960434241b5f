#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for gpuboot's lab and tests: Debian packages, then a
# virtual environment in .venv with exactly the versions and hashes of requirements.lock
# (reinstalled only when the lock or pyproject.toml changes; bootstrap/lock.sh moves the lock).
set -euo pipefail
cd "$(dirname "$0")/.."

# The host's Debian packages the lab uses: one list, also part of the lab's reuse keys.
mapfile -t packages < <(grep -v '^#' bootstrap/host-packages.txt | tr -s ' \n' '\n' | grep .)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

stamp=$(cat pyproject.toml requirements.lock | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/gpuboot ] || [ "$(cat .venv/.gpuboot-deps 2>/dev/null)" != "$stamp" ]; then
  echo "setup: creating .venv from requirements.lock"
  rm -rf .venv
  python3 -m venv .venv
  .venv/bin/pip install -q --require-hashes --no-deps -r requirements.lock
  # gpuboot itself, editable, with the locked build backend: nothing unlocked is fetched.
  .venv/bin/pip install -q --no-deps --no-build-isolation -e .
  echo "$stamp" > .venv/.gpuboot-deps
fi
echo "setup: ready ($(.venv/bin/gpuboot --version))"
