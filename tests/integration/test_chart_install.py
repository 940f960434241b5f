"""playbooks/tasks/install_chart.yml for an add-on whose CRDs are a chart of their own (Calico
from v3.32: crd.projectcalico.org.v1 beside tigera-operator), run by the real ansible-playbook
(local connection) against a real API server, with the real helm reading a real chart
repository over HTTP (the connected case: no mirror). The charts are the TEST DOUBLES, packaged
at the release's versions; the values are what `gpuboot render` writes for the sample.

Shown: the CRDs' chart is rendered and its CRDs applied and established before the operator's
chart, whose Installation the API server then accepts against them; a second run changes
nothing; and the CRDs stay gpuboot's (field manager) as the rest of the add-on. For a chart with
every hook shape the pinned charts use: hooks applied as a sync runs them (see the test), and
objects whose templates name no namespace placed in the release's, with what an earlier gpuboot
put in `default` removed and what someone else made there kept."""
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


def run_install(api, helm, tmp_path: Path, name: str, chart_vars: dict) -> subprocess.CompletedProcess[str]:
    """playbooks/tasks/install_chart.yml with these chart_install_* inputs, as a phase includes it."""
    playbook = tmp_path / f"install-{name}.yml"
    playbook.write_text(yaml.safe_dump([{
        "name": "install", "hosts": "localhost", "gather_facts": False,
        "vars_files": [str(ROOT / "playbooks" / "group_vars" / "all" / "charts.yml")],
        "tasks": [{"name": name, "ansible.builtin.include_tasks": str(ROOT / "playbooks" / "tasks" / "install_chart.yml"),
                   "vars": chart_vars}]}]))
    release = matrix.load(load_cluster(SAMPLE).settings.release)
    variables = {"ansible_python_interpreter": sys.executable,
                 "gpuboot_settings": {"tools": {"helm": str(helm)},
                                      "mirror": {"registry": "", "credentials_file": "", "ca_file": ""}},
                 "gpuboot_release": {"kubernetes": {"version": release.kubernetes.version}},
                 "gpuboot_charts_dir": str(tmp_path / "control-charts"),
                 "gpuboot_admin_kubeconfig": str(api.kubeconfig)}
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{api.bin_dir}:{os.environ['PATH']}",
               ANSIBLE_NOCOLOR="1", ANSIBLE_CACHE_PLUGIN="memory")
    return subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", "localhost,", "-c", "local",
                           "-e", json.dumps(variables), str(playbook)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)


def install(api, helm, tmp_path: Path, release, charts: dict, addon_dir: Path) -> subprocess.CompletedProcess[str]:
    return run_install(api, helm, tmp_path, "calico", {
        "chart_install_release": "tigera-operator", "chart_install_namespace": "tigera-operator",
        "chart_install_chart": charts["chart"], "chart_install_crd_chart": charts["crd_chart"],
        "chart_install_dir": str(addon_dir), "chart_install_before": ["namespace.yaml"]})


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


HOOK_CHART_RELEASE = "hook-demo"
HOOK_NAMESPACE = "gpuboot-hooks-test"


def hook_chart(helm, into: Path, version: str, job_command: str) -> None:
    """A chart with every hook shape the pinned add-on charts use (NFD's post-delete prune Job,
    the GPU Operator's pre-upgrade CRD Job with its RBAC, the Network Operator's pre-install
    Jobs, a test Pod), packaged by the real helm at `version`."""
    source = into / f"src-{version}" / "hook-demo"
    (source / "templates").mkdir(parents=True)
    (source / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "hook-demo", "version": version}))
    (source / "values.yaml").write_text("{}\n")

    def job(name: str, hook: str, weight: str, command: str) -> dict:
        return {"apiVersion": "batch/v1", "kind": "Job",
                "metadata": {"name": name, "namespace": "{{ .Release.Namespace }}",
                             "annotations": {"helm.sh/hook": hook, "helm.sh/hook-weight": weight}},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "serviceAccountName": "hook-demo-hooks",
                                               "containers": [{"name": "c", "image": "busybox:1", "command": ["sh", "-c", command]}]}}}}

    templates = {
        "configmap.yaml": {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": "hook-demo-settings", "namespace": "{{ .Release.Namespace }}"},
                           "data": {"a": "1"}},
        "hook-sa.yaml": {"apiVersion": "v1", "kind": "ServiceAccount",
                         "metadata": {"name": "hook-demo-hooks", "namespace": "{{ .Release.Namespace }}",
                                      "annotations": {"helm.sh/hook": "pre-install,pre-upgrade,post-delete",
                                                      "helm.sh/hook-weight": "-1"}}},
        "pre-job.yaml": job("hook-demo-upgrade-crd", "pre-install,pre-upgrade", "0", job_command),
        "post-job.yaml": job("hook-demo-post", "post-install,post-upgrade", "0", "true"),
        "cleanup-job.yaml": job("hook-demo-cleanup", "post-delete", "0", "strip every label"),
        # Templates that name no namespace (the SR-IOV operator's subchart has such a Deployment
        # and ConfigMap): the release's namespace, as Argo CD places them.
        "nameless.yaml": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "hook-demo-nameless"},
                          "data": {"b": "2"}},
        "nameless-sa.yaml": {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "hook-demo-nameless"}},
        "test-pod.yaml": {"apiVersion": "v1", "kind": "Pod",
                          "metadata": {"name": "hook-demo-test", "namespace": "{{ .Release.Namespace }}",
                                       "annotations": {"helm.sh/hook": "test"}},
                          "spec": {"containers": [{"name": "t", "image": "busybox:1"}]}},
    }
    for name, template in templates.items():
        (source / "templates" / name).write_text(yaml.safe_dump(template))
    subprocess.run([str(helm), "package", str(source), "--destination", str(into)], check=True, capture_output=True)
    subprocess.run([str(helm), "repo", "index", str(into)], check=True, capture_output=True)


