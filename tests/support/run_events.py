"""The events of a `gpuboot ... --output json` run, from what it printed."""
from __future__ import annotations

import json


def events_of(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]
