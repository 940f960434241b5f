#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read-only: what preflight reads of a node, in one module run instead of one command each."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_node_reads
short_description: Read what preflight checks on a node, in one pass
description:
  - Reads which of the given commands are not on PATH, the TCP ports in LISTEN state (IPv4 and
    IPv6, from procfs), /etc/machine-id, the node's clock, the free space on a path, and whether
    a file (the kubelet's kubeconfig: the node is a cluster member) exists. Never changes anything.
options:
  commands: {type: list, elements: str, default: [], description: Commands the phases run on the node.}
  free_space_path: {type: path, default: /var, description: The path whose free space (for unprivileged use) is read.}
  member_file: {type: path, required: true, description: A file that exists only on a cluster member.}
  proc_root: {type: path, default: /proc, description: Where procfs is mounted.}
  machine_id_file: {type: path, default: /etc/machine-id, description: The node's machine-id.}
"""

RETURN = r"""
missing_commands: {type: list, description: The commands not found on PATH, in the order given.}
listening_ports: {type: list, description: TCP ports some socket listens on, ascending.}
machine_id: {type: str, description: The machine-id, empty when the file is missing or empty.}
clock: {type: int, description: The node's clock, seconds since the epoch.}
free_bytes: {type: int, description: Bytes free on free_space_path for unprivileged use (df's avail).}
member: {type: bool, description: Whether member_file exists.}
"""

import os
import shutil
import time

from ansible.module_utils.basic import AnsibleModule

LISTEN = "0A"  # the TCP state column of /proc/net/tcp{,6}


def listening_ports(proc_root):
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(os.path.join(proc_root, "net", table)) as handle:
                lines = handle.read().splitlines()[1:]
        except OSError:
            continue  # no IPv6 on this kernel
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)


def machine_id(path):
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


def main():
    module = AnsibleModule(
        argument_spec={"commands": {"type": "list", "elements": "str", "default": []},
                       "free_space_path": {"type": "path", "default": "/var"},
                       "member_file": {"type": "path", "required": True},
                       "proc_root": {"type": "path", "default": "/proc"},
                       "machine_id_file": {"type": "path", "default": "/etc/machine-id"}},
        supports_check_mode=True)
    params = module.params
    space = os.statvfs(params["free_space_path"])
    module.exit_json(changed=False,
                     missing_commands=[c for c in params["commands"] if shutil.which(c) is None],
                     listening_ports=listening_ports(params["proc_root"]),
                     machine_id=machine_id(params["machine_id_file"]),
                     clock=int(time.time()),
                     free_bytes=space.f_bavail * space.f_frsize,
                     member=os.path.exists(params["member_file"]))


if __name__ == "__main__":
    main()
