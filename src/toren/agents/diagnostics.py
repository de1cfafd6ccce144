"""Turning bad agent.yaml input into one clear :class:`AgentConfigError`.

Every problem is reported the same way, so a user learns one shape::

    /srv/agents/support/agent.yaml:7: at 'limits.max_steps': found -3 (integer);
    expected an integer >= 1

file (and line when known), the key path, what was found, what is expected. Several
problems are listed one per line under a count.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from toren._yamlcheck import MISSING as _MISSING
from toren._yamlcheck import Loc, Problem, config_error, describe_found, format_path
from toren.agents.config import PATTERN_HELP

__all__ = [
    "Loc",
    "Problem",
    "config_error",
    "describe_found",
    "format_path",
    "problems_from_pydantic",
]


def _value_at(data: Any, loc: Loc) -> Any:
    for part in loc:
        in_mapping = isinstance(data, Mapping) and part in data
        in_list = isinstance(data, list) and isinstance(part, int) and part < len(data)
        if not (in_mapping or in_list):
            return _MISSING
        data = data[part]
    return data


# -- which model sits at a key path (for "expected one of these keys") ------------------


def _unwrap(annotation: object) -> list[object]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _unwrap(arg)]
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return [annotation]


def _model_at(root: type[BaseModel], loc: Loc) -> type[BaseModel] | None:
    current: object = root
    for part in loc:
        nxt = None
        for option in _unwrap(current):
            if isinstance(option, type) and issubclass(option, BaseModel) and isinstance(part, str):
                field = option.model_fields.get(part) or next(
                    (f for f in option.model_fields.values() if f.alias == part), None
                )
                if field is not None:
                    nxt = field.annotation
            elif typing.get_origin(option) in (dict, Mapping):
                nxt = typing.get_args(option)[1]
            elif typing.get_origin(option) in (list, Sequence) and isinstance(part, int):
                nxt = typing.get_args(option)[0]
            if nxt is not None:
                break
        if nxt is None:
            return None
        current = nxt
    models = [o for o in _unwrap(current) if isinstance(o, type) and issubclass(o, BaseModel)]
    return models[0] if models else None


def allowed_keys(root: type[BaseModel], loc: Loc) -> list[str]:
    model = _model_at(root, loc)
    if model is None:
        return []
    return sorted(f.alias or name for name, f in model.model_fields.items())


# -- pydantic errors -> problems --------------------------------------------------------

_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "decimal_type": "a number",
    "decimal_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "a mapping of keys to values",
    "model_type": "a mapping of keys to values",
    "model_attributes_type": "a mapping of keys to values",
    "list_type": "a list",
    "string_too_short": "a non-empty string",
}


def _expected(err: Mapping[str, Any]) -> str:
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _EXPECTED:
        return _EXPECTED[kind]
    if kind == "greater_than_equal":
        return f"a number >= {ctx.get('ge')}"
    if kind == "greater_than":
        return f"a number > {ctx.get('gt')}"
    if kind == "less_than_equal":
        return f"a number <= {ctx.get('le')}"
    if kind == "less_than":
        return f"a number < {ctx.get('lt')}"
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        return PATTERN_HELP.get(pattern, f"a string matching {pattern}")
    if kind == "literal_error":
        return f"one of {ctx.get('expected')}"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    return str(err["msg"])


def problems_from_pydantic(
    exc: ValidationError, data: object, root: type[BaseModel]
) -> list[Problem]:
    problems = []
    for err in exc.errors(include_url=False):
        loc: Loc = tuple(p for p in err["loc"] if isinstance(p, (str, int)))
        if err["type"] == "extra_forbidden":
            problems.append(_unknown_key(loc, root))
        elif err["type"] == "missing":
            problems.append(Problem(loc, describe_found(_MISSING), _missing_expected(loc, root)))
        else:
            value = _value_at(data, loc)
            found = _redacted(value) if _secretish(loc) else describe_found(value)
            problems.append(Problem(loc, found, _expected(err)))
    return problems


def _secretish(loc: Loc) -> bool:
    last = str(loc[-1]).lower() if loc else ""
    return any(word in last for word in ("key", "secret", "token", "password"))


def _redacted(value: object) -> str:
    if isinstance(value, str):
        return f"a string of {len(value)} characters (not shown: it may be a secret)"
    return describe_found(value)


def _unknown_key(loc: Loc, root: type[BaseModel]) -> Problem:
    key = str(loc[-1])
    allowed = [k for k in allowed_keys(root, loc[:-1]) if k != "$schema" or not loc[:-1]]
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return Problem(
        loc, f"unknown key {key!r}", f"one of the known keys: {', '.join(allowed)}{hint}"
    )


def _missing_expected(loc: Loc, root: type[BaseModel]) -> str:
    model = _model_at(root, loc[:-1])
    field = model.model_fields.get(str(loc[-1])) if model else None
    desc = f" ({field.description.rstrip('.')})" if field and field.description else ""
    return f"the required key {str(loc[-1])!r}{desc}"
