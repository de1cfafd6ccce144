"""Plain Python functions as tools: a JSON Schema from type hints and docstrings.

A tool's schema enters the digest of every model call that offers it, so it must be a
pure function of the code: the same signature and docstring give the same bytes on every
machine. Pydantic generates it; the ``title`` keys pydantic adds are dropped because they
restate the names and would make schemas churn with pydantic's naming rules.

The :class:`ToolDef` built here wraps the function in ``async def call(**arguments)``: it
validates the model's arguments against the same schema (so ``"3"`` for an ``int`` is
coerced and a missing argument is a clear error the model sees), runs a sync function in
a worker thread so it cannot block the event loop, and turns the result into JSON values,
which is what the event log records.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import types
from collections.abc import Callable, Mapping
from typing import Any, get_type_hints

from pydantic import ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from toren.core.agent_api.program import ToolDef
from toren.providers.base import ToolSpec

__all__ = [
    "ToolArgumentsError",
    "parse_docstring",
    "tool_from_function",
    "tools_from_module",
]


class ToolArgumentsError(ValueError):
    """The model called a tool with arguments that do not fit its schema."""


_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Raises|Yields?|Examples?|Notes?|"
    r"Attributes|See Also|Warnings?)\s*:\s*$"
)
_ARG_LINE = re.compile(r"^(\*{0,2}\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a Google-style (or Sphinx ``:param x:``) docstring into the description and
    the per-argument descriptions."""
    summary: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for raw in inspect.cleandoc(doc or "").splitlines():
        line = raw.strip()
        indent = len(raw) - len(raw.lstrip())
        header = _SECTION.match(line)
        sphinx = _SPHINX_PARAM.match(line)
        if header and indent == 0:
            section, current, arg_indent = header.group(1).lower(), None, None
        elif sphinx:
            section, current = "sphinx", sphinx.group(1)
            params[current] = sphinx.group(2).strip()
        elif line.startswith(":") and section == "sphinx":
            section, current = "sphinx-other", None
        elif section is None:
            summary.append(line)
        elif not line or section not in _ARG_SECTIONS:
            continue
        elif (match := _ARG_LINE.match(line)) and (arg_indent is None or indent <= arg_indent):
            # A new argument starts at the section's indentation; deeper lines continue it.
            current, arg_indent = match.group(1).lstrip("*"), indent
            params[current] = match.group(3).strip()
        elif current is not None:
            params[current] = f"{params[current]} {line}".strip()
    return "\n".join(summary).strip(), params


_ARG_SECTIONS = ("args", "arguments", "parameters", "params", "sphinx")


def _strip_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            key: _strip_titles(value)
            for key, value in node.items()
            if not (key == "title" and isinstance(value, str))
        }
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    return node


def _options(fn: Callable[..., Any]) -> dict[str, Any]:
    return dict(getattr(fn, "__toren_tool__", None) or {})


def tool_from_function(fn: Callable[..., object], *, name: str | None = None) -> ToolDef:
    """Build a :class:`ToolDef` from a plain (sync or async) function.

    Options set with ``@toren.tool(...)`` (``reexecute``, ``side_effects``, ``name``) are
    honoured. Raises :class:`TypeError` for signatures a model cannot call (``*args``,
    ``**kwargs``, positional-only parameters) or hints pydantic cannot describe.
    """
    opts = _options(fn)
    tool_name = name or opts.get("name") or fn.__name__
    description, arg_docs = parse_docstring(inspect.getdoc(fn))
    model = _arguments_model(fn, tool_name, arg_docs)
    schema = _strip_titles(model.model_json_schema())
    schema.setdefault("properties", {})
    spec = ToolSpec(name=tool_name, description=description, parameters=schema)
    return ToolDef(
        name=tool_name,
        fn=_make_caller(fn, model, tool_name),
        spec=spec,
        reexecute=bool(opts.get("reexecute", False)),
        side_effects=bool(opts.get("side_effects", True)),
    )


def _arguments_model(fn: Callable[..., Any], tool_name: str, arg_docs: Mapping[str, str]) -> Any:
    signature = inspect.signature(fn)
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise TypeError(f"cannot read the type hints of tool {tool_name!r}: {exc}") from exc
    fields: dict[str, Any] = {}
    for pname, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise TypeError(
                f"tool {tool_name!r}: parameter {pname!r} is {param.kind.description}; "
                "a model passes arguments by name, so every parameter must be nameable"
            )
        annotation = hints.get(pname, object)
        default = ... if param.default is param.empty else param.default
        fields[pname] = (annotation, Field(default, description=arg_docs.get(pname)))
    try:
        model = create_model(
            f"{tool_name}_arguments",
            __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
            **fields,
        )
        model.model_json_schema()
    except Exception as exc:
        raise TypeError(f"tool {tool_name!r}: cannot build a JSON schema: {exc}") from exc
    return model


def _make_caller(fn: Callable[..., Any], model: Any, tool_name: str) -> Callable[..., Any]:
    is_async = inspect.iscoroutinefunction(inspect.unwrap(fn))

    @functools.wraps(fn)
    async def call(**arguments: object) -> object:
        try:
            validated = model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolArgumentsError(_describe_arguments_error(tool_name, exc)) from None
        kwargs = {key: getattr(validated, key) for key in type(validated).model_fields}
        if is_async:
            result = await fn(**kwargs)
        else:
            result = await asyncio.to_thread(fn, **kwargs)
            if inspect.isawaitable(result):
                result = await result
        return to_jsonable_python(result)

    return call


def _describe_arguments_error(tool_name: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors(include_url=False):
        where = ".".join(str(p) for p in err["loc"]) or "(arguments)"
        problems.append(f"{where}: {err['msg']}")
    return f"invalid arguments for tool {tool_name!r}: " + "; ".join(problems)


def is_tool_candidate(module: types.ModuleType, attr: str, value: object) -> bool:
    """Public functions defined in the module itself, and anything marked ``@toren.tool``.

    Functions merely imported into tools.py (``from json import dumps``) are not tools.
    """
    if hasattr(value, "__toren_tool__"):
        return True
    if attr.startswith("_") or not inspect.isfunction(value):
        return False
    return getattr(value, "__module__", None) == module.__name__


def tools_from_module(module: types.ModuleType) -> dict[str, ToolDef]:
    """Every tool of a loaded ``tools.py``, by tool name, in definition order.

    A module ``__all__`` narrows the candidates to the names it lists.
    """
    names = getattr(module, "__all__", None)
    tools: dict[str, ToolDef] = {}
    for attr, value in vars(module).items():
        if names is not None and attr not in names:
            continue
        if not is_tool_candidate(module, attr, value):
            continue
        try:
            tool = tool_from_function(value)
        except TypeError as exc:
            exc.function = value  # type: ignore[attr-defined]
            raise
        if tool.name in tools:
            raise TypeError(f"two functions define the tool name {tool.name!r}")
        tools[tool.name] = tool
    return tools
