"""A chart double's values schema at one chart version: a property the real chart gained in a
later release carries `x-gpuboot-since: <version>` (JSON Schema ignores the keyword), and is
dropped from the schema of an earlier version, so the double at that version refuses it."""
from __future__ import annotations

import copy
import re

SINCE = "x-gpuboot-since"


def version_tuple(version: str) -> tuple[int, ...]:
    found = re.match(r"v?(\d+(?:\.\d+)*)", version)
    if not found:
        raise ValueError(f"not a chart version: {version!r}")
    return tuple(int(part) for part in found.group(1).split("."))


def schema_at(schema: dict, version: str) -> dict:
    """A copy of `schema` without the properties newer than `version`, and without the marks."""
    wanted = version_tuple(version)

    def prune(node):
        if isinstance(node, dict):
            properties = node.get("properties")
            if isinstance(properties, dict):
                node["properties"] = {key: sub for key, sub in properties.items()
                                      if not (isinstance(sub, dict) and SINCE in sub
                                              and version_tuple(sub[SINCE]) > wanted)}
            node.pop(SINCE, None)
            for value in node.values():
                prune(value)
        elif isinstance(node, list):
            for value in node:
                prune(value)
        return node

    return prune(copy.deepcopy(schema))
