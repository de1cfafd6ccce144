"""Triage hands off to billing, which emails the customer: an OpenAI Agents SDK agent graph
run unmodified by Toren (docs/openai-agents.md).

Offline and deterministic: the model is Toren's scripted model (script.yaml). For a real
one (OPENAI_API_KEY exported), set MODEL below to

    OpenAIResponsesModel(model="gpt-4.1", openai_client=AsyncOpenAI())

(``from agents import OpenAIResponsesModel``, ``from openai import AsyncOpenAI``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from agents import Agent, function_tool
from toren.integrations.openai_agents import TorenModel, tool_options

MODEL = TorenModel("scripted:script.yaml")


@function_tool
def lookup_order(order_id: str) -> dict[str, str]:
    """Look an order up by its id, e.g. A-17."""
    return {"order": order_id, "status": "shipped", "carrier": "DHL"}


lookup_order = tool_options(lookup_order, side_effects=False)  # a read


@function_tool
def send_email(to: str, subject: str, body: str) -> str:
    """Email the customer. A side effect: Toren records it once and never repeats it."""
    outbox = Path(os.environ.get("SUPPORT_AGENT_OUTBOX", "outbox.jsonl"))
    with outbox.open("a", encoding="utf-8") as out:
        out.write(json.dumps({"to": to, "subject": subject, "body": body}) + "\n")
    return "sent"


billing = Agent(
    name="billing",
    instructions="You are billing. Email the customer a one-line summary of their order.",
    model=MODEL,
    tools=[send_email],
)

agent = Agent(
    name="triage",
    instructions="You are triage. Look the order up, then hand off to billing.",
    model=MODEL,
    tools=[lookup_order],
    handoffs=[billing],
)
