"""Packages at pinned versions, installed by the node's package manager in bounded tries.

Each try runs the package manager in a session of its own, made in the child before the
manager starts, so a try that outlives its bound is stopped with every process it started.
Ansible's async wrapper cannot promise that: it puts its module into a process group only after
starting it, and under load a hung apt and its acquire methods were started first, survived the
wrapper's kill and held apt's lock against every later try."""
from __future__ import annotations

import fnmatch
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

GRACE_S = 10  # between asking a stopped try to end and killing what is left of it


@dataclass(frozen=True)
class Wanted:
    name: str
    version: str = ""  # empty: any version; a trailing * matches by prefix

    def met_by(self, installed: str | None) -> bool:
        if installed is None:
            return False
        return not self.version or fnmatch.fnmatchcase(installed, self.version)


@dataclass
class Try:
    argv: list[str]
    rc: int | None  # None: stopped at its bound
    took: float
    out: str = ""
    err: str = ""
    stopped: int = 0  # processes still running when the bound came, and stopped

    @property
    def hung(self) -> bool:
        return self.rc is None


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _members(pgid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            count += 1
    return count


def stop_session(proc: subprocess.Popen, grace: float = GRACE_S) -> int:
    """SIGTERM to the try's whole session, SIGKILL to what is left after `grace`; returns how
    many processes were running when it was asked to stop. The leader's pid stays reserved while
    any member of its group lives, so the group is never someone else's."""
    pgid = proc.pid
    members = _members(pgid)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                return members
            time.sleep(0.1)
    proc.poll()
    return members


def run_bounded(argv: list[str], timeout: float, env: dict[str, str] | None = None,
                grace: float = GRACE_S) -> Try:
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", env=env, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return Try(argv, proc.returncode, time.monotonic() - started, out, err)
    except subprocess.TimeoutExpired:
        bound_at = time.monotonic() - started
        stopped = stop_session(proc, grace)
        try:
            out, err = proc.communicate(timeout=grace)
        except subprocess.TimeoutExpired:  # something outside the session holds its pipes
            out, err = "", ""
        return Try(argv, None, bound_at, out or "", err or "", stopped)


Runner = Callable[[list[str], float], Try]


def _read(run: Runner, argv: list[str]) -> Try:
    return run(argv, 60)


class Apt:
    tool = "apt-get"
    env = {"DEBIAN_FRONTEND": "noninteractive", "LC_ALL": "C"}

    def installed(self, run: Runner, names: list[str]) -> dict[str, str]:
        done = _read(run, ["dpkg-query", "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n", *names])
        found = {}
        for line in done.out.splitlines():
            parts = line.split("\t")
            # Status-Abbrev: wanted (i install, h hold, ...), then state (i installed), then errors.
            if len(parts) == 3 and parts[2][1:2] == "i" and not parts[2][2:3].strip():
                found[parts[0]] = parts[1]
        return found

    def known(self, run: Runner, wanted: list[Wanted]) -> bool:
        """Whether the sources read last offer every wanted version (else they are read again)."""
        done = _read(run, ["apt-cache", "madison", *[w.name for w in wanted]])
        offered: dict[str, list[str]] = {}
        for line in done.out.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) >= 2:
                offered.setdefault(parts[0], []).append(parts[1])
        return all(any(w.met_by(v) for v in offered.get(w.name, [])) for w in wanted)

    def refresh(self) -> list[str]:
        return ["apt-get", "-q", "update"]

    def install(self, wanted: list[Wanted], options: dict) -> list[str]:
        argv = ["apt-get", "-q", "-y", "-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold",
                "--install-recommends" if options["install_recommends"] else "--no-install-recommends"]
        if options["allow_held"]:
            argv.append("--allow-change-held-packages")
        if options["allow_downgrade"]:
            argv.append("--allow-downgrades")
        return [*argv, "install", *[f"{w.name}={w.version}" if w.version else w.name for w in wanted]]

    def downgrade(self, wanted: list[Wanted], options: dict) -> list[str] | None:
        return None  # apt-get install moves to the named version, down too with --allow-downgrades

    def busy(self, done: Try) -> bool:
        return done.rc == 100 and ("Could not get lock" in done.err or "Unable to acquire" in done.err)


