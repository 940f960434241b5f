"""The add-on waits against a real API server: the calico role's ready.yml and the
gpu_operator role's ready.yml, run by the real ansible-playbook (local connection) with the
real kubectl. The operators cannot run here, so the test writes the status they would write
(TigeraStatus conditions, the ClusterPolicy's state). Shown: a wait passes when every
component is Available (the policy ready), and otherwise stops naming each component with
the reason and message of its Degraded condition (the policy's state). Operand pods named
with their node and reason are shown in the lab (test_lab_gpu_stack.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "tests" / "doubles" / "charts"


def wait(api, tmp_path, role: str, variables: dict) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / f"{role}-wait.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "wait", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "wait", "ansible.builtin.include_role": {"name": role, "tasks_from": "ready.yml"}}]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               PATH=f"{api.bin_dir}:{os.environ['PATH']}", ANSIBLE_NOCOLOR="1")
    extra = json.dumps({"ansible_python_interpreter": sys.executable, **variables})
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", extra, str(playbook)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def status(api, kind: str, name: str, body: dict) -> None:
    api.kubectl("patch", kind, name, "--subresource=status", "--type=merge", "-p", json.dumps({"status": body}))


def test_calico_wait_passes_when_available_and_names_the_degraded_component(api, tmp_path):
    api.kubectl("apply", "--server-side", "-f", str(CRDS / "tigera-operator" / "crds" /
                                                    "operator.tigera.io_tigerastatuses.yaml"))
    api.kubectl("wait", "--for=condition=Established", "crd/tigerastatuses.operator.tigera.io")
    for name in ("calico", "apiserver"):
        api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "operator.tigera.io/v1", "kind": "TigeraStatus",
                                                           "metadata": {"name": name}}))
        status(api, "tigerastatuses.operator.tigera.io", name, {"conditions": [
            {"type": "Available", "status": "True", "reason": "AllObjectsAvailable", "message": ""}]})
    variables = {"calico_kubeconfig": str(api.kubeconfig), "calico_ready_timeout": 5}
    ok = wait(api, tmp_path, "calico", variables)
    assert ok.returncode == 0, ok.stdout[-3000:]

    status(api, "tigerastatuses.operator.tigera.io", "calico", {"conditions": [
        {"type": "Available", "status": "False", "reason": "ResourceNotReady", "message": ""},
        {"type": "Degraded", "status": "True", "reason": "ResourceNotReady",
         "message": "IPPool 10.250.0.0/16 is not within the platform's configured pod network CIDR(s)"}]})
    short = wait(api, tmp_path, "calico", variables)
    assert short.returncode != 0
    assert "- calico: Degraded ResourceNotReady: IPPool 10.250.0.0/16 is not within" in short.stdout, short.stdout[-3000:]
    assert "- apiserver" not in short.stdout


def test_gpu_operator_wait_passes_when_ready_and_names_the_state_otherwise(api, tmp_path):
    api.kubectl("apply", "--server-side", "-f", str(CRDS / "gpu-operator" / "crds" / "nvidia.com_clusterpolicies.yaml"))
    api.kubectl("wait", "--for=condition=Established", "crd/clusterpolicies.nvidia.com")
    api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": "gpu-operator"}}))
    api.kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
                                                       "metadata": {"name": "cluster-policy"}, "spec": {}}))
    variables = {"gpu_operator_kubeconfig": str(api.kubeconfig), "gpu_operator_ready_timeout": 5}
    status(api, "clusterpolicies.nvidia.com", "cluster-policy", {"state": "notReady"})
    short = wait(api, tmp_path, "gpu_operator", variables)
    assert short.returncode != 0 and "ClusterPolicy is notReady after 5 s" in short.stdout, short.stdout[-3000:]
    status(api, "clusterpolicies.nvidia.com", "cluster-policy", {"state": "ready"})
    ok = wait(api, tmp_path, "gpu_operator", variables)
    assert ok.returncode == 0, ok.stdout[-3000:]
