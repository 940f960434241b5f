"""The CLI as a person uses it: exit codes, messages, JSON output. No host is touched."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuboot.cli.main import run

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = str(ROOT / "inventories" / "sample" / "inventory.yml")
CORPUS = ROOT / "tests" / "corpus" / "malformed"


def test_validate_sample(capsys):
    # The sample names key, CA and credential files of its site, absent here.
    assert run(["validate", SAMPLE, "--skip-files"]) == 0
    out = capsys.readouterr().out
    assert "valid" in out and "h200-prod" in out


def test_validate_checks_the_files_the_inventory_names_by_default(tmp_path, capsys):
    """A complete check: a CA that does not exist, an SSH key readable by others."""
    assert run(["validate", SAMPLE]) == 2
    err = capsys.readouterr().err
    assert "group_vars/all.yml:20 gpuboot.mirror.ca_file: file /etc/gpuboot/mirror-ca.crt does not exist" in err
    site = tmp_path / "site"
    (site / "group_vars").mkdir(parents=True)
    key = site / "id_ed25519"
    key.write_text("not a real key\n")
    key.chmod(0o644)
    (site / "inventory.yml").write_text((ROOT / "inventories" / "sample" / "inventory.yml").read_text())
    settings = (ROOT / "inventories" / "sample" / "group_vars" / "all.yml").read_text()
    (site / "group_vars" / "all.yml").write_text(settings.replace("~/.ssh/gpuboot_ed25519", "id_ed25519"))
    assert run(["validate", str(site / "inventory.yml")]) == 2
    err = capsys.readouterr().err
    assert "gpuboot.ssh.private_key_file: id_ed25519 holds a secret and is readable by others (mode 0644)" in err


def test_validate_json(capsys):
    assert run(["validate", SAMPLE, "--output", "json", "--skip-files"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data == {"valid": True, "cluster": "h200-prod", "nodes": 8}


@pytest.mark.parametrize("case", sorted(CORPUS.glob("*.yml"))[:8], ids=lambda p: p.stem)
def test_validate_malformed_exits_2_with_located_error(case, capsys):
    assert run(["validate", str(case)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: inventory is invalid")
    assert str(case) in err and "fix:" in err


def test_validate_missing_file(capsys):
    assert run(["validate", "/nonexistent/inventory.yml"]) == 2
    assert "no such inventory file" in capsys.readouterr().err


def test_up_refuses_bad_inventory_before_touching_hosts(capsys, tmp_path):
    assert run(["up", str(CORPUS / "vip_not_ipv4.yml")]) == 2
    assert "10.0.0.300 is not an IPv4 address" in capsys.readouterr().err
    assert not list(Path(tmp_path / "state").glob("*/runs/*"))


def test_up_requires_referenced_files(capsys):
    # The sample references key and credential files that do not exist on this machine.
    assert run(["up", SAMPLE]) == 2
    err = capsys.readouterr().err
    assert "gpuboot.ssh.private_key_file" in err and "does not exist" in err


def test_plan_lists_phases_hosts_and_unbuilt_phases(capsys):
    assert run(["plan", SAMPLE, "--output", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_phase = {r["phase"]: r for r in rows}
    assert by_phase["control_plane_init"]["hosts"] == ["cp01"]
    # The join phase makes the join credentials on the first control plane, then joins the others.
    assert sorted(by_phase["control_plane_join"]["hosts"]) == ["cp01", "cp02", "cp03"]
    assert by_phase["preflight"]["action"] == "run"
    # Every phase is built for the sample, the GitOps handoff included.
    assert by_phase["cni"]["action"] == "run" and by_phase["gpu_operator"]["action"] == "run"
    assert by_phase["network_operator"]["action"] == "run"
    assert by_phase["gitops_handoff"]["action"] == "run"


def test_unknown_phase_suggests_the_right_one(capsys):
    assert run(["plan", SAMPLE, "--only", "os-prep"]) == 2
    assert "did you mean os_prep" in capsys.readouterr().err


def test_status_of_a_cluster_never_run(capsys):
    assert run(["status", SAMPLE]) == 0
    assert "never run" in capsys.readouterr().out


def test_help_and_version(capsys):
    assert run(["--help"]) == 0
    assert "lab" in capsys.readouterr().out
    assert run(["--version"]) == 0


@pytest.mark.parametrize(("signum", "code"), [("SIGHUP", 129), ("SIGTERM", 143)])
def test_a_closed_terminal_or_a_scheduler_ends_a_command_with_128_plus_the_signal(signum, code, capsys):
    import os
    import signal
    import time

    import click

    from gpuboot.cli.core import cli, register

    @click.command("signal-me")
    def signal_me():
        os.kill(os.getpid(), getattr(signal, signum))
        time.sleep(5)
        raise AssertionError("the signal did not stop the command")

    register(signal_me)
    try:
        assert run(["signal-me"]) == code
    finally:
        cli.commands.pop("signal-me")
    assert f"terminated ({signum})" in capsys.readouterr().err