class Dnf:
    tool = "dnf"
    env = {"LC_ALL": "C"}

    def installed(self, run: Runner, names: list[str]) -> dict[str, str]:
        done = _read(run, ["rpm", "-q", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\n", *names])
        return dict(line.split("\t", 1) for line in done.out.splitlines() if line.count("\t") == 1)

    def known(self, run: Runner, wanted: list[Wanted]) -> bool:
        return True  # dnf reads its repositories' metadata again when it is older than they allow

    def refresh(self) -> list[str]:
        return ["dnf", "-q", "-y", "makecache"]

    def install(self, wanted: list[Wanted], options: dict) -> list[str]:
        return ["dnf", "-y", "--disableexcludes=main", "install",
                *[f"{w.name}-{w.version}" if w.version else w.name for w in wanted]]

    def downgrade(self, wanted: list[Wanted], options: dict) -> list[str] | None:
        if not options["allow_downgrade"]:
            return None
        return ["dnf", "-y", "--disableexcludes=main", "downgrade", *[f"{w.name}-{w.version}" for w in wanted]]

    def busy(self, done: Try) -> bool:
        return False  # dnf waits on its own lock


@dataclass
class Outcome:
    changed: bool = False
    installed: dict[str, str] = field(default_factory=dict)
    tries: list[str] = field(default_factory=list)  # each try, as the operator reads it
    failed: bool = False
    hung_tries: int = 0  # the failed step's tries that passed their bound, when its last one did
    msg: str = ""


def _describe(step: str, number: int, done: Try) -> str:
    if done.hung:
        return f"{step} try {number}: stopped at {done.took:.0f} s with the {done.stopped} processes it had started"
    return f"{step} try {number}: exit {done.rc} in {done.took:.1f} s"


def _attempt(manager, run: Runner, argv: list[str], step: str, tries: int, bound: float, delay: float,
             outcome: Outcome, sleep: Callable[[float], None]) -> tuple[Try, int, int]:
    """The step's tries until one ends neither hung nor on apt's lock, or none are left: the last
    try, how many were made and how many of them hung."""
    number, done = 1, run(argv, bound)
    outcome.tries.append(_describe(step, number, done))
    hung = int(done.hung)
    while (done.hung or manager.busy(done)) and number < tries:
        sleep(delay)
        number, done = number + 1, run(argv, bound)
        outcome.tries.append(_describe(step, number, done))
        hung += int(done.hung)
    return done, number, hung


def _failure(outcome: Outcome, manager, done: Try, step: str, made: int, hung: int, bound: float) -> Outcome:
    """What failed, as facts: what to do about a hang is the operator's view's to say (it knows
    the host and the run)."""
    outcome.failed = True
    if done.hung:
        outcome.hung_tries = hung
        outcome.msg = (f"{manager.tool} ({step}) did not finish in {bound:.0f} s on {hung} of {made} tries; each such "
                       f"try was stopped with every process it started.")
    else:
        detail = (done.err.strip() or done.out.strip()).splitlines()[-3:]
        outcome.msg = f"{manager.tool} ({step}) failed with exit {done.rc}: " + " ".join(detail)
    return outcome


def converge(manager, wanted: list[Wanted], options: dict, check_mode: bool, run: Runner,
             sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """Reads what is installed; where a wanted package is missing or at another version, reads
    the sources again (when they do not offer it, or when asked every time) and installs, each
    step in bounded tries; then reads again and fails naming any package still off. The hint
    (where the packages must come from) ends a failure that is not a hang: a hang is no
    question of where packages come from."""
    outcome = _converge(manager, wanted, options, check_mode, run, sleep)
    hint = options.get("hint", "")
    if outcome.failed and not outcome.hung_tries and hint:
        outcome.msg = f"{outcome.msg.rstrip('.')}. {hint}"
    return outcome


def _converge(manager, wanted: list[Wanted], options: dict, check_mode: bool, run: Runner,
              sleep: Callable[[float], None]) -> Outcome:
    outcome = Outcome()
    names = [w.name for w in wanted]
    current = manager.installed(run, names) if names else {}
    missing = [w for w in wanted if not w.met_by(current.get(w.name))]
    refresh = options["refresh"] == "always" or (missing and not manager.known(run, missing))
    outcome.installed = current
    if not missing and not refresh:
        return outcome
    outcome.changed = True
    if check_mode:
        return outcome
    tries, bound, delay = options["tries"], float(options["try_timeout"]), float(options["delay"])
    steps = [("reading the sources", manager.refresh())] if refresh else []
    if missing:
        steps.append(("installing " + ", ".join(w.name for w in missing), manager.install(missing, options)))
    for step, argv in steps:
        done, made, hung = _attempt(manager, run, argv, step, tries, bound, delay, outcome, sleep)
        if done.rc != 0:
            return _failure(outcome, manager, done, step, made, hung, bound)
    if missing:
        outcome.installed = manager.installed(run, names)
        still = [w for w in wanted if not w.met_by(outcome.installed.get(w.name))]
        down = manager.downgrade(still, options) if still else None
        if down:
            done, made, hung = _attempt(manager, run, down, "moving down " + ", ".join(w.name for w in still), tries,
                                  bound, delay, outcome, sleep)
            if done.rc != 0:
                return _failure(outcome, manager, done, "downgrade", made, hung, bound)
            outcome.installed = manager.installed(run, names)
            still = [w for w in wanted if not w.met_by(outcome.installed.get(w.name))]
        if still:
            outcome.failed = True
            outcome.msg = f"{manager.tool} finished, yet " + ", ".join(
                f"{w.name} is {outcome.installed.get(w.name, 'not installed')} (wanted {w.version or 'any'})"
                for w in still)
    return outcome
