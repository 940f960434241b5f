"""A chart double's schema at one chart version (tests/support/chart_versions.py)."""
from __future__ import annotations

import json

import jsonschema
import pytest

from tests.support.chart_versions import SINCE, schema_at, version_tuple

# A values schema with a key the chart gained at v26.3.0 (the GPU Operator's cdi.nriPluginEnabled).
GPU_OPERATOR = {"type": "object", "additionalProperties": False, "properties": {
    "cdi": {"type": "object", "additionalProperties": False, "properties": {
        "enabled": {"type": "boolean"}, "nriPluginEnabled": {"type": "boolean", SINCE: "v26.3.0"}}}}}


def test_a_key_newer_than_the_version_is_refused_and_older_or_equal_accepted():
    values = {"cdi": {"enabled": True, "nriPluginEnabled": True}}
    with pytest.raises(jsonschema.ValidationError, match="nriPluginEnabled"):
        jsonschema.validate(values, schema_at(GPU_OPERATOR, "v25.3.2"))
    for version in ("v26.3.0", "v26.7.0", "27.1"):
        jsonschema.validate(values, schema_at(GPU_OPERATOR, version))


def test_the_marks_are_gone_and_the_source_is_untouched():
    pruned = schema_at(GPU_OPERATOR, "v26.7.0")
    assert SINCE not in json.dumps(pruned)
    assert SINCE in json.dumps(GPU_OPERATOR)


@pytest.mark.parametrize(("text", "parsed"), [("v26.7.0", (26, 7, 0)), ("3.32.1", (3, 32, 1)), ("v1.2", (1, 2))])
def test_versions_read_with_or_without_v(text, parsed):
    assert version_tuple(text) == parsed


def test_a_tag_that_is_no_version_is_an_error():
    with pytest.raises(ValueError, match="argo-cd-10.1.1"):
        version_tuple("argo-cd-10.1.1")
