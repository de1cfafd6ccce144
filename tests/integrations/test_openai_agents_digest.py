"""The neutral form of an OpenAI Agents SDK request (docs/openai-agents.md, "The neutral
request") is pinned: the same SDK request always has the same digest, whatever the SDK's
own serialisation. A failure here means in-flight runs of SDK agents would be invalidated
(and their model calls paid again) by the change that made it fail."""

from __future__ import annotations

from typing import Any

import pytest

from toren.core.contract.digest import canonical_json, model_digest

pytest.importorskip("agents")

from openai.types.shared import Reasoning
from pydantic import BaseModel

from agents import Agent, AgentOutputSchema, ModelSettings, function_tool, handoff
from toren.integrations.openai_agents import neutral_request


@function_tool
def lookup_order(order_id: str) -> dict[str, str]:
    """Look an order up."""
    return {"order": order_id}


BILLING = Agent(name="billing", instructions="You are billing.")

# A conversation as the SDK hands it to a model: a user message, the assistant's text and
# function call (with the SDK's ids and statuses), its output, a reasoning item.
INPUT: list[Any] = [
    {"role": "user", "content": "Where is A-17?"},
    {"type": "reasoning", "id": "rs_1", "summary": []},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Looking.", "annotations": []}],
    },
    {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "c1",
        "name": "lookup_order",
        "arguments": '{"order_id": "A-17"}',
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "c1", "output": '{"order": "A-17"}'},
]


class Ticket(BaseModel):
    order: str
    status: str


def test_a_tool_turn_with_a_handoff_has_a_pinned_digest() -> None:
    settings = ModelSettings(
        temperature=0.2,
        reasoning=Reasoning(effort="low"),
        extra_headers={"x-secret": "not in the digest"},
        include_usage=True,
    )
    request = neutral_request(
        "You are triage.",
        INPUT,
        settings,
        [lookup_order],
        None,
        [handoff(BILLING)],
        provider="openai-responses",
        model="gpt-4.1",
    )
    assert request.messages == (
        {"role": "system", "content": "You are triage."},
        {"role": "user", "content": "Where is A-17?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [{"id": "c1", "name": "lookup_order", "arguments": {"order_id": "A-17"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"order": "A-17"}'},
    )
    assert [t.name for t in request.tools] == ["lookup_order", "transfer_to_billing"]
    assert "extra_headers" not in request.params and "include_usage" not in request.params
    # Unset fields are left out at every depth: a release that adds one keeps the digest.
    assert (
        canonical_json(dict(request.params)) == b'{"reasoning":{"effort":"low"},"temperature":0.2}'
    )
    assert model_digest(request) == DIGESTS["tool_turn"]


def test_a_structured_output_type_enters_as_output_schema() -> None:
    request = neutral_request(
        None,
        "Where is A-17?",
        ModelSettings(),
        [],
        AgentOutputSchema(Ticket),
        [],
        provider="openai",
        model="gpt-4o-mini",
    )
    assert request.messages == ({"role": "user", "content": "Where is A-17?"},)
    schema = request.params["output_schema"]
    assert schema["name"] == "Ticket" and schema["strict"] is True
    assert model_digest(request) == DIGESTS["output_schema"]


# Computed with openai-agents 0.24.0 when the integration was written; never changed.
DIGESTS = {
    "tool_turn": "bf4dcf8868ee652cc21a37a4809db52fdf6710585f6edfa0e6b01416fec2f2ac",
    "output_schema": "9a5186149ec04b768d0f3c05e2a5bda48bb359ee8f53643dec2eb0a3e8182935",
}
