"""Turns pydantic validation errors into located problems with a fix."""
from __future__ import annotations

import difflib
import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from gpuboot.config.inventory import Where
from gpuboot.config.model import FORMS
from gpuboot.errors import Problem, dotted

FIXES = {
    "ip_v4_address": "write four numbers from 0 to 255, e.g. 10.0.0.100",
    "ip_v4_network": "write a network in CIDR form, e.g. 10.244.0.0/16",
    "missing": "add it",
    "int_parsing": "write a whole number",
    "int_type": "write a whole number",
    "bool_parsing": "write true or false",
    "bool_type": "write true or false",
    "string_type": "write a string (quote it if YAML reads it as something else)",
    "list_type": "write a YAML list (- item)",
    "model_type": "write a mapping of key: value",
    "dict_type": "write a mapping of key: value",
}


def _fields_of(model: type[BaseModel], loc: tuple) -> list[str] | None:
    """The field names allowed at `loc` inside `model`, following nested models and lists."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(part)
        if field is None:
            return None
        current = _unwrap(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return None


def _unwrap(annotation: Any) -> Any:
    """Find the model inside Optional[...], list[...] and Annotated[...]."""
    for arg in (typing.get_args(annotation) or ()):
        inner = _unwrap(arg)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return inner
    return annotation


def _message(err: dict, fields: list[str] | None) -> tuple[str, str | None]:
    kind = err["type"]
    value = err.get("input")
    shown = repr(value) if isinstance(value, str) and not value.strip() else value
    if kind == "ip_v4_address":
        return f"{shown} is not an IPv4 address", FIXES[kind]
    if kind == "ip_v4_network":
        return f"{shown} is not an IPv4 network", FIXES[kind]
    if kind == "missing":
        return "is required but missing", FIXES[kind]
    if kind == "extra_forbidden":
        key = str(err["loc"][-1])
        close = difflib.get_close_matches(key, fields or [], n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else (
            f"allowed keys here: {', '.join(fields)}" if fields else "remove it")
        return f"unknown key '{key}'", hint
    if kind == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        return f"{shown!r} is not allowed", f"use one of {expected}"
    if kind == "string_pattern_mismatch":
        pattern = err["ctx"]["pattern"]
        form = FORMS.get(pattern)
        return f"{shown!r} has the wrong form", f"write {form}" if form else f"it must match {pattern}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        bound = err["msg"].lower().removeprefix("input should be ")
        return f"{shown} is out of range", f"use a value {bound}"
    if kind in ("value_error", "assertion_error"):
        # Our validators write "what is wrong; how to fix it".
        msg = err["msg"].removeprefix("Value error, ")
        what, _, fix = msg.partition("; ")
        return what, fix or None
    return f"{err['msg']} (got {shown!r})", FIXES.get(kind)


def problems_from(exc: ValidationError, model: type[BaseModel], where: Where, prefix: str) -> list[Problem]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        parent = loc[:-1] if err["type"] == "extra_forbidden" else loc
        message, fix = _message(err, _fields_of(model, parent))
        problems.append(Problem(where.file, where.child(*loc).line, dotted(prefix, *loc), message, fix))
    return problems
