#!/usr/bin/python
"""Wait until every Argo CD Application the handoff expects exists and is Synced and Healthy,
and has stayed so for `settle` seconds; else name each one that is not, with Argo CD's own
reason (its conditions, the last sync's message, the resources that are out of sync or
unhealthy). It writes one thing: an Application whose last comparison failed (the repo server
was still starting when Argo CD first looked) is asked once to refresh, with Argo CD's own
annotation, instead of waiting for its next reconciliation (3 minutes by default); that is
reported as a change."""
from __future__ import annotations

import json
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: gpuboot_argocd_apps
short_description: Wait for Argo CD Applications to be Synced and Healthy, naming those that are not (refreshing one whose comparison failed)
options:
  kubeconfig: {type: path, required: true, description: Admin kubeconfig.}
  namespace: {type: str, default: argocd, description: Argo CD's namespace.}
  expected: {type: list, elements: str, required: true, description: Applications that must exist.}
  timeout: {type: int, default: 600, description: Seconds to wait.}
  settle: {type: int, default: 10, description: Seconds every Application must stay Synced and Healthy.}
"""


def problems(apps: dict[str, dict], expected: list[str]) -> dict[str, str]:
    """Application name -> why it is not Synced and Healthy (absent: it is)."""
    found: dict[str, str] = {}
    for name in expected:
        if name not in apps:
            found[name] = "does not exist yet (its parent has not created it)"
    for name, app in sorted(apps.items()):
        status = app.get("status") or {}
        sync = (status.get("sync") or {}).get("status", "Unknown")
        health = (status.get("health") or {}).get("status", "Unknown")
        if sync == "Synced" and health == "Healthy":
            continue
        reasons = [f"sync {sync}, health {health}"]
        message = (status.get("health") or {}).get("message")
        if message:
            reasons.append(message)
        reasons += [f"{c.get('type')}: {c.get('message')}" for c in status.get("conditions") or []]
        operation = status.get("operationState") or {}
        if operation.get("phase") in ("Failed", "Error") and operation.get("message"):
            reasons.append(f"last sync {operation['phase']}: {operation['message']}")
        for resource in status.get("resources") or []:
            bad_sync = resource.get("status") not in (None, "Synced")
            bad_health = (resource.get("health") or {}).get("status") not in (None, "Healthy")
            if bad_sync or bad_health:
                what = f"{resource.get('kind')}/{resource.get('name')}"
                if resource.get("namespace"):
                    what = f"{resource['namespace']}/{what}"
                detail = (resource.get("health") or {}).get("message") or ""
                reasons.append(f"{what} {resource.get('status', '')} {(resource.get('health') or {}).get('status', '')}"
                               f"{': ' + detail if detail else ''}".replace("  ", " "))
        found[name] = "; ".join(reasons[:8])
    return found


def comparison_failed(app: dict) -> bool:
    return any(c.get("type") == "ComparisonError" for c in (app.get("status") or {}).get("conditions") or [])


def refresh(module: AnsibleModule, name: str) -> None:
    p = module.params
    subprocess.run(["kubectl", "--kubeconfig", p["kubeconfig"], "-n", p["namespace"], "annotate", "--overwrite",
                    "applications.argoproj.io", name, "argocd.argoproj.io/refresh=normal"],
                   capture_output=True, text=True, check=False, timeout=60)


def read(module: AnsibleModule) -> dict[str, dict]:
    p = module.params
    proc = subprocess.run(["kubectl", "--kubeconfig", p["kubeconfig"], "-n", p["namespace"], "get",
                           "applications.argoproj.io", "-o", "json"], capture_output=True, text=True, check=False,
                          timeout=60)
    if proc.returncode != 0:
        return {}
    return {item["metadata"]["name"]: item for item in json.loads(proc.stdout).get("items", [])}


def main() -> None:
    module = AnsibleModule(argument_spec={
        "kubeconfig": {"type": "path", "required": True},
        "namespace": {"type": "str", "default": "argocd"},
        "expected": {"type": "list", "elements": "str", "required": True},
        "timeout": {"type": "int", "default": 600},
        "settle": {"type": "int", "default": 10},
    }, supports_check_mode=True)
    deadline = time.monotonic() + module.params["timeout"]
    green_since = None
    refreshed: set[str] = set()
    while True:
        apps = read(module)
        for name, app in apps.items():
            if name not in refreshed and comparison_failed(app) and not module.check_mode:
                refresh(module, name)
                refreshed.add(name)
        found = problems(apps, module.params["expected"])
        now = time.monotonic()
        if not found:
            green_since = green_since or now
            if now - green_since >= module.params["settle"]:
                module.exit_json(changed=bool(refreshed), refreshed=sorted(refreshed), applications=sorted(apps))
        else:
            green_since = None
        if now > deadline:
            lines = [f"{name}: {why}" for name, why in sorted(found.items())]
            module.fail_json(msg=f"{len(found)} Argo CD Application(s) not Synced and Healthy after "
                                 f"{module.params['timeout']} s: " + " | ".join(lines),
                             not_ready=found, applications=sorted(apps), changed=bool(refreshed))
        time.sleep(3)


if __name__ == "__main__":
    main()
