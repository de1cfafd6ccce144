"""The pydantic-ai agent the integration tests run: written into an agent directory with
the fake server's base URL and the outbox path in its text (so each test's directory has
its own content hash, and its own module)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.providers.fakes import FAKE_KEY, Completion, FakeToolCall

FOLLOWUP = "Once a tool has answered, reply with the ticket and nothing else."

APP = '''\
import json
from pathlib import Path

from pydantic import BaseModel
from pydantic_ai import Agent, DeferredToolRequests, RunContext
from pydantic_ai.messages import ToolReturnPart

import toren

{model_code}

OUTBOX = Path({outbox!r})
FOLLOWUP = {followup!r}


def _did(tool: str, **args) -> None:
    """A tool's effect, counted: one outbox line each time it happens."""
    with OUTBOX.open("a") as out:
        out.write(json.dumps({{"tool": tool, **args}}) + "\\n")


class Ticket(BaseModel):
    order: str
    status: str
    notes: list[str] = []


agent = Agent(
    model,
    name="support",
    instructions="You are a support agent. Look orders up before answering.",
    output_type=[Ticket, DeferredToolRequests],
    model_settings={{"temperature": 0.2, "max_tokens": 300}},
)


@agent.instructions
def followup(ctx: RunContext) -> str:
    answered = any(
        isinstance(part, ToolReturnPart) for message in ctx.messages for part in message.parts
    )
    return FOLLOWUP if answered else ""


@agent.tool_plain
@toren.tool(side_effects=False)
def lookup_order(order_id: str) -> dict:
    """Look an order up."""
    _did("lookup_order", order_id=order_id)
    return {{"order": order_id, "status": "shipped"}}


@agent.tool_plain
def send_email(to: str, body: str) -> str:
    """Send an email (a side effect)."""
    _did("send_email", to=to, body=body)
    return "sent"


@agent.tool_plain(requires_approval=True)
def refund(order_id: str, amount: float) -> str:
    """Refund an order (needs a human's approval)."""
    _did("refund", order_id=order_id)
    return "refunded"
'''

MODELS = {
    "openai": (
        "from pydantic_ai.models.openai import OpenAIChatModel\n"
        "from pydantic_ai.providers.openai import OpenAIProvider\n\n"
        "model = OpenAIChatModel(\n"
        "    'gpt-4o-mini', provider=OpenAIProvider(base_url={url!r}, api_key={key!r})\n"
        ")"
    ),
    # anthropic>=2 sends ``anthropic-version: 2026-10-21``, which rejects sampling settings
    # such as ``temperature``; pydantic-ai 2.78 and later drop them with a warning then. The
    # agent asks for the older version, as pydantic-ai's warning says to, so its
    # ``temperature`` reaches the wire on every supported release.
    "anthropic": (
        "from anthropic import AsyncAnthropic\n"
        "from pydantic_ai.models.anthropic import AnthropicModel\n"
        "from pydantic_ai.providers.anthropic import AnthropicProvider\n\n"
        "model = AnthropicModel(\n"
        "    'claude-3-5-haiku-latest',\n"
        "    provider=AnthropicProvider(anthropic_client=AsyncAnthropic(\n"
        "        base_url={url!r}, api_key={key!r},\n"
        "        default_headers={{'anthropic-version': '2023-06-01'}},\n"
        "    )),\n"
        ")"
    ),
}

OUTPUT_TOOL = "final_result"


def write_agent(
    root: Path, vendor: str, url: str, outbox: Path, *, followup: str = FOLLOWUP
) -> Path:
    """An agent directory ``root/support`` whose entry is the pydantic-ai agent."""
    directory = root / "support"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "agent.yaml").write_text("name: support\nentry: app:agent\n")
    model_code = MODELS[vendor].format(url=url, key=FAKE_KEY)
    (directory / "app.py").write_text(
        APP.format(model_code=model_code, outbox=str(outbox), followup=followup)
    )
    return directory


def outbox_lines(outbox: Path) -> list[dict[str, Any]]:
    if not outbox.exists():
        return []
    return [json.loads(line) for line in outbox.read_text().splitlines() if line.strip()]


def call(id: str, name: str, **args: Any) -> Completion:
    return Completion(tool_calls=(FakeToolCall(id, name, args),))


def ticket(id: str, order: str = "A-17", status: str = "shipped", **more: Any) -> Completion:
    return call(id, OUTPUT_TOOL, order=order, status=status, **more)
