from pathlib import Path

from gpuboot.config.loader import load_cluster
from gpuboot.phases.engine import ssh_defaults

ROOT = Path(__file__).resolve().parents[2]


def test_ssh_settings_become_ansible_config_defaults():
    cluster = load_cluster(ROOT / "inventories" / "sample" / "inventory.yml")
    env = ssh_defaults(cluster)
    assert env["ANSIBLE_REMOTE_USER"] == "ops" and env["ANSIBLE_REMOTE_PORT"] == "22"
    assert env["ANSIBLE_PRIVATE_KEY_FILE"] == str(Path("~/.ssh/gpuboot_ed25519").expanduser())
    # The jump host is resolved to its inventory address.
    assert env["ANSIBLE_SSH_COMMON_ARGS"] == "-o ProxyJump=ops@192.0.2.10:22"