def install_hook_chart(api, helm, tmp_path: Path, url: str, version: str, addon_dir: Path):
    return run_install(api, helm, tmp_path, "hook-demo", {
        "chart_install_release": HOOK_CHART_RELEASE, "chart_install_namespace": HOOK_NAMESPACE,
        "chart_install_chart": {"name": "hook-demo", "version": version, "repository": url},
        "chart_install_dir": str(addon_dir), "chart_install_before": ["namespace.yaml"]})


def present(api, kind: str, name: str) -> bool:
    return api.kubectl("get", kind, name, "-n", HOOK_NAMESPACE, "--ignore-not-found", "-o", "name").stdout.strip() != ""


def test_helm_hooks_are_applied_as_a_sync_runs_them(api, helm, tmp_path):
    served = tmp_path / "hook-charts"
    served.mkdir()
    hook_chart(helm, served, "1.0.0", "echo v1")
    hook_chart(helm, served, "1.1.0", "echo v2")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    addon_dir = tmp_path / "addon"
    addon_dir.mkdir()
    (addon_dir / "values.yaml").write_text("{}\n")
    (addon_dir / "namespace.yaml").write_text(yaml.safe_dump(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": HOOK_NAMESPACE}}))
    try:
        # What an earlier gpuboot left: the delete hook applied as a plain object (it ran at install).
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(addon_dir / "namespace.yaml"))
        stale = tmp_path / "stale.yaml"
        planted = subprocess.run([str(helm), "template", HOOK_CHART_RELEASE, str(served / "hook-demo-1.0.0.tgz"),
                                  "--namespace", HOOK_NAMESPACE, "--show-only", "templates/cleanup-job.yaml"],
                                 check=True, capture_output=True, text=True).stdout
        stale.write_text(planted)
        api.kubectl("apply", "--server-side", "--field-manager=gpuboot", "-f", str(stale))
        assert present(api, "job", "hook-demo-cleanup")

        # What an earlier gpuboot's `kubectl apply -f` put in `default` (gpuboot's field manager),
        # and an object of a chart's name that someone else made there (a label, as the API server
        # keeps no manager that owns no field).
        for kind, manager in (("ConfigMap", "gpuboot"), ("ServiceAccount", "someone-else")):
            api.kubectl("apply", "--server-side", f"--field-manager={manager}", "-f", "-", stdin=json.dumps(
                {"apiVersion": "v1", "kind": kind,
                 "metadata": {"name": "hook-demo-nameless", "namespace": "default", "labels": {"planted": "yes"}}}))

        first = install_hook_chart(api, helm, tmp_path, url, "1.0.0", addon_dir)
        assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
        # Applied in a sync's order: PreSync hooks, the chart's objects, PostSync hooks.
        applied = [line for line in first.stdout.splitlines() if "apply server-side" in line and "TASK" in line]
        order = [name for line in applied for name in ("hooks-before.yaml", "chart.yaml", "hooks-after.yaml") if name in line]
        assert order == ["hooks-before.yaml", "chart.yaml", "hooks-after.yaml"], applied
        before = [d["metadata"]["name"] for d in yaml.safe_load_all((addon_dir / "hooks-before.yaml").read_text()) if d]
        assert before == ["hook-demo-hooks", "hook-demo-upgrade-crd"]  # weight -1 before 0
        assert "hook-demo-post" in (addon_dir / "hooks-after.yaml").read_text()
        chart = (addon_dir / "chart.yaml").read_text()
        assert "helm.sh/hook" not in chart and "hook-demo-settings" in chart
        for name in ("hook-demo-upgrade-crd", "hook-demo-post"):
            assert present(api, "job", name), name
        assert present(api, "serviceaccount", "hook-demo-hooks")
        assert present(api, "configmap", "hook-demo-settings")
        assert present(api, "configmap", "hook-demo-nameless") and present(api, "serviceaccount", "hook-demo-nameless")
        in_default = api.kubectl("get", "configmap,serviceaccount", "-n", "default", "--field-selector",
                                 "metadata.name=hook-demo-nameless", "-o", "name").stdout.split()
        assert in_default == ["serviceaccount/hook-demo-nameless"], in_default
        # Delete and test hooks never applied; the one an earlier run left is gone.
        assert not present(api, "job", "hook-demo-cleanup")
        assert not present(api, "pod", "hook-demo-test")

        second = install_hook_chart(api, helm, tmp_path, url, "1.0.0", addon_dir)
        assert second.returncode == 0, second.stdout[-4000:]
        assert "changed=0" in recap(second.stdout), recap(second.stdout)

        # A new chart version changes the hook Job's template, which the API server keeps immutable.
        upgraded = install_hook_chart(api, helm, tmp_path, url, "1.1.0", addon_dir)
        assert upgraded.returncode == 0, upgraded.stdout[-4000:] + upgraded.stderr[-2000:]
        job = json.loads(api.kubectl("get", "job", "hook-demo-upgrade-crd", "-n", HOOK_NAMESPACE, "-o", "json").stdout)
        assert job["spec"]["template"]["spec"]["containers"][0]["command"] == ["sh", "-c", "echo v2"]
        again = install_hook_chart(api, helm, tmp_path, url, "1.1.0", addon_dir)
        assert again.returncode == 0, again.stdout[-4000:]
        assert "changed=0" in recap(again.stdout), recap(again.stdout)
    finally:
        server.shutdown()
        api.kubectl("delete", "namespace", HOOK_NAMESPACE, "--ignore-not-found", "--wait=false")
        api.kubectl("delete", "serviceaccount", "hook-demo-nameless", "-n", "default", "--ignore-not-found")
