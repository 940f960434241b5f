"""playbooks/tasks/install_chart.yml for an add-on whose CRDs are a chart of their own (Calico
from v3.32: crd.projectcalico.org.v1 beside tigera-operator), run by the real ansible-playbook
(local connection) against a real API server, with the real helm reading a real chart
repository over HTTP (the connected case: no mirror). The charts are the TEST DOUBLES, packaged
at the release's versions; the values are what `gpuboot render` writes for the sample.

Shown: the CRDs' chart is rendered and its CRDs applied and established before the operator's
chart, whose Installation the API server then accepts against them; a second run changes
nothing; and the CRDs stay gpuboot's (field manager) as the rest of the add-on."""
from __future__ import annotations

import functools
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from tests.support.addon_doubles import package_chart

pytestmark = [pytest.mark.lab, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "inventories" / "sample" / "inventory.yml"


@pytest.fixture
def chart_repository(helm, tmp_path):
    """A Helm chart repository on loopback holding the release's Calico charts (doubles)."""
    release = matrix.load(load_cluster(SAMPLE).settings.release)
    calico = release.model_extra["calico"]
    assert calico.get("crd_chart"), f"{release.name} has no Calico CRD chart to install"
    served = tmp_path / "charts"
    served.mkdir()
    for chart in (calico["crd_chart"], calico["chart"]):
        package_chart(helm, chart["name"], str(chart["version"]), served)
    subprocess.run([str(helm), "repo", "index", str(served)], check=True, capture_output=True)
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    yield release, {key: dict(calico[key], repository=url) for key in ("crd_chart", "chart")}
    server.shutdown()


def install(api, helm, tmp_path: Path, release, charts: dict, addon_dir: Path) -> subprocess.CompletedProcess[str]:
    playbook = tmp_path / "install.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "install", "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(ROOT / "playbooks" / "group_vars" / "all" / "charts.yml")],
        "tasks": [{"name": "calico", "ansible.builtin.include_tasks": str(ROOT / "playbooks" / "tasks" / "install_chart.yml"),
                   "vars": {"chart_install_release": "tigera-operator", "chart_install_namespace": "tigera-operator",
                            "chart_install_chart": charts["chart"], "chart_install_crd_chart": charts["crd_chart"],
                            "chart_install_dir": str(addon_dir), "chart_install_before": ["namespace.yaml"]}}]}]))
    variables = {"ansible_python_interpreter": sys.executable,
                 "gpuboot_settings": {"tools": {"helm": str(helm)},
                                      "mirror": {"registry": "", "credentials_file": "", "ca_file": ""}},
                 "gpuboot_release": {"kubernetes": {"version": release.kubernetes.version}},
                 "gpuboot_charts_dir": str(tmp_path / "control-charts"),
                 "gpuboot_admin_kubeconfig": str(api.kubeconfig)}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{api.bin_dir}:{os.environ['PATH']}",
               ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps(variables), str(playbook)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def recap(output: str) -> str:
    return next(line for line in output.splitlines() if line.startswith("localhost") and "ok=" in line)


def test_a_crd_chart_is_applied_before_its_operator_chart_and_converges(api, helm, chart_repository, tmp_path):
    release, charts = chart_repository
    rendered = tmp_path / "render"
    assert run(["render", str(SAMPLE), "--out", str(rendered)]) == 0
    addon_dir = rendered / load_cluster(SAMPLE).first_control_plane / "etc" / "gpuboot" / "addons" / "calico"
    assert (addon_dir / "values.yaml").is_file()

    first = install(api, helm, tmp_path, release, charts, addon_dir)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    crds = [d for d in yaml.safe_load_all((addon_dir / "crds.yaml").read_text()) if d]
    names = {crd["metadata"]["name"] for crd in crds}
    assert {"installations.operator.tigera.io", "tigerastatuses.operator.tigera.io"} <= names
    # The operator's chart (the double, as the real one from v3.32) carries none of them itself.
    assert "CustomResourceDefinition" not in (addon_dir / "chart.yaml").read_text()
    for name in names:
        crd = json.loads(api.kubectl("get", "crd", name, "-o", "json", "--show-managed-fields").stdout)
        assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"]), name
        assert "gpuboot" in {m["manager"] for m in crd["metadata"]["managedFields"]}, name
    installation = json.loads(api.kubectl("get", "installations.operator.tigera.io", "default", "-o", "json").stdout)
    values = yaml.safe_load((addon_dir / "values.yaml").read_text())
    assert installation["spec"]["registry"] == values["installation"]["registry"]
    assert "changed=0" not in recap(first.stdout)

    second = install(api, helm, tmp_path, release, charts, addon_dir)
    assert second.returncode == 0, second.stdout[-4000:]
    assert "changed=0" in recap(second.stdout), recap(second.stdout)
