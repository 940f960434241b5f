#!/usr/bin/python
"""Installs packages at pinned versions with the node's package manager, in bounded tries."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_packages
short_description: Packages at pinned versions, each package-manager try bounded and stopped whole
description:
  - Reads what is installed (dpkg-query or rpm). Where a wanted package is missing or at another
    version, reads the sources again when they do not offer it (or every time, with
    C(refresh=always)), then installs. apt-get or dnf runs in a session of its own made before
    it starts; a try that outlives C(try_timeout) is stopped with every process it started and
    tried again, up to C(tries) (so is a try that found apt's lock taken). Reports each try.
  - Changes nothing when every package is already at its version, so a second run is unchanged.
options:
  packages:
    type: list
    elements: raw
    required: true
    description: "Each a name (at C(version)), or a dict: name, and version (exact, or a prefix ending in *)."
  version:
    type: str
    default: ""
    description: The version of every package given by name alone; empty for any.
  refresh:
    type: str
    choices: [auto, always]
    default: auto
    description: "auto: read the sources again only when they do not offer a wanted version."
  install_recommends: {type: bool, default: false, description: apt's recommended packages too.}
  allow_held: {type: bool, default: false, description: Move packages that are held.}
  allow_downgrade: {type: bool, default: false, description: Move a package down to its version.}
  try_timeout: {type: int, required: true, description: Seconds one try may run.}
  tries: {type: int, required: true, description: Tries of each step in all.}
  delay: {type: int, default: 5, description: Seconds between tries.}
  hint:
    type: str
    default: ""
    description: Where the packages must come from, added to a failure that is not a hang.
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuboot_packages import Apt, Dnf, Wanted, converge, run_bounded


def main():
    module = AnsibleModule(
        argument_spec={
            "packages": {"type": "list", "elements": "raw", "required": True},
            "version": {"type": "str", "default": ""},
            "refresh": {"type": "str", "choices": ["auto", "always"], "default": "auto"},
            "install_recommends": {"type": "bool", "default": False},
            "allow_held": {"type": "bool", "default": False},
            "allow_downgrade": {"type": "bool", "default": False},
            "try_timeout": {"type": "int", "required": True},
            "tries": {"type": "int", "required": True},
            "delay": {"type": "int", "default": 5},
            "hint": {"type": "str", "default": ""},
        },
        supports_check_mode=True)
    params = module.params
    if params["tries"] < 1 or params["try_timeout"] < 1:
        module.fail_json(msg="tries and try_timeout must be at least 1")
    wanted = []
    for entry in params["packages"]:
        entry = {"name": entry, "version": params["version"]} if isinstance(entry, str) else entry
        if not isinstance(entry, dict) or not entry.get("name"):
            module.fail_json(msg=f"a package without a name: {entry}")
        wanted.append(Wanted(str(entry["name"]), str(entry.get("version") or "")))
    if module.get_bin_path("apt-get"):
        manager = Apt()
    elif module.get_bin_path("dnf"):
        manager = Dnf()
    else:
        module.fail_json(msg="neither apt-get nor dnf is on this node's PATH")
    # The task's environment (a proxy, for one) reaches the package manager.
    env = {**os.environ, **manager.env}

    def run(argv, bound):
        return run_bounded(argv, bound, env=env)

    outcome = converge(manager, wanted, params, module.check_mode, run)
    result = {"changed": outcome.changed, "installed": outcome.installed, "tries": outcome.tries,
              "hung_tries": outcome.hung_tries}
    if outcome.failed:
        module.fail_json(msg=outcome.msg, **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
