#!/usr/bin/env bash
# The real-GPU proof, run as root on a lent GPU machine (no systemd, no containerd, no network)
# from the repository root, with tests/gpu/kit carried (`gpuboot lab gpu-kit pack` makes it):
#   1. gpuboot's preflight phase (its real playbook and hardware facts module) on the GPU;
#   2. NVIDIA's gpu-feature-discovery, once, against the real NVML;
#   3. containerd 2 and runc with the config.toml container_runtime renders for this node,
#      gpuboot's effective-config check on it, nvidia-ctk's CDI spec for the driver root, and a
#      pod through CRI with and without the CDI device;
#   4. each step's time.
# Every step runs even when an earlier one failed; what each printed goes to results.tgz under
# $OUT (tests/gpu/fixtures/<kind>/ once committed). Exit status: the number of failed steps.
# Never changes the GPU's settings (no MIG mode change, no reset).
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
OUT=${OUT:-$REPO/tests/gpu/out}
KIT_ARCHIVE=${KIT_ARCHIVE:-$REPO/tests/gpu/kit/kit.tar.xz}
DRIVER_ROOT=${GPUBOOT_DRIVER_ROOT:-/usr/local/nvidia}
# The host of tests/gpu/inventory that declares this machine's GPU (gpu1: an H200, gpu2: an H100).
HOST=${GPUBOOT_PROOF_HOST:-gpu1}
KIT=${GPUBOOT_KIT_DIR:-/opt/gpuboot-kit}
export PATH=$KIT/bin:$PATH
RESULTS=$OUT/results
mkdir -p "$RESULTS"
: > "$RESULTS/steps.tsv"
failed=0

# step NAME COMMAND...: runs COMMAND with its output in $RESULTS/NAME.log, records its time.
step() {
  local name=$1 started rc
  shift
  started=$EPOCHREALTIME
  echo "== $name"
  "$@" > "$RESULTS/$name.log" 2>&1
  rc=$?
  awk -v n="$name" -v rc="$rc" -v a="$started" -v b="$EPOCHREALTIME" 'BEGIN {printf "%s\t%s\t%.1f\n", n, rc, b - a}' \
    >> "$RESULTS/steps.tsv"
  echo "   rc=$rc ($(tail -n 1 "$RESULTS/$name.log" | cut -c1-160))"
  [ "$rc" = 0 ] || failed=$((failed + 1))
  return 0
}

pack() {
  tar -czf "$OUT/results.tgz" -C "$RESULTS" . && rm -rf "$RESULTS"
}
trap pack EXIT

