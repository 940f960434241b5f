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

# The lab builds Kubernetes, containerd, helm and Argo CD from Go modules: Debian 12's Go (1.19)
# is too old, so a new enough toolchain is a prerequisite, checked here before anything long.
GO_MIN=1.24
go_version=$(go env GOVERSION 2>/dev/null | sed 's/^go//' || true)
if [ -z "$go_version" ] || [ "$(printf '%s\n%s\n' "$GO_MIN" "$go_version" | sort -V | head -1)" != "$GO_MIN" ]; then
  echo "setup: the lab needs Go $GO_MIN or newer on PATH (found: ${go_version:-none})." >&2
  echo "  install it: download go<version>.linux-amd64.tar.gz from Go's downloads, then" >&2
  echo "  tar -C /usr/local -xzf go<version>.linux-amd64.tar.gz && export PATH=/usr/local/go/bin:\$PATH" >&2
  echo "  and run bash bootstrap/setup.sh again" >&2
  exit 2
fi

# ansible-core 2.21 runs on Python 3.12 or newer on the control machine (Debian 12's python3 is
# 3.11). The first new enough of: $GPUBOOT_PYTHON, python3, python3.14 to python3.12 on PATH,
# then the versions pyenv installed.
python=""
for candidate in "${GPUBOOT_PYTHON:-}" python3 python3.14 python3.13 python3.12 \
                 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; then
    python=$("$candidate" -c 'import sys; print(sys.executable)')
    break
  fi
done
if [ -z "$python" ]; then
  found=$(python3 --version 2>/dev/null || echo none)
  echo "setup: gpuboot's Ansible (ansible-core 2.21) needs Python 3.12 or newer (found: $found)." >&2
  echo "  install one (Debian 13's python3, or \`pyenv install 3.12\`), or set GPUBOOT_PYTHON to its path," >&2
  echo "  and run bash bootstrap/setup.sh again" >&2
  exit 2
fi

stamp=$({ cat pyproject.toml bootstrap/lab/pyproject.toml requirements.lock; "$python" --version; } | sha256sum | cut -c1-16)
if [ ! -x .venv/bin/gpuboot ] || [ "$(cat .venv/.gpuboot-deps 2>/dev/null)" != "$stamp" ]; then
  echo "setup: creating .venv from requirements.lock with $("$python" --version)"
  rm -rf .venv
  "$python" -m venv .venv
  .venv/bin/pip install -q --require-hashes --no-deps -r requirements.lock
  # gpuboot and its lab (a distribution of its own), editable, with the locked build backend:
  # nothing unlocked is fetched.
  .venv/bin/pip install -q --no-deps --no-build-isolation -e . -e bootstrap/lab
  echo "$stamp" > .venv/.gpuboot-deps
fi
echo "setup: ready ($(.venv/bin/gpuboot --version))"
