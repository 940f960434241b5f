#!/usr/bin/env bash
# The main job on one machine: set it up, build Kubernetes from Go modules (cached), bring
# up a lab of kind-like nodes (3 control planes, 2 workers) with an air-gap mirror that
# holds what was built, and run `gpuboot up` against it through every phase that is built:
# a real HA cluster behind keepalived/haproxy with the bridge CNI. Re-running is safe: an
# existing lab and mirror are reused, `up` converges.
set -euo pipefail
cd "$(dirname "$0")/.."
bash bootstrap/setup.sh
gpuboot=.venv/bin/gpuboot
inventory=inventories/lab/inventory.yml
release=$(.venv/bin/python -c 'from gpuboot_lab import LAB_RELEASE; print(LAB_RELEASE)')
version=$(.venv/bin/python -c "from gpuboot import matrix; print(matrix.load('$release').kubernetes.version)")
"$gpuboot" lab kubernetes build --version "$version"
bundle=.gpuboot/_lab/bundle-$version
if [ ! -f "$bundle/bundle.json" ]; then
  "$gpuboot" lab kubernetes bundle --version "$version" --out "$bundle"
fi
if ! "$gpuboot" lab status --output json | grep -q '"running"'; then
  "$gpuboot" lab down >/dev/null 2>&1 || true
  "$gpuboot" lab up --flavour kubernetes --control-planes 3 --workers 2 --gpu-workers 0 --release "$release"
fi
"$gpuboot" lab mirror "$bundle"
"$gpuboot" validate "$inventory" --check-files
# Stop before the first phase that is not built yet (plan marks it), instead of failing there.
last=$("$gpuboot" plan "$inventory" --output json | .venv/bin/python -c '
import json, sys
built = []
for row in json.load(sys.stdin):
    if row["action"].startswith(("stops:", "not reached")):
        break
    built.append(row["phase"])
print(built[-1])')
echo "running every built phase, up to $last"
"$gpuboot" up "$inventory" --to "$last"
"$gpuboot" status "$inventory"
echo "kubeconfig (0600): inventories/lab/.gpuboot/lab/admin.conf — the API through the VIP"
