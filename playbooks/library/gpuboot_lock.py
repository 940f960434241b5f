#!/usr/bin/python
"""The cluster lock on the first control plane: one gpuboot run per cluster, from any machine."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_lock
short_description: Take or release gpuboot's cluster lock on this host
description:
  - C(acquired) creates the lock file atomically with the holder's details. When another
    run holds it, the module succeeds with C(acquired=false) and that run's details, unless
    its run id is listed in C(takeover), which the caller lists only for a run it knows is dead.
  - C(released) removes the lock when this run (C(holder.run_id)) holds it, or when C(force).
options:
  state: {type: str, required: true, choices: [acquired, released]}
  holder: {type: dict, required: true, description: "run_id, who, where, pid, since, command"}
  takeover: {type: list, elements: str, default: []}
  force: {type: bool, default: false}
  path: {type: path, default: /var/lib/gpuboot/lock}
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule


def _read(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def _create(path, holder):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(holder, handle)


def main():
    module = AnsibleModule(
        argument_spec={"state": {"type": "str", "required": True, "choices": ["acquired", "released"]},
                       "holder": {"type": "dict", "required": True},
                       "takeover": {"type": "list", "elements": "str", "default": []},
                       "force": {"type": "bool", "default": False},
                       "path": {"type": "path", "default": "/var/lib/gpuboot/lock"}},
    )
    path, holder = module.params["path"], module.params["holder"]
    current = _read(path)
    if module.params["state"] == "released":
        if current is None and not os.path.exists(path):
            module.exit_json(changed=False, gpuboot_result={"released": False, "holder": None})
        if module.params["force"] or current is None or current.get("run_id") == holder.get("run_id"):
            os.unlink(path)
            module.exit_json(changed=True, gpuboot_result={"released": True, "holder": current})
        module.exit_json(changed=False, gpuboot_result={"released": False, "holder": current})
    if current is not None and current.get("run_id") == holder.get("run_id"):
        module.exit_json(changed=False, gpuboot_result={"acquired": True, "holder": current})
    if current is not None and current.get("run_id") in module.params["takeover"]:
        os.unlink(path)
    try:
        _create(path, holder)
    except FileExistsError:
        module.exit_json(changed=False, gpuboot_result={"acquired": False, "holder": _read(path)})
    module.exit_json(changed=True, gpuboot_result={"acquired": True, "holder": holder})


if __name__ == "__main__":
    main()
