"""The first read of an inventory builds its data plainly from the lint pass's node tree
(no per-value origin tags); it must mean exactly what Ansible's own tagged read means,
hand what it cannot build to Ansible, and leave locations to the second, tagged read."""
from __future__ import annotations

import datetime
from pathlib import Path

import pytest
import yaml

from gpuboot.config import yamlloc
from gpuboot.config.inventory import read_inventory
from gpuboot.config.loader import load_cluster
from gpuboot.errors import InventoryError

TRICKY = """\
base: &base {count: 8, model: H100, mig: ~, ts: 2024-01-02, enabled: yes, ratio: 1.5, hex: 0x1F, octal: 0o17}
rails: &rails [ibp24s0, ibp40s0]
node:
  <<: *base
  count: 4
  pfs: *rails
  again: *rails
multi:
  <<: [*base, {extra: true}]
empty:
quoted: "yes"
"""


def _tree(tmp_path: Path, text: str) -> yaml.Node:
    path = tmp_path / "doc.yml"
    path.write_text(text)
    kept: dict[str, yaml.Node] = {}
    assert yamlloc.lint(path, kept) == []
    return kept[str(path)]


def test_the_plain_build_is_yaml_11_safe_loading(tmp_path):
    built = yamlloc.build(_tree(tmp_path, TRICKY))
    assert built == yaml.safe_load(TRICKY)
    assert built["node"]["count"] == 4 and built["node"]["model"] == "H100"  # merged, own key wins
    assert built["base"]["ts"] == datetime.date(2024, 1, 2) and built["base"]["enabled"] is True
    assert built["base"]["hex"] == 31 and built["quoted"] == "yes" and built["empty"] is None
    assert built["node"]["pfs"] is built["node"]["again"]  # an alias is the same object, as PyYAML makes it


@pytest.mark.parametrize("text", ["secret: !unsafe '{{ x }}'\n", "s: !!set {a, b}\n", "? [a, b]\n: c\n"])
def test_what_the_plain_build_cannot_mean_exactly_is_left_to_ansible(tmp_path, text):
    with pytest.raises(yamlloc.NotPlain):
        yamlloc.build(_tree(tmp_path, text))


INVENTORY = """\
all:
  vars:
    gpuboot:
      cluster_name: g
      release: k8s-1.36
      control_plane: {vip: 10.0.0.100}
    shared: &nic {name: fabric, pf_names: [ens1f0np0], num_vfs: 8, link_type: ib, resource_name: nvidia.com/fabric}
  children:
    control_plane:
      hosts:
        cp[01:03]:
    workers:
      children:
        gpu_workers:
          hosts:
            gpu[01:02]:
              gpuboot_node:
                gpu: {count: 8}
                nics: [{<<: *nic, num_vfs: 4}]
              note: !unsafe '{{ not a template }}'
"""


def _host_vars(inventory) -> dict:
    return {name: host.vars for name, host in inventory.hosts.items()}


def test_the_fast_read_sees_what_ansibles_tagged_read_sees(tmp_path):
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "gpu_workers.yml").write_text("rack: &r r01\nrow: *r\n")
    fast, tagged = read_inventory(path, located=False), read_inventory(path)
    assert not fast.located and tagged.located
    assert _host_vars(fast) == _host_vars(tagged)
    assert fast.hosts["gpu02"].vars["gpuboot_node"]["nics"][0]["num_vfs"] == 4
    assert fast.hosts["gpu01"].vars["row"] == "r01"
    # The file with an !unsafe value was read by Ansible itself (the plain build refuses it).
    assert fast.hosts["gpu01"].vars["note"] == "{{ not a template }}"


def test_a_problem_found_by_the_fast_read_is_reported_with_its_line(tmp_path):
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY.replace("gpu: {count: 8}", "gpu: {count: 8, mig_strategy: bogus}"))
    with pytest.raises(InventoryError) as caught:
        load_cluster(path)
    problems = caught.value.problems
    assert len(problems) == 2 and all("mig_strategy" in p.message for p in problems), problems
    line = INVENTORY.splitlines().index("                gpu: {count: 8}") + 1
    assert {(p.file, p.line, p.path) for p in problems} == {
        (str(path), line, f"{host}.gpuboot_node.gpu") for host in ("gpu01", "gpu02")}


def test_a_valid_inventory_is_read_once_without_tags(tmp_path, monkeypatch):
    from gpuboot.config import loader
    path = tmp_path / "inventory.yml"
    path.write_text(INVENTORY)
    reads = []
    monkeypatch.setattr(loader, "read_inventory", lambda p, located: reads.append(located) or read_inventory(p, located=located))
    cluster = load_cluster(path)
    assert reads == [False]
    assert {n.name for n in cluster.nodes} == {"cp01", "cp02", "cp03", "gpu01", "gpu02"}
