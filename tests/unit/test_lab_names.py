"""Lab test modules can run at the same time (two lanes of .ci/run), so no two of them may bring
up labs that share a name (podman's containers and network are named by it) or a subnet (the
gateway's address, the apt cache's listener). Each lane's shared lab has a subnet of its own."""
from __future__ import annotations

import re
from ipaddress import ip_network
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUBNET = re.compile(r'"(10\.213\.\d+\.\d+/\d+)"')
LAB_NAME = re.compile(r'LabSpec\(name="([\w-]+)"|^NAME = "([\w-]+)"|containerd_node\([^,]+, "([\w-]+)"', re.M)
# Where the lab's own subnets are named: the molecule network, the CLI's default.
SOURCES = [*sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "bootstrap" / "lab").rglob("*.py"))]
LANES = [ip_network(f"10.213.{9 + lane}.0/24") for lane in range(9)]


def places(pattern: re.Pattern) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in SOURCES:
        for match in pattern.finditer(path.read_text()):
            value = next(group for group in match.groups() if group)
            found.setdefault(value, set()).add(str(path.relative_to(ROOT)))
    return found


def test_no_two_files_name_the_same_lab_subnet():
    # The CLI's default lab and the lab's own default are one subnet, for one interactive lab.
    shared = {subnet: files for subnet, files in places(SUBNET).items()
              if len(files) > 1 and files != {"bootstrap/lab/gpuboot_lab/cli.py", "bootstrap/lab/gpuboot_lab/cluster.py"}}
    # The benchmarks run alone, never beside the suite.
    shared = {s: f for s, f in shared.items() if not all(name.startswith("tests/bench/") for name in f)}
    assert not shared, f"lab subnets written in more than one file: {shared}"


def test_no_module_subnet_overlaps_another_or_a_lane_s_shared_lab():
    subnets = sorted({ip_network(s) for s in places(SUBNET)} - {LANES[0]}, key=str)
    for index, subnet in enumerate(subnets):
        assert not any(subnet.overlaps(lane) for lane in LANES), f"{subnet} is a lane's shared lab subnet"
        for other in subnets[index + 1:]:
            assert not subnet.overlaps(other), f"{subnet} overlaps {other}"


def test_no_two_files_name_the_same_lab():
    shared = {name: files for name, files in places(LAB_NAME).items() if len(files) > 1}
    assert not shared, f"lab names used in more than one file: {shared}"


def test_the_checks_see_a_clash(tmp_path, monkeypatch):
    for name in ("a", "b"):
        (tmp_path / f"test_{name}.py").write_text('NAME = "same"\nSUBNET = "10.213.90.0/24"\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "SOURCES", sorted(tmp_path.glob("*.py")))
    assert places(LAB_NAME) == {"same": {"test_a.py", "test_b.py"}}
    assert places(SUBNET) == {"10.213.90.0/24": {"test_a.py", "test_b.py"}}


def test_no_module_names_the_shared_lab_s_hosts_by_lane_0_s_name():
    """The shared lab is `itest` in lane 0 and `itest<N>` in lane N: a module that writes
    "itest-cp1" fails in every other lane. They take conftest's LAB_NAME."""
    conftest = ROOT / "tests" / "integration" / "conftest.py"
    written = [f"{path.relative_to(ROOT)}:{number}"
               for path in SOURCES if path != conftest and path != Path(__file__).resolve()
               for number, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r"""["'/]itest\b""", line)]
    assert not written, f"the shared lab named literally (use LAB_NAME): {written}"
