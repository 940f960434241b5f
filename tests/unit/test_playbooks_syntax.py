"""ansible-playbook --syntax-check on every playbook, with the sample inventory."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yml"))


@pytest.mark.parametrize("playbook", PLAYBOOKS, ids=[p.stem for p in PLAYBOOKS])
def test_syntax(playbook, tmp_path):
    exe = Path(sys.executable).parent / "ansible-playbook"
    # Ansible's fact cache and temporary files go to the test's own folder, never into the checkout.
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp_path / "facts"), ANSIBLE_LOCAL_TEMP=str(tmp_path / "tmp"))
    # The state playbook's hosts are templated from extra variables gpuboot passes.
    extra = ["-e", '{"gpuboot_lock_host": "control_plane[0]", "gpuboot_state_hosts": []}']
    proc = subprocess.run([str(exe), "--syntax-check", "-i", str(ROOT / "inventories/sample/inventory.yml"),
                           *extra, str(playbook)], env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
