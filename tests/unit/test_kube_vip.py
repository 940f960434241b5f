"""control_plane.mode kube_vip: kube-vip's static pod on every control plane (rendered as the
phase writes it), its image planned only for such a cluster, the VIP on the API servers' own
port, and the phases that carry it: the first control plane starts it for `kubeadm init` on
super-admin.conf, every control plane runs it on admin.conf after."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from gpuboot import matrix
from gpuboot.cli.main import run
from gpuboot.config.loader import load_cluster
from gpuboot.mirror.plan import Target, build

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "tests" / "fixtures" / "mixed-fleet"


def fleet(tmp_path: Path, control_plane: str) -> Path:
    root = tmp_path / "site"
    shutil.copytree(FLEET, root)
    settings = root / "group_vars" / "all.yml"
    settings.write_text(settings.read_text().replace("  control_plane: {vip: 10.30.0.100}\n", control_plane, 1))
    return root / "hosts.ini"


KUBE_VIP = "  control_plane: {vip: 10.30.0.100, mode: kube_vip, interface: bond0}\n"


def test_every_control_plane_gets_kube_vips_manifest(tmp_path):
    ini = fleet(tmp_path, KUBE_VIP)
    out = tmp_path / "render"
    assert run(["render", str(ini), "--phase", "kube_vip", "--out", str(out)]) == 0
    image = matrix.load("k8s-1.36").images["kube_vip"]["manager"]
    for host in ("cp1", "cp2", "cp3"):
        pod = yaml.safe_load((out / host / "etc" / "kubernetes" / "manifests" / "kube-vip.yaml").read_text())
        container = pod["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert container["image"] == image and container["args"] == ["manager"]
        assert env["address"] == "10.30.0.100" and env["port"] == "6443" and env["vip_interface"] == "bond0"
        assert env["vip_arp"] == env["cp_enable"] == env["vip_leaderelection"] == "true"
        assert env["svc_enable"] == "false"
        # Its own node's API server as `kubernetes`, never the VIP it has yet to hold.
        assert pod["spec"]["hostAliases"] == [{"ip": "127.0.0.1", "hostnames": ["kubernetes"]}]
        assert pod["spec"]["hostNetwork"] is True
        assert pod["spec"]["volumes"][0]["hostPath"] == {"path": "/etc/kubernetes/admin.conf", "type": "File"}
        assert container["securityContext"]["capabilities"] == {"add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"]}
    assert not (out / "hgx01" / "etc" / "kubernetes" / "manifests").exists()


def test_keepalived_sites_get_no_kube_vip_and_kube_vip_sites_no_keepalived(tmp_path):
    ini = fleet(tmp_path, KUBE_VIP)
    out = tmp_path / "render"
    assert run(["render", str(ini), "--out", str(out)]) == 0
    assert (out / "cp1" / "etc" / "kubernetes" / "manifests" / "kube-vip.yaml").is_file()
    assert not (out / "cp1" / "etc" / "haproxy").exists() and not (out / "cp1" / "etc" / "keepalived").exists()
    plain = fleet(tmp_path / "plain", "  control_plane: {vip: 10.30.0.100}\n")
    out = tmp_path / "render-plain"
    assert run(["render", str(plain), "--out", str(out)]) == 0
    assert (out / "cp1" / "etc" / "keepalived" / "keepalived.conf").is_file()
    assert not (out / "cp1" / "etc" / "kubernetes" / "manifests" / "kube-vip.yaml").exists()


def test_kube_vips_image_is_planned_only_where_it_holds_the_vip(tmp_path):
    image = "ghcr.io/kube-vip/kube-vip:v1.2.3"
    for control_plane, wanted in ((KUBE_VIP, True), ("  control_plane: {vip: 10.30.0.100}\n", False)):
        cluster = load_cluster(fleet(tmp_path / str(wanted), control_plane))
        release = matrix.load(cluster.settings.release)
        planned = {str(i.ref) for i in build(release, Target.of(cluster, release)).images}
        assert (image in planned) is wanted


@pytest.mark.parametrize("control_plane", [
    "  control_plane: {vip: 10.30.0.100, mode: kube_vip, port: 8443}\n",
    "  control_plane: {vip: 10.30.0.100, mode: kube_vip, apiserver_port: 6443, port: 443}\n",
])
def test_a_vip_port_other_than_the_api_servers_is_refused_at_its_line(control_plane, tmp_path, capsys):
    ini = fleet(tmp_path, control_plane)
    assert run(["validate", str(ini), "--skip-files"]) == 2
    errors = capsys.readouterr().err
    assert f"{ini.parent / 'group_vars' / 'all.yml'}:4 gpuboot.control_plane" in errors, errors
    assert "kube-vip balances nothing" in errors and "set it to the apiserver_port" in errors


def test_the_first_control_plane_starts_kube_vip_on_super_admin_conf_before_its_init():
    plays = yaml.safe_load((ROOT / "playbooks" / "control_plane_init.yml").read_text())
    pre = {t["name"]: t for t in plays[0]["pre_tasks"]}
    start = pre["First control plane | kube-vip for the init"]
    assert start["ansible.builtin.include_role"]["name"] == "kube_vip"
    assert start["vars"]["kube_vip_kubeconfig"] == "/etc/kubernetes/super-admin.conf"
    # After kubeadm_init, the role again, on its default kubeconfig (admin.conf).
    roles = [r["role"] for r in plays[0]["roles"]]
    assert roles == ["kubeadm_init", "kube_vip"] and "vars" not in plays[0]["roles"][1]
    defaults = yaml.safe_load((ROOT / "roles" / "kube_vip" / "defaults" / "main.yml").read_text())
    assert defaults["kube_vip_kubeconfig"] == "/etc/kubernetes/admin.conf"
