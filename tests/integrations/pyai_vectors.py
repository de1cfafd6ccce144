"""The pydantic-ai requests of the golden digest vectors (docs/digest.md, "pydantic-ai
requests"). Built from pydantic-ai's public message and tool types only, with fields
every supported release has, so the same file runs under each release CI tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters
from pydantic_ai.output import OutputObjectDefinition
from pydantic_ai.tools import ToolDefinition

from toren.core.contract.digest import model_digest
from toren.integrations.pydantic_ai import neutral_request

# Timestamps differ run to run; they must not reach the digest.
WHEN = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)

LOOKUP = ToolDefinition(
    name="lookup_order",
    description="Look an order up.",
    parameters_json_schema={
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
        "additionalProperties": False,
    },
)
TICKET_SCHEMA = {
    "type": "object",
    "title": "Ticket",
    "properties": {"order": {"type": "string"}, "status": {"type": "string"}},
    "required": ["order", "status"],
}
OUTPUT = ToolDefinition(
    name="final_result",
    description="The final response which ends this conversation",
    parameters_json_schema=TICKET_SCHEMA,
    kind="output",
)


def _asked(prompt: str, instructions: str | None = None) -> ModelRequest:
    return ModelRequest(
        parts=[UserPromptPart(content=prompt, timestamp=WHEN)], instructions=instructions
    )


def cases() -> dict[str, tuple[list[Any], dict[str, Any] | None, ModelRequestParameters, str]]:
    """name -> (messages, settings, parameters, model): each vector's request."""
    called = ModelResponse(
        parts=[
            TextPart(content="Let me look."),
            ToolCallPart(tool_name="lookup_order", args={"order_id": "A-17"}, tool_call_id="c1"),
        ],
        model_name="gpt-4o-mini",
        timestamp=WHEN,
    )
    answered = ModelRequest(
        parts=[
            ToolReturnPart(
                tool_name="lookup_order",
                content={"order": "A-17", "status": "shipped"},
                tool_call_id="c1",
                timestamp=WHEN,
            )
        ],
        instructions="You are a support agent.",
    )
    tool_params = ModelRequestParameters(
        function_tools=[LOOKUP], output_mode="tool", output_tools=[OUTPUT], allow_text_output=False
    )
    return {
        "prompt": (
            [_asked("Where is A-17?", "You are a support agent.")],
            {"temperature": 0.2},
            ModelRequestParameters(),
            "gpt-4o-mini",
        ),
        "tools-and-output-tool": (
            [_asked("Where is A-17?", "You are a support agent."), called, answered],
            {"temperature": 0.2, "max_tokens": 300, "timeout": 30},
            tool_params,
            "gpt-4o-mini",
        ),
        "native-output-and-system-prompt": (
            [
                ModelRequest(
                    parts=[
                        SystemPromptPart(content="Reply as JSON.", timestamp=WHEN),
                        UserPromptPart(content=["Where is", "A-17?"], timestamp=WHEN),
                    ]
                )
            ],
            {"extra_body": {"seed": 7}, "extra_headers": {"x-trace": "1"}},
            ModelRequestParameters(
                output_mode="native",
                output_object=OutputObjectDefinition(json_schema=TICKET_SCHEMA, name="Ticket"),
            ),
            "claude-3-5-haiku-latest",
        ),
    }


def digests() -> dict[str, str]:
    out = {}
    for name, (messages, settings, params, model) in cases().items():
        provider = "anthropic" if model.startswith("claude") else "openai"
        request = neutral_request(messages, settings, params, provider=provider, model=model)
        out[name] = model_digest(request)
    return out


def forms() -> dict[str, dict[str, Any]]:
    """Each vector's neutral request, as docs/digest.md shows it."""
    out = {}
    for name, (messages, settings, params, model) in cases().items():
        provider = "anthropic" if model.startswith("claude") else "openai"
        r = neutral_request(messages, settings, params, provider=provider, model=model)
        out[name] = {
            "provider": r.provider,
            "model": r.model,
            "messages": [dict(m) for m in r.messages],
            "tools": [t.to_dict() for t in r.tools],
            "params": dict(r.params),
        }
    return out
