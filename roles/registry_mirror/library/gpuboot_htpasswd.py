#!/usr/bin/python
"""Keep one bcrypt user in an htpasswd file without rewriting it on every run: the
password is checked against the stored hash, so a second run changes nothing."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_htpasswd
short_description: One bcrypt htpasswd user, idempotent
description:
  - Writes C(username:bcrypt-hash) to I(path) unless the file already holds that user with a
    hash of I(password). The password is never returned or logged.
options:
  path: {description: The htpasswd file., required: true, type: path}
  username: {description: The user., required: true, type: str}
  password: {description: Its password., required: true, type: str}
  mode: {description: File mode., type: str, default: "0600"}
  group: {description: Group owning the file (the service that reads it)., type: str}
requirements: [python3-bcrypt on the target]
"""

import os

from ansible.module_utils.basic import AnsibleModule

try:
    import bcrypt
except ImportError:  # reported by main()
    bcrypt = None


def current_hash(path: str, username: str) -> bytes | None:
    if not os.path.exists(path):
        return None
    with open(path, "rb") as handle:
        for line in handle.read().splitlines():
            user, _, hashed = line.partition(b":")
            if user.decode() == username:
                return hashed
    return None


def main() -> None:
    module = AnsibleModule(argument_spec={
        "path": {"type": "path", "required": True},
        "username": {"type": "str", "required": True},
        "password": {"type": "str", "required": True, "no_log": True},
        "mode": {"type": "str", "default": "0600"},
        "group": {"type": "str"},
    }, supports_check_mode=True)
    if bcrypt is None:
        module.fail_json(msg="python3-bcrypt is missing on the target; install it (apt-get install python3-bcrypt)")
    path, username, password = module.params["path"], module.params["username"], module.params["password"]
    if ":" in username or not username:
        module.fail_json(msg=f"htpasswd user name {username!r} must be non-empty and without ':'")
    stored = current_hash(path, username)
    valid = stored is not None and bcrypt.checkpw(password.encode(), stored)
    with open(path, "rb") if os.path.exists(path) else open(os.devnull, "rb") as handle:
        only_this_user = len(handle.read().splitlines()) == 1
    changed = not (valid and only_this_user)
    if changed and not module.check_mode:
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=10))
        tmp = f"{path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, int(module.params["mode"], 8))
        with os.fdopen(fd, "wb") as out:
            out.write(username.encode() + b":" + hashed + b"\n")
        os.replace(tmp, path)
    file_args = module.load_file_common_arguments({"path": path, "mode": module.params["mode"],
                                                   "group": module.params["group"]})
    if not module.check_mode and os.path.exists(path):
        changed = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(changed=changed, path=path, username=username)


if __name__ == "__main__":
    main()
