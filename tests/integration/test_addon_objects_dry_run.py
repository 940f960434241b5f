"""Every object gpuboot would apply for the add-ons is accepted by a real API server (issue 13,
point 6; issue 14 for the Network Operator): for the sample, the mixed NIC fleet and each GPU case, what `gpuboot render` writes is rendered
through the double charts with the real helm exactly as the phases do (playbooks/group_vars/
all/charts.yml: `helm template` for the cluster's Kubernetes version, values on stdin), the
CRDs are applied for real and established, and every other object passes a server-side dry
run of a server-side apply. The charts are TEST DOUBLES (tests/doubles/charts); the API
server, its validation of each object and of each custom resource against its CRD are real."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from tests.support.addon_doubles import CHARTS

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CASES = {"sample": ROOT / "inventories" / "sample" / "inventory.yml",
         "mixed-fleet": ROOT / "tests" / "fixtures" / "mixed-fleet" / "hosts.ini",
         **{p.name: p / "inventory.yml" for p in sorted((ROOT / "tests" / "corpus" / "gpu").iterdir()) if p.is_dir()}}
# addon directory -> (chart, release name, namespace, files applied before / after the chart)
ADDONS = {
    "calico": ("tigera-operator", "tigera-operator", ["namespace.yaml"], []),
    "gpu-operator": ("gpu-operator", "gpu-operator", ["namespace.yaml", "device-plugin-config.yaml",
                                                      "mig-parted-config.yaml", "node-labels.yaml"],
                     ["nvidia-drivers.yaml"]),
    # mirror-access.yaml is left out: render shows a reference where the phase writes the login.
    "network-operator": ("network-operator", "nvidia-network-operator", ["namespace.yaml", "node-labels.yaml"],
                         ["nic-cluster-policy.yaml", "sriov.yaml", "networks.yaml"]),
}


def helm_template(helm: Path, chart: str, release: str, namespace: str, kube_version: str, values: str) -> list[dict]:
    proc = subprocess.run([str(helm), "template", release, str(CHARTS / chart), "--namespace", namespace,
                           "--kube-version", kube_version, "--include-crds", "--values", "-"],
                          input=values, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rendered_addon_object_passes_a_server_side_dry_run(case, api, helm, tmp_path):
    inventory = CASES[case]
    assert run(["render", str(inventory), "--out", str(tmp_path)]) == 0
    cluster = load_cluster(inventory)
    release = matrix.load(cluster.settings.release)
    kube_version = release.kubernetes.version
    first = cluster.first_control_plane
    addons = tmp_path / first / "etc" / "gpuboot" / "addons"
    checked = 0
    for name, (chart, namespace, before, after) in ADDONS.items():
        directory = addons / name
        if not directory.is_dir():
            continue
        objects = helm_template(helm, chart, chart, namespace, kube_version, (directory / "values.yaml").read_text())
        # An add-on whose CRDs are a chart of their own (Calico from v3.32) renders it first, as the phase does.
        crd_chart = (release.model_extra or {}).get(name.replace("-", "_"), {}).get("crd_chart")
        if crd_chart:
            objects = helm_template(helm, crd_chart["name"], f"{chart}-crds", namespace, kube_version, "") + objects
        crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=yaml.safe_dump_all(crds))
        for crd in crds:
            api.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd['metadata']['name']}")
        namespace_file = (directory / "namespace.yaml").read_text()
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", "-", stdin=namespace_file)
        documents = []
        for file in before[1:] + after:
            if (directory / file).is_file():
                documents += [d for d in yaml.safe_load_all((directory / file).read_text()) if d]
        documents += [o for o in objects if o["kind"] != "CustomResourceDefinition"]
        for document in documents:
            proc = api.kubectl("apply", "--server-side", "--dry-run=server", "--field-manager=gpuboot", "-f", "-",
                               stdin=yaml.safe_dump(document), check=False)
            assert proc.returncode == 0, f"{case}/{name}: {document['kind']} {document['metadata']['name']}: {proc.stderr}"
            checked += 1
    assert checked > 0
    # A Calico pool outside kubeadm's podSubnet never reaches here: validation refuses it
    # (tests/unit/test_gpu_plan.py and the corpus); an unknown key never renders (the schema).
    bad = subprocess.run([str(helm), "template", "x", str(CHARTS / "gpu-operator"), "--values", "-"],
                         input="driver: {useOpenKernelModules: true}\n", capture_output=True, text=True)
    assert bad.returncode != 0 and "useOpenKernelModules" in bad.stderr
