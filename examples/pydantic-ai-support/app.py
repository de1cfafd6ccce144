"""A support agent written with pydantic-ai, unmodified, run by Toren.

It looks the order up, emails the customer (a side effect Toren never repeats: not after
a crash, not after a deploy that edits the prompt) and answers with a structured Ticket.
A refund needs a human's approval: the run waits durably for a message `approval`.

Offline by default: the model is pydantic-ai's FunctionModel playing a scripted support
conversation. For a real model set PYDANTIC_AI_SUPPORT_MODEL, e.g. `openai:gpt-4o-mini`
(with OPENAI_API_KEY). Emails go to the file SUPPORT_AGENT_OUTBOX (default: outbox.jsonl
in the working directory).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests, ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from toren import tool


class Ticket(BaseModel):
    order: str
    status: str
    emailed: bool


def scripted(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """The offline model: look up, email, answer."""
    done = [p.tool_name for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    if "lookup_order" not in done:
        call = ToolCallPart(tool_name="lookup_order", args={"order_id": "A-17"})
    elif "send_email" not in done:
        body = "Your order A-17 has shipped."
        call = ToolCallPart(tool_name="send_email", args={"to": "c@example.com", "body": body})
    else:
        ticket = {"order": "A-17", "status": "shipped", "emailed": True}
        call = ToolCallPart(tool_name="final_result", args=ticket)
    return ModelResponse(parts=[call])


model: Any = os.environ.get("PYDANTIC_AI_SUPPORT_MODEL") or FunctionModel(scripted)

agent = Agent(
    model,
    name="support",
    instructions=(
        "You are a support agent. Look the order up, email the customer what you found, "
        "then answer with the ticket. Refunds need a human's approval."
    ),
    output_type=[Ticket, DeferredToolRequests],
)


@agent.tool_plain
@tool(side_effects=False)  # a read: after an invalidation it runs again (fresh data)
def lookup_order(order_id: str) -> dict[str, str]:
    """Look an order up by its id."""
    return {"order": order_id, "status": "shipped", "carrier": "DHL"}


@agent.tool_plain
def send_email(to: str, body: str) -> str:
    """Email the customer."""
    outbox = Path(os.environ.get("SUPPORT_AGENT_OUTBOX", "outbox.jsonl"))
    with outbox.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"to": to, "body": body}) + "\n")
    return "sent"


@agent.tool_plain(requires_approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order (a human approves it first)."""
    return f"refunded {amount} on {order_id}"
