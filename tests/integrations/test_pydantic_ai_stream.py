"""A pydantic-ai run's token deltas reach /v1/runs/{id}/stream (SSE, through the HTTP
API and its client) as the built-in loop's do: before the event that records their
step, and adding up to the recorded text."""

from __future__ import annotations

from pathlib import Path

import pytest

import toren
from tests.providers.fakes import FAKE_KEY, Completion, FakeToolCall, serve_fake_models
from toren.api import create_app, running_server
from toren.client import AsyncTorenClient, Delta, Event
from toren.runtime import close_runtime, open_runtime

pytest.importorskip("pydantic_ai")

TOKEN = "tok-pyai-stream-0123456789"

APP = """\
from pydantic_ai import Agent, DeferredToolRequests
from pydantic_ai.models.{module} import {cls}
from pydantic_ai.providers.{module} import {provider}

agent = Agent(
    {cls}({model!r}, provider={provider}(base_url={url!r}, api_key={key!r})),
    instructions="Answer in full sentences.",
    output_type=[str, DeferredToolRequests],
)


@agent.tool_plain(requires_approval=True)
def confirm(order_id: str) -> str:
    return "confirmed"
"""

VENDORS = {
    "openai": ("openai", "OpenAIChatModel", "OpenAIProvider", "gpt-4o-mini"),
    "anthropic": ("anthropic", "AnthropicModel", "AnthropicProvider", "claude-3-5-haiku-latest"),
}
TEXT = "Your order A-17 has shipped and is confirmed."


@pytest.mark.parametrize("vendor", sorted(VENDORS))
async def test_token_deltas_reach_the_runs_stream(db_url: str, tmp_path: Path, vendor: str) -> None:
    module, cls, provider, model = VENDORS[vendor]
    directory = tmp_path / "agents" / "streamer"
    directory.mkdir(parents=True)
    (directory / "agent.yaml").write_text("name: streamer\nentry: app:agent\n")
    with serve_fake_models() as fake:
        url = fake.openai_url if vendor == "openai" else fake.anthropic_url
        (directory / "app.py").write_text(
            APP.format(
                module=module, cls=cls, provider=provider, model=model, url=url, key=FAKE_KEY
            )
        )
        server = fake.openai if vendor == "openai" else fake.anthropic
        server.script(
            Completion(tool_calls=(FakeToolCall("c1", "confirm", {"order_id": "A-17"}),)),
            Completion(text=TEXT, chunk_size=5),
        )
        runtime = await open_runtime(
            tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05)
        )
        worker = toren.LocalWorkerRuntime(runtime.deps)
        await worker.start()
        try:
            app = create_app(
                runtime.store, runtime.resolver, live=runtime.live, runtime=worker, tokens=[TOKEN]
            )
            async with (
                running_server(app) as http,
                AsyncTorenClient(http.url, TOKEN, stream_timeout=10) as client,
            ):
                run = await client.start_run("streamer", "Is A-17 on its way?")
                items: list[Event | Delta] = []
                async for item in client.stream(run.id, deltas=True):
                    items.append(item)
                    if isinstance(item, Event) and item.type == "RunWaiting":
                        # Subscribed for sure: the model call after the approval streams.
                        await client.send_message(run.id, "approval", True)
        finally:
            await worker.stop(drain_window=0.5)
            await close_runtime(runtime)
    events = [i for i in items if isinstance(i, Event)]
    assert events[-1].type == "RunCompleted"
    last_call = [e for e in events if e.type == "ModelCallRecorded"][-1]
    deltas = [i for i in items if isinstance(i, Delta) and i.position == last_call.position]
    assert len(deltas) > 1  # streamed in pieces, not handed over whole
    assert "".join(d.text for d in deltas) == last_call.payload["response"]["text"] == TEXT
    for d in deltas:  # deltas precede the event that records their step
        assert items.index(d) < items.index(last_call)
