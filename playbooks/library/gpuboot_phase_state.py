#!/usr/bin/python
"""Records, and later checks, what each gpuboot phase left on this host."""
from __future__ import annotations

DOCUMENTATION = r"""
module: gpuboot_phase_state
short_description: Record or check the result a gpuboot phase left on a host
description:
  - C(record) writes /var/lib/gpuboot/phases/<phase>.json with the phase's input fingerprint,
    the machine-id and the checksum of every file the phase owns.
  - C(probe) checks that the record exists for the same fingerprint and machine-id, that
    every recorded file still has its checksum, that every C(present) path exists, that every
    service is active and that no file of C(modes) is looser than the CIS item it answers
    (module_utils gpuboot_file_modes). It changes nothing.
options:
  state: {type: str, required: true, choices: [record, probe]}
  phases:
    type: list
    elements: dict
    required: true
    description: "Each: name, fingerprint, files (globs), present (paths), services, modes (CIS entries)."
  directory: {type: path, default: /var/lib/gpuboot/phases}
"""

import glob
import hashlib
import json
import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.gpuboot_file_modes import describe, loose


def _sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _machine_id():
    try:
        with open("/etc/machine-id") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _record_of(phase):
    files = {}
    for pattern in phase.get("files") or []:
        for path in sorted(glob.glob(pattern)):
            if os.path.isfile(path):
                files[path] = _sha256(path)
    return {"phase": phase["name"], "fingerprint": phase["fingerprint"], "machine_id": _machine_id(),
            "files": files, "present": list(phase.get("present") or []),
            "services": list(phase.get("services") or [])}


def _inactive(module, services):
    down = []
    for service in services:
        rc, out, _ = module.run_command(["systemctl", "is-active", service])
        if rc != 0:
            down.append("%s is %s" % (service, out.strip() or "not active"))
    return down


def _probe(module, directory, phase):
    path = os.path.join(directory, phase["name"] + ".json")
    try:
        with open(path) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return ["no record of this phase on the host"]
    reasons = []
    if record.get("fingerprint") != phase["fingerprint"]:
        reasons.append("the phase's inputs changed since it ran here")
    if record.get("machine_id") != _machine_id():
        reasons.append("the machine-id changed (re-imaged?)")
    for file, checksum in sorted((record.get("files") or {}).items()):
        if not os.path.isfile(file):
            reasons.append("%s is missing" % file)
        elif _sha256(file) != checksum:
            reasons.append("%s was changed" % file)
    for file in phase.get("present") or []:
        if not os.path.exists(file):
            reasons.append("%s is missing" % file)
    reasons += [describe(*item) for item in loose(phase.get("modes") or [])]
    return reasons + _inactive(module, phase.get("services") or [])


def main():
    module = AnsibleModule(
        argument_spec={"state": {"type": "str", "required": True, "choices": ["record", "probe"]},
                       "phases": {"type": "list", "elements": "dict", "required": True},
                       "directory": {"type": "path", "default": "/var/lib/gpuboot/phases"}},
        supports_check_mode=True,
    )
    directory = module.params["directory"]
    phases = module.params["phases"]
    if module.params["state"] == "probe":
        result = {phase["name"]: _probe(module, directory, phase) for phase in phases}
        module.exit_json(changed=False, gpuboot_result=result)
    changed = []
    for phase in phases:
        record = _record_of(phase)
        path = os.path.join(directory, phase["name"] + ".json")
        try:
            with open(path) as handle:
                if json.load(handle) == record:
                    continue
        except (OSError, ValueError):
            pass
        changed.append(phase["name"])
        if not module.check_mode:
            tmp = path + ".tmp"
            try:
                os.makedirs(directory, mode=0o700, exist_ok=True)
                with open(tmp, "w") as handle:
                    json.dump(record, handle, indent=1, sort_keys=True)
                os.chmod(tmp, 0o600)
                os.replace(tmp, path)
            except OSError as exc:
                # A full /var, most often: say where, and leave no half-written record behind.
                if os.path.exists(tmp):
                    os.unlink(tmp)
                module.fail_json(msg="cannot record phase %s in %s: %s; free space there (df -h %s), then run "
                                     "gpuboot up again" % (phase["name"], exc.filename or tmp, exc.strerror or exc,
                                                           directory))
    module.exit_json(changed=bool(changed), gpuboot_result={"recorded": changed})


if __name__ == "__main__":
    main()
