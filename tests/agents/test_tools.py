"""Tools from plain functions: JSON schema from hints and docstrings, calling, options."""

from __future__ import annotations

import asyncio
import enum
import threading
import types
from typing import Any, Literal

import pytest
from pydantic import BaseModel
from typing_extensions import TypedDict

from toren.agents.tools import (
    ToolArgumentsError,
    parse_docstring,
    tool_from_function,
    tools_from_module,
)
from toren.core.agent_api.program import tool


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Address(BaseModel):
    street: str
    zip_code: int


class Item(TypedDict):
    sku: str
    qty: int


def create_ticket(
    title: str,
    count: int,
    ratio: float,
    urgent: bool,
    tags: list[str],
    meta: dict[str, int],
    note: str | None = None,
    channel: Literal["email", "chat"] = "email",
    priority: Priority = Priority.LOW,
    address: Address | None = None,
    items: list[Item] | None = None,
) -> dict[str, Any]:
    """Create a support ticket.

    Use it for anything a human must follow up.

    Args:
        title: Short summary,
            one line.
        count (int): How many.
        tags: Labels.

    Returns:
        The ticket.
    """
    return {"title": title, "priority": priority, "address": address, "items": items}


def test_schema_from_type_hints_and_docstring() -> None:
    spec = tool_from_function(create_ticket).spec
    assert spec.name == "create_ticket"
    assert (
        spec.description
        == "Create a support ticket.\n\nUse it for anything a human must follow up."
    )
    params = spec.parameters
    props = params["properties"]
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["title", "count", "ratio", "urgent", "tags", "meta"]
    assert props["title"] == {"type": "string", "description": "Short summary, one line."}
    assert props["count"] == {"type": "integer", "description": "How many."}
    assert props["ratio"] == {"type": "number"}
    assert props["urgent"] == {"type": "boolean"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "description": "Labels."}
    assert props["meta"] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert props["note"] == {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}
    assert props["channel"] == {"enum": ["email", "chat"], "type": "string", "default": "email"}
    assert props["priority"] == {"$ref": "#/$defs/Priority", "default": "low"}
    assert params["$defs"]["Priority"] == {"enum": ["low", "high"], "type": "string"}
    assert params["$defs"]["Address"]["required"] == ["street", "zip_code"]
    assert params["$defs"]["Item"]["properties"]["qty"] == {"type": "integer"}
    assert "title" not in params  # pydantic's titles are dropped: they churn digests


def test_schema_is_deterministic() -> None:
    assert tool_from_function(create_ticket).spec == tool_from_function(create_ticket).spec


async def test_call_validates_and_coerces_arguments() -> None:
    fn = tool_from_function(create_ticket).fn
    result = await fn(
        title="t",
        count="3",
        ratio=1,
        urgent=True,
        tags=[],
        meta={},
        priority="high",
        address={"street": "Main", "zip_code": "123"},
        items=[{"sku": "x", "qty": 1}],
    )
    assert result == {
        "title": "t",
        "priority": "high",
        "address": {"street": "Main", "zip_code": 123},
        "items": [{"sku": "x", "qty": 1}],
    }


async def test_bad_arguments_are_a_clear_error_for_the_model() -> None:
    fn = tool_from_function(create_ticket).fn
    with pytest.raises(ToolArgumentsError) as info:
        await fn(title="t", count="many", unknown=1)
    message = str(info.value)
    assert message.startswith("invalid arguments for tool 'create_ticket'")
    assert "count: Input should be a valid integer" in message
    assert "ratio: Field required" in message and "unknown: Extra inputs" in message


async def test_sync_tools_run_in_a_thread_and_async_tools_on_the_loop() -> None:
    seen: dict[str, Any] = {}

    def sync_tool() -> str:
        seen["sync"] = threading.current_thread()
        return "s"

    async def async_tool() -> str:
        seen["async"] = threading.current_thread()
        return "a"

    assert await tool_from_function(sync_tool).fn() == "s"
    assert await tool_from_function(async_tool).fn() == "a"
    assert seen["sync"] is not threading.main_thread()
    assert seen["async"] is threading.main_thread()


async def test_sync_tool_does_not_block_the_event_loop() -> None:
    gate = threading.Event()

    def waits() -> str:
        assert gate.wait(5)
        return "done"

    async def opens() -> None:
        await asyncio.sleep(0.01)
        gate.set()

    result, _ = await asyncio.gather(tool_from_function(waits).fn(), opens())
    assert result == "done"


def test_decorator_options() -> None:
    @tool(reexecute=True, side_effects=False, name="price_now")
    def current_price(sku: str) -> float:
        """Read the live price."""
        return 1.0

    definition = tool_from_function(current_price)
    assert definition.name == definition.spec.name == "price_now"
    assert definition.reexecute is True and definition.side_effects is False

    plain = tool_from_function(create_ticket)
    assert plain.reexecute is False and plain.side_effects is True


def test_unnameable_parameters_are_refused() -> None:
    def varargs(*items: int) -> int:
        return 0

    def kwargs(**items: int) -> int:
        return 0

    for fn in (varargs, kwargs):
        with pytest.raises(TypeError, match="every parameter must be nameable"):
            tool_from_function(fn)


def test_unhinted_parameter_accepts_anything() -> None:
    def anything(x, y: int = 2):  # type: ignore[no-untyped-def]
        return x

    props = tool_from_function(anything).spec.parameters["properties"]
    assert props["x"] == {}
    assert props["y"] == {"type": "integer", "default": 2}


def test_module_tools_are_public_functions_defined_there() -> None:
    module = types.ModuleType("agent_tools")
    source = '''
import json
from json import dumps
from toren.core.agent_api.program import tool

def public(a: int) -> int:
    """Public."""
    return a

def _private() -> None:
    pass

@tool(name="renamed")
def decorated() -> str:
    return "x"

class NotATool:
    pass
'''
    exec(compile(source, "agent_tools.py", "exec"), module.__dict__)
    assert list(tools_from_module(module)) == ["public", "renamed"]


def test_module_all_narrows_the_tools() -> None:
    module = types.ModuleType("agent_tools2")
    exec("__all__ = ['b']\ndef a() -> None: ...\ndef b() -> None: ...\n", module.__dict__)
    assert list(tools_from_module(module)) == ["b"]


def test_docstring_parsing_variants() -> None:
    summary, params = parse_docstring(
        """Do a thing.

        Args:
            first (str): One.
            second: Two,
                continued.
            *rest: Ignored star.

        Raises:
            ValueError: never an argument.
        """
    )
    assert summary == "Do a thing."
    assert params == {"first": "One.", "second": "Two, continued.", "rest": "Ignored star."}

    summary, params = parse_docstring(
        "Sphinx style.\n\n:param a: the a\n:param int b: the b\n:returns: x\n"
    )
    assert summary == "Sphinx style."
    assert params["a"] == "the a" and params["b"] == "the b"
    assert parse_docstring(None) == ("", {})