machine() {
  echo "date: $(date -u +%FT%TZ)"; uname -a; cat /etc/os-release; id
  echo "cgroup: $(stat -fc %T /sys/fs/cgroup)"; nproc; grep MemTotal /proc/meminfo
  ls -la "$DRIVER_ROOT" "$DRIVER_ROOT"/* 2>&1 | head -60
  ls -la /dev/nvidia* 2>&1
  cat /proc/driver/nvidia/version 2>&1
  nvidia-smi --query-gpu=index,pci.bus_id,pci.device_id,pci.sub_device_id,name,memory.total,mig.mode.current,driver_version,compute_cap,vbios_version --format=csv 2>&1
  # The card's serial numbers are not kept (its UUID stays: CDI names devices by it).
  nvidia-smi -q 2>&1 | head -80 | grep -v -E 'Serial Number|GPU PDI'
  command -v python3 systemctl containerd ip ss xz hostname 2>&1
  python3 -c 'import sys, jinja2, yaml; print(sys.version, jinja2.__version__, yaml.__version__)' 2>&1
}

unpack() {
  rm -rf "$KIT" && mkdir -p "$KIT" && tar -xf "$KIT_ARCHIVE" -C "$KIT" || return 1
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$KIT/site" "$KIT"/wheels/*.whl
  # A kit packed from another inventory would fail later, deep in Ansible: say it here.
  python3 -c 'import json, sys; sys.exit(sys.argv[2] not in json.load(open(sys.argv[1]))["gpuboot_nodes"])' \
    "$KIT/node/extravars.json" "$HOST" || { echo "the kit was packed without host $HOST: gpuboot lab gpu-kit pack"; return 1; }
  cat "$KIT/versions.tsv"
  for tool in containerd runc crictl nvidia-ctk gpu-feature-discovery; do "$tool" --version 2>&1 | head -2; done
}

# The address the inventory gives the host is this machine's own, as on a customer's node.
own_address() { hostname -I 2>/dev/null | awk '{print $1}'; }

# Ansible's fact cache outside the checkout: the run writes nothing into the tree.
FACTS=${TMPDIR:-/tmp}/gpuboot-proof-facts
LOGS=${TMPDIR:-/tmp}/gpu-proof-logs
ansible_env() {
  export PYTHONPATH=$KIT/site ANSIBLE_CONFIG=$REPO/ansible.cfg ANSIBLE_LOCAL_TEMP=/tmp/ansible-local
  export ANSIBLE_CACHE_PLUGIN_CONNECTION=$FACTS
  export ANSIBLE_PYTHON_INTERPRETER=$(command -v python3) PATH=$KIT/site/bin:$PATH
}

preflight() {
  ansible_env
  rm -rf "$FACTS"
  python3 -m ansible.cli.playbook --version | head -1
  python3 -m ansible.cli.playbook -i tests/gpu/inventory/hosts.ini -l "$HOST" -c local \
    -e "@$KIT/node/extravars.json" -e "ansible_host=$(own_address)" playbooks/preflight.yml
  local rc=$?
  python3 tests/doubles/hardware/capture.py "$RESULTS/hardware-capture.json"
  return $rc
}

# preflight's hardware module on its own, with the inputs the preflight role gives it for the host
# (the play above stops at its summary of problems, so its results are taken here).
hardware_facts() {
  ansible_env
  rm -rf "$RESULTS/facts-tree"
  python3 -m ansible.cli.adhoc "$HOST" -i tests/gpu/inventory/hosts.ini -c local -M roles/preflight/library \
    -e "@$KIT/node/extravars.json" -m gpuboot_hardware_facts -t "$RESULTS/facts-tree" \
    -a '{"expect_gpu": true, "gpu": "{{ gpuboot_nodes[inventory_hostname].gpu }}", "gpu_models": "{{ gpuboot_gpu_models }}",
         "kernel_module_type": "{{ gpuboot_release.gpu_operator.kernel_module_type }}"}'
  local rc=$?
  mv "$RESULTS/facts-tree/$HOST" "$RESULTS/hardware-facts.json" && rmdir "$RESULTS/facts-tree"
  [ "$rc" = 0 ] || return $rc
  # The step passes only when the module finds the GPU the inventory declares, as on a customer's node.
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print("problems:", r["problems"]); sys.exit(bool(r["problems"]))' \
    "$RESULTS/hardware-facts.json"
}

nvml_dir() { dirname "$(find "$DRIVER_ROOT" -name 'libnvidia-ml.so.1' | head -1)"; }

gfd() {
  local strategy=$1
  LD_LIBRARY_PATH=$(nvml_dir) NODE_NAME=$HOST gpu-feature-discovery --oneshot --no-timestamp \
    --use-node-feature-api=false --device-discovery-strategy=nvml --mig-strategy="$strategy" \
    --output-file="$RESULTS/gfd-$strategy.labels"
  local rc=$?
  cat "$RESULTS/gfd-$strategy.labels" 2>/dev/null
  return $rc
}

containerd_up() {
  mkdir -p /etc/containerd/conf.d /var/run/cdi
  cp -r "$KIT"/node/root/etc/containerd/. /etc/containerd/
  # This machine has no systemd: runc's systemd cgroup driver has no manager to ask. The
  # override goes where gpuboot leaves room for local changes (a drop-in), so the check below
  # reads it through containerd's own merge.
  printf '%s\n' 'version = 3' \
    '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]' \
    '  SystemdCgroup = false' > /etc/containerd/conf.d/50-no-systemd.toml
  # Inside a container (this step's own CPU-machine test) a process may not lower its OOM
  # score; containerd then must not ask runc to (restrict_oom_score_adj, as kind does).
  rm -f /etc/containerd/conf.d/51-restrict-oom.toml
  if ! (echo -998 > /proc/self/oom_score_adj) 2>/dev/null; then
    echo "this machine refuses a negative OOM score: restrict_oom_score_adj on"
    printf '%s\n' 'version = 3' '[plugins."io.containerd.cri.v1.runtime"]' '  restrict_oom_score_adj = true' \
      > /etc/containerd/conf.d/51-restrict-oom.toml
  fi
  containerd > "$RESULTS/containerd-daemon.log" 2>&1 &
  CONTAINERD_PID=$!
  for _ in $(seq 100); do ctr version >/dev/null 2>&1 && break; sleep 0.2; done
  ctr version && containerd config dump > "$RESULTS/containerd-config-dump.toml"
}

containerd_check() {
  ansible_env
  # gpuboot's own tasks (roles/container_runtime/tasks/check.yml), with this node's inputs.
  python3 -m ansible.cli.playbook -i tests/gpu/inventory/hosts.ini -l "$HOST" -c local \
    -e "@$KIT/node/extravars.json" -e container_runtime_systemd_cgroup=false playbooks/container_runtime_check.yml
}

cdi_spec() {
  if [ -n "${GPUBOOT_CDI_SPEC_DOUBLE:-}" ]; then  # the CPU machine's test: no GPU, no NVML
    sed "s|@DOUBLES@|$(cd "$(dirname "$GPUBOOT_CDI_SPEC_DOUBLE")" && pwd)|" "$GPUBOOT_CDI_SPEC_DOUBLE" \
      > /var/run/cdi/nvidia.yaml || return 1
    cp /var/run/cdi/nvidia.yaml "$RESULTS/cdi-nvidia.yaml"
    nvidia-ctk cdi list --spec-dir /var/run/cdi
    return
  fi
  # The device nodes are the host's own (/dev), not under the driver root.
  nvidia-ctk cdi generate --driver-root="$DRIVER_ROOT" --dev-root=/ --nvidia-cdi-hook-path="$KIT/bin/nvidia-cdi-hook" \
    --format=yaml --output=/var/run/cdi/nvidia.yaml || return 1
  cp /var/run/cdi/nvidia.yaml "$RESULTS/cdi-nvidia.yaml"
  nvidia-ctk cdi list
}

probe_image() {
  local sandbox
  sandbox=$(sed -n 's/^ *sandbox = "\(.*\)"/\1/p' /etc/containerd/config.toml)
  ctr -n k8s.io images import --no-unpack=false "$KIT/probe.oci.tar" || return 1
  local ref
  ref=$(ctr -n k8s.io images ls -q | grep gpuboot-gpu-probe | head -1)
  ctr -n k8s.io images tag --force "$ref" localhost/gpuboot-gpu-probe:v1
  # The pod sandbox is the same image (its entrypoint is the lab's pause).
  ctr -n k8s.io images tag --force "$ref" "$sandbox"
  ctr -n k8s.io images ls
}

export CONTAINER_RUNTIME_ENDPOINT=unix:///run/containerd/containerd.sock IMAGE_SERVICE_ENDPOINT=unix:///run/containerd/containerd.sock

# pod NAME CDI(yes|no): a host-network pod through CRI whose one container runs the probe.
# With the CDI device it must list the GPU and exit 0; without, it must see no GPU at all.
pod() {
  local name=$1 cdi=$2 work
  work=$(mktemp -d)
  cat > "$work/pod.json" <<EOF
{"metadata": {"name": "$name", "namespace": "gpu-proof", "uid": "$name-uid", "attempt": 1},
 "log_directory": "$LOGS/$name",
 "linux": {"security_context": {"namespace_options": {"network": 2}}}}
EOF
  local devices='[]'
  [ "$cdi" = yes ] && devices='[{"name": "nvidia.com/gpu=all"}]'
  cat > "$work/ctr.json" <<EOF
{"metadata": {"name": "probe"}, "image": {"image": "localhost/gpuboot-gpu-probe:v1"},
 "command": ["/bin/sh", "-c", "ls -l /dev/nvidia* 2>&1; cat /etc/ld.so.conf.d/* 2>&1; echo ---; nvidia-smi -L && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv"],
 "log_path": "probe.log", "CDI_devices": $devices}
EOF
  mkdir -p "$LOGS/$name"
  local pod_id ctr_id
  pod_id=$(crictl runp "$work/pod.json") || return 1
  ctr_id=$(crictl create "$pod_id" "$work/ctr.json" "$work/pod.json") || return 1
  crictl start "$ctr_id" || return 1
  for _ in $(seq 100); do
    crictl inspect -o go-template --template '{{.status.state}}' "$ctr_id" | grep -q EXITED && break
    sleep 0.2
  done
  crictl inspect "$ctr_id" > "$RESULTS/pod-$name-inspect.json"
  local code output
  code=$(crictl inspect -o go-template --template '{{.status.exitCode}}' "$ctr_id")
  output=$(crictl logs "$ctr_id" 2>&1)
  echo "exit code: $code"
  echo "--- container output"
  echo "$output"
  crictl stopp "$pod_id" >/dev/null && crictl rmp "$pod_id" >/dev/null
  if [ "$cdi" = yes ]; then
    [ "$code" = 0 ] && grep -q '^GPU 0: ' <<< "$output"
  else
    [ "$code" != 0 ] && grep -q 'nvidia-smi: not found' <<< "$output" && ! grep -q '^crw.* /dev/nvidia' <<< "$output"
  fi
}

step 00-machine machine
step 01-unpack unpack
step 02-preflight preflight
step 02-hardware-facts hardware_facts
step 03-gfd-mixed gfd mixed
step 04-gfd-single gfd single
step 05-containerd containerd_up
step 06-containerd-check containerd_check
step 07-cdi-spec cdi_spec
step 08-probe-image probe_image
step 09-pod-with-gpu pod with-gpu yes
step 10-pod-without-gpu pod without-gpu no
# Only the containerd this run started (a lab on the same machine runs its own).
[ -n "${CONTAINERD_PID:-}" ] && kill "$CONTAINERD_PID" && wait "$CONTAINERD_PID" 2>/dev/null
cat "$RESULTS/steps.tsv"
exit "$failed"
