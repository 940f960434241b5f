"""gpuboot's Ansible modules (playbooks/library) and filters (playbooks/filter_plugins) imported
as Python for their tests, the modules with their shared module_utils where Ansible would put
them (ansible.module_utils.<name>)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_module(name: str):
    for utils in sorted((ROOT / "playbooks" / "module_utils").glob("*.py")):
        _load(f"ansible.module_utils.{utils.stem}", utils)
    return _load(name, ROOT / "playbooks" / "library" / f"{name}.py")


def load_filter(name: str):
    return _load(f"gpuboot_filter_{name}", ROOT / "playbooks" / "filter_plugins" / f"{name}.py")
