#!/usr/bin/python
"""Tightens a node's files to the CIS Kubernetes Benchmark's file-permission items."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_file_modes
short_description: Tighten files to the modes and ownership the CIS file-permission items ask
description:
  - Every file or directory a glob of C(entries) matches that allows more than its entry's
    mode loses the extra bits (a stricter file stays as it is), and one not owned by root:root
    is given to root. Paths that do not exist are not an error (a file kubeadm writes only on
    some nodes). Reports each change with its CIS items.
options:
  entries:
    type: list
    elements: dict
    required: true
    description: "Each: path (a glob), mode (octal text), cis (the items it answers)."
"""

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuboot_file_modes import describe, loose, tighten


def main():
    module = AnsibleModule(argument_spec={"entries": {"type": "list", "elements": "dict", "required": True}},
                           supports_check_mode=True)
    found = loose(module.params["entries"])
    if not module.check_mode:
        for item in found:
            tighten(*item)
    module.exit_json(changed=bool(found), tightened=[describe(*item) for item in found])


if __name__ == "__main__":
    main()
