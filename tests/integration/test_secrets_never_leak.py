"""Plant known fake secrets where an operator keeps real ones, run real phases over SSH,
then grep everything gpuboot wrote or printed: none of them may appear."""
from __future__ import annotations

import base64
import secrets
from pathlib import Path

import pytest

from gpuboot.cli.main import run
from tests.integration.conftest import edit_inventory, ssh

pytestmark = pytest.mark.lab


def every_file(root: Path):
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            yield path, path.read_bytes()


def test_planted_secrets_never_reach_artifacts_logs_state_or_terminal(lab, tmp_path, capfd, monkeypatch):
    planted = {
        "mirror credentials": f"FAKE-MIRROR-PASSWORD-{secrets.token_hex(8)}",
        "git credentials": f"FAKE-GIT-TOKEN-{secrets.token_hex(8)}",
        "operator environment": f"FAKE-ENV-TOKEN-{secrets.token_hex(8)}",
    }
    secret_dir = tmp_path / "secrets"
    secret_dir.mkdir(mode=0o700)
    (secret_dir / "mirror.json").write_text(f'{{"username": "gpuboot", "password": "{planted["mirror credentials"]}"}}')
    (secret_dir / "git-token").write_text(planted["git credentials"])
    for secret in secret_dir.iterdir():
        secret.chmod(0o600)  # gpuboot refuses a secret others can read
    # A token in the operator's shell: ansible-runner records the environment of each run.
    monkeypatch.setenv("GPUBOOT_TEST_OPERATOR_TOKEN", planted["operator environment"])
    key_text = (lab["lab"].dir / "id_ed25519").read_text()
    key_body = [line for line in key_text.splitlines() if line and "PRIVATE KEY" not in line]

    def reference_secrets(data):
        g = data["all"]["vars"]["gpuboot"]
        # Air-gapped, so container_runtime really reads the credentials and writes them on nodes.
        g["mirror"] = {"air_gapped": True, "registry": "mirror.lab:5000",
                       "credentials_file": str(secret_dir / "mirror.json")}
        g["gitops"] = {"repo_url": "https://git.lab/platform.git", "credentials_file": str(secret_dir / "git-token")}
    inventory = edit_inventory(lab["inventory"], tmp_path / "inv" / "inventory.yml", reference_secrets)
    state_dir = tmp_path / "state"
    monkeypatch.setenv("GPUBOOT_STATE_DIR", str(state_dir))

    assert run(["up", str(inventory), "--to", "container_runtime", "--force", "-vv"]) == 0
    # JSON output of the phase that writes the credentials on the nodes (the phases before it
    # never read them; their runs above were verbose).
    assert run(["up", str(inventory), "--only", "container_runtime", "--force", "--output", "json"]) == 0
    assert run(["plan", str(inventory), "--only", "container_runtime", "--check"]) == 0
    assert run(["status", str(inventory), "--output", "json"]) == 0
    out, err = capfd.readouterr()
    # The secret was used: the node's hosts.toml carries it (root-only), so the greps below mean something.
    basic = base64.b64encode(f"gpuboot:{planted['mirror credentials']}".encode()).decode()
    node = next(iter(lab["state"].addresses))
    on_node = ssh(lab, node, "stat -c %a /etc/containerd/certs.d/nvcr.io/hosts.toml; cat /etc/containerd/certs.d/nvcr.io/hosts.toml")
    assert on_node.stdout.startswith("600\n") and f"Basic {basic}" in on_node.stdout
    planted["mirror credentials, encoded"] = basic

    files = list(every_file(state_dir))
    assert any(p.name == "stdout" for p, _ in files), "expected ansible-runner artifacts to check"
    assert any(p.name == "gpuboot.log" for p, _ in files)
    assert any(p.name == "command" for p, _ in files)
    for what, value in planted.items():
        assert value not in out and value not in err, f"{what} printed on the terminal"
        for path, data in files:
            assert value.encode() not in data, f"{what} written to {path}"
    for line in key_body:
        assert line not in out and line not in err
        for path, data in files:
            assert line.encode() not in data, f"SSH private key material written to {path}"
    # The run record keeps only what explains the run: no env files beside the artifacts.
    assert not [p for p, _ in files if p.parent.name == "env"]
    assert all(oct(p.stat().st_mode & 0o077) == "0o0" or p.name != "command" for p, _ in files)
