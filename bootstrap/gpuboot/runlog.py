"""The run log: one line per event, plain text, beside the run's ansible artifacts."""
from __future__ import annotations

import json
import time
from pathlib import Path

from gpuboot.events import Event, RunStarted


class RunLog:
    """Opens its file on RunStarted (which names it) and appends every event after."""

    def __init__(self) -> None:
        self.handle = None

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            path = Path(event.log)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = path.open("a")
        if self.handle is None:
            return
        stamp = time.strftime("%H:%M:%S")
        self.handle.write(f"{stamp} {event.kind} {json.dumps(_fields(event), default=str)}\n")
        self.handle.flush()


def _fields(event: Event) -> dict:
    data = event.to_dict()
    data.pop("event")
    return data


def tee(*sinks):
    def fan_out(event: Event) -> None:
        for sink in sinks:
            sink(event)
    return fan_out
