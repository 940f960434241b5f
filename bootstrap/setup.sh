#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine for gpuboot's lab and tests: Debian packages, then a
# virtual environment in .venv (reinstalled only when pyproject.toml changes).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(podman runc mmdebstrap apt-cacher-ng uidmap nftables iproute2 openssh-client openssh-server git
          docker-registry skopeo busybox-static etcd-server
          qemu-system-x86 qemu-utils e2fsprogs openssl)
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

stamp=$(sha256sum pyproject.toml | cut -c1-16)
if [ ! -x .venv/bin/gpuboot ] || [ "$(cat .venv/.gpuboot-deps 2>/dev/null)" != "$stamp" ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[test]'
  echo "$stamp" > .venv/.gpuboot-deps
fi
echo "setup: ready ($(.venv/bin/gpuboot --version))"
