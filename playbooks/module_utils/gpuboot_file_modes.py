"""What the CIS file-permission items ask of a node's files, judged one way for the module that
tightens them (gpuboot_file_modes) and for the convergence probe (gpuboot_phase_state).
An entry: path (a glob), mode (the most its matches may allow, octal text), cis (its items)."""
from __future__ import annotations

import glob
import os
import stat


def loose(entries):
    """Every match of the entries that allows more than its entry, or is not root:root:
    a list of (path, its mode, its owner uid, its group gid, the entry)."""
    found = []
    for entry in entries:
        allowed = int(str(entry["mode"]), 8)
        for path in sorted(glob.glob(entry["path"])):
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                continue  # the target is judged by its own entry, if it has one
            mode = stat.S_IMODE(info.st_mode)
            if mode & ~allowed or info.st_uid != 0 or info.st_gid != 0:
                found.append((path, mode, info.st_uid, info.st_gid, entry))
    return found


def describe(path, mode, uid, gid, entry):
    said = []
    allowed = int(str(entry["mode"]), 8)
    if mode & ~allowed:
        said.append("mode %04o, CIS %s wants %04o or stricter" % (mode, entry.get("cis", "?"), allowed))
    if uid != 0 or gid != 0:
        said.append("owned by %d:%d, CIS %s wants root:root" % (uid, gid, entry.get("cis", "?")))
    return "%s is %s" % (path, "; ".join(said))


def tighten(path, mode, uid, gid, entry):
    """Takes away the bits the entry does not allow (never adds one) and gives it to root."""
    os.chmod(path, mode & int(str(entry["mode"]), 8))
    if uid != 0 or gid != 0:
        os.chown(path, 0, 0)
