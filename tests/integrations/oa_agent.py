"""The OpenAI Agents SDK agents the integration tests run: a triage agent that looks an
order up and hands off to a billing agent, which emails the customer (a side effect,
counted in an outbox file) and may refund (a tool that needs approval). Written into an
agent directory with the fake server's URL and the outbox path in its text, so each
test's directory has its own content hash and module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.providers.fakes import FAKE_KEY, Completion, FakeToolCall, Reply

TRIAGE = "You are triage. Look the order up, then hand off to billing."
BILLING = "You are billing. Email the customer about their order."

APP = '''\
import json
from pathlib import Path

from agents import Agent, function_tool, OpenAIChatCompletionsModel, OpenAIResponsesModel
from openai import AsyncOpenAI

from toren.integrations.openai_agents import tool_options

client = AsyncOpenAI(api_key={key!r}, base_url={url!r}, max_retries=0)
model = {model_class}(model={model_name!r}, openai_client=client)
OUTBOX = Path({outbox!r})


def _did(tool: str, **args) -> None:
    with OUTBOX.open("a") as out:
        out.write(json.dumps({{"tool": tool, **args}}) + "\\n")


@function_tool
def lookup_order(order_id: str) -> dict:
    """Look an order up."""
    _did("lookup_order", order_id=order_id)
    return {{"order": order_id, "status": "shipped"}}


lookup_order = tool_options(lookup_order, side_effects=False)


@function_tool
def send_email(to: str, body: str) -> str:
    """Email the customer."""
    _did("send_email", to=to, body=body)
    return "sent"


@function_tool(needs_approval=True)
def refund(order_id: str) -> str:
    """Refund an order (a person approves it first)."""
    _did("refund", order_id=order_id)
    return "refunded"


billing = Agent(
    name="billing",
    instructions={billing!r},
    model=model,
    tools=[send_email, refund],
)
agent = Agent(
    name="triage",
    instructions={triage!r},
    model=model,
    tools=[lookup_order],
    handoffs=[billing],
)
'''

MODELS = {
    "responses": ("OpenAIResponsesModel", "gpt-4.1"),
    "chat": ("OpenAIChatCompletionsModel", "gpt-4o-mini"),
}


def write_agent(agents: Path, api: str, url: str, outbox: Path, *, billing: str = BILLING) -> Path:
    directory = agents / "support"
    directory.mkdir(parents=True, exist_ok=True)
    model_class, model_name = MODELS[api]
    (directory / "app.py").write_text(
        APP.format(
            key=FAKE_KEY,
            url=url,
            model_class=model_class,
            model_name=model_name,
            outbox=str(outbox),
            billing=billing,
            triage=TRIAGE,
        )
    )
    (directory / "agent.yaml").write_text("name: support\nentry: app:agent\n")
    return directory


def outbox_lines(outbox: Path) -> list[dict[str, Any]]:
    if not outbox.exists():
        return []
    return [json.loads(line) for line in outbox.read_text().splitlines() if line.strip()]


def call(call_id: str, name: str, **args: Any) -> Completion:
    return Completion(tool_calls=(FakeToolCall(call_id, name, args),))


def turn_of(body: dict[str, Any]) -> tuple[str, int]:
    """Which agent a request is from and how many tool results it carries, on either
    wire format (Responses ``input`` items, Chat Completions ``messages``)."""
    text = json.dumps(body)
    agent = "billing" if "You are billing" in text else "triage"
    if "input" in body:
        done = sum(1 for i in body["input"] if i.get("type") == "function_call_output")
    else:
        done = sum(1 for m in body["messages"] if m.get("role") == "tool")
    return agent, done


def conversation(*, refund: bool = False, **last: Any) -> Any:
    """A responder for the fake endpoint: the reply for each turn of the conversation,
    decided from the request (so a resumed run gets the same answers)."""

    def reply(body: dict[str, Any]) -> Reply:
        agent, done = turn_of(body)
        if agent == "triage":
            if done == 0:
                return call("c1", "lookup_order", order_id="A-17")
            return call("c2", "transfer_to_billing")
        if refund and done == 2:
            return call("c3", "refund", order_id="A-17")
        if done < (4 if refund else 3):
            return call("c4", "send_email", to="c@example.com", body="A-17 shipped")
        return Completion(text="Emailed you about A-17.", **last)

    return reply
