"""OpenAI Agents SDK agents on Toren (toren.integrations.openai_agents), driven through
the SDK's real OpenAIResponsesModel and OpenAIChatCompletionsModel against the loopback
wire server (tests/providers/fakes.py), on SQLite and PostgreSQL. What the server served
and what the side-effecting tools did is counted, never assumed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.integrations.oa_agent import conversation, outbox_lines, write_agent
from tests.providers.fakes import FakeEndpoint, FakeModelServer, serve_fake_models
from toren.runtime import Runtime, close_runtime, open_runtime

pytest.importorskip("agents")

APIS = ["responses", "chat"]


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def endpoint(fake: FakeModelServer, api: str) -> FakeEndpoint:
    return fake.responses if api == "responses" else fake.openai


async def opened(tmp_path: Path, db_url: str) -> Runtime:
    return await open_runtime(tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05))


async def run_once(runtime: Runtime, input: Any = "Where is A-17?") -> Any:
    run = await toren.start_run(runtime.store, runtime.resolver, "support", input)
    async with toren.LocalWorkerRuntime(runtime.deps):
        return await toren.wait_for_run(runtime.store, run.id, timeout=30)


def steps(events: list[Any]) -> list[tuple[str, str]]:
    out = []
    for e in events:
        if e.type == "ModelCallRecorded":
            out.append(("model", e.payload.model))
        elif e.type == "ToolCallRecorded":
            out.append(("tool", e.payload.name))
    return out


@pytest.mark.parametrize("api", APIS)
async def test_an_unmodified_sdk_agent_runs_as_steps(
    db_url: str, tmp_path: Path, fake: FakeModelServer, api: str
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    write_agent(tmp_path / "agents", api, fake.openai_url, outbox)
    server = endpoint(fake, api)
    server.responder = conversation()
    runtime = await opened(tmp_path, db_url)
    try:
        final = await run_once(runtime)
        assert final.status == "completed", final.error
        assert final.output == "Emailed you about A-17."
        events = await runtime.store.load_events(final.id)
    finally:
        await close_runtime(runtime)
    model = "gpt-4.1" if api == "responses" else "gpt-4o-mini"
    assert steps(events) == [
        ("model", model),
        ("tool", "lookup_order"),
        ("model", model),
        ("tool", "transfer_to_billing"),
        ("model", model),
        ("tool", "send_email"),
        ("model", model),
    ]
    assert server.served == 4
    assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order", "send_email"]
    models = [e.payload for e in events if e.type == "ModelCallRecorded"]
    provider = "openai-responses" if api == "responses" else "openai"
    assert {m.provider for m in models} == {provider}
    assert final.input_tokens == 4 * 11 and final.output_tokens == 4 * 7
    assert final.cost_usd > 0  # priced as the same OpenAI model
    handoff = next(e.payload for e in events if e.type == "ToolCallRecorded" and e.payload.name == "transfer_to_billing")
    assert handoff.result == {"agent": "billing"}
