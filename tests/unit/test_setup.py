"""bootstrap/setup.sh on a machine whose Go is missing or too old (Debian 12's is 1.19) stops
before anything long, naming what to install."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("go", [None, "go1.19.8", "go1.23.4"])
def test_setup_names_the_go_to_install_when_it_is_missing_or_too_old(tmp_path, go):
    if go is not None:
        fake = tmp_path / "go"
        fake.write_text(f"#!/bin/sh\necho {go}\n")
        fake.chmod(0o755)
    proc = subprocess.run(["bash", str(ROOT / "bootstrap" / "setup.sh")], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{tmp_path}:/usr/sbin:/usr/bin:/sbin:/bin"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    found = go.removeprefix("go") if go else "none"
    assert f"setup: the lab needs Go 1.24 or newer on PATH (found: {found})" in proc.stderr
    assert "tar -C /usr/local -xzf" in proc.stderr


def test_setup_names_the_python_to_install_when_none_is_new_enough(tmp_path):
    # A new enough Go, and only a Python 3.11 (Debian 12's): ansible-core 2.21 needs 3.12.
    (tmp_path / "go").write_text("#!/bin/sh\necho go1.26.8\n")
    (tmp_path / "python3").write_text('#!/bin/sh\n[ "$1" = --version ] && echo "Python 3.11.2" && exit 0\nexit 1\n')
    for tool in ("go", "python3"):
        (tmp_path / tool).chmod(0o755)
    env = {key: value for key, value in os.environ.items() if key != "GPUBOOT_PYTHON"}
    proc = subprocess.run(["bash", str(ROOT / "bootstrap" / "setup.sh")], capture_output=True, text=True, timeout=60,
                          env={**env, "PATH": f"{tmp_path}:/usr/sbin:/usr/bin:/sbin:/bin",
                               "PYENV_ROOT": str(tmp_path / "no-pyenv")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "needs Python 3.12 or newer (found: Python 3.11.2)" in proc.stderr
    assert "GPUBOOT_PYTHON" in proc.stderr
