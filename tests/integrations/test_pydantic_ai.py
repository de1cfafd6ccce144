"""pydantic-ai agents on Toren (toren.integrations.pydantic_ai), driven through
pydantic-ai's real OpenAI and Anthropic model classes against the loopback wire servers
(tests/providers/fakes.py), on SQLite and PostgreSQL. What the servers served and what
the side-effecting tools did is counted, never assumed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.integrations.pyai_agent import (
    OUTPUT_TOOL,
    call,
    outbox_lines,
    ticket,
    write_agent,
)
from tests.providers.fakes import FakeModelServer, serve_fake_models
from toren.runtime import Runtime, close_runtime, open_runtime

pytest.importorskip("pydantic_ai")

VENDORS = ["openai", "anthropic"]


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def endpoint(fake: FakeModelServer, vendor: str) -> Any:
    return fake.openai if vendor == "openai" else fake.anthropic


def url_of(fake: FakeModelServer, vendor: str) -> str:
    return fake.openai_url if vendor == "openai" else fake.anthropic_url


async def opened(tmp_path: Path, db_url: str) -> Runtime:
    return await open_runtime(tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05))


async def run_once(runtime: Runtime, input: Any = "Where is A-17?") -> Any:
    run = await toren.start_run(runtime.store, runtime.resolver, "support", input)
    async with toren.LocalWorkerRuntime(runtime.deps):
        return await toren.wait_for_run(runtime.store, run.id, timeout=30)


@pytest.mark.parametrize("vendor", VENDORS)
async def test_an_unmodified_agent_runs_as_steps(
    db_url: str, tmp_path: Path, fake: FakeModelServer, vendor: str
) -> None:
    outbox = tmp_path / "outbox.jsonl"
    write_agent(tmp_path / "agents", vendor, url_of(fake, vendor), outbox)
    server = endpoint(fake, vendor)
    server.script(
        call("c1", "lookup_order", order_id="A-17"),
        call("c2", "send_email", to="c@example.com", body="A-17 shipped"),
        ticket("c3", notes=["emailed"]),
    )
    runtime = await opened(tmp_path, db_url)
    try:
        final = await run_once(runtime)
        assert final.status == "completed", final.error
        assert final.output == {"order": "A-17", "status": "shipped", "notes": ["emailed"]}
        assert server.served == 3
        assert [line["tool"] for line in outbox_lines(outbox)] == ["lookup_order", "send_email"]
        events = await runtime.store.load_events(final.id)
        steps = [(e.type, e.position) for e in events if e.type.endswith("Recorded")]
        assert steps == [
            ("ModelCallRecorded", 0),
            ("ToolCallRecorded", 1),
            ("ModelCallRecorded", 2),
            ("ToolCallRecorded", 3),
            ("ModelCallRecorded", 4),
        ]
        models = [e.payload for e in events if e.type == "ModelCallRecorded"]
        assert {m.provider for m in models} == {vendor}
        assert sum(m.input_tokens for m in models) == final.input_tokens == 3 * 11
        assert final.output_tokens == 3 * 7
        assert final.cost_usd > 0  # priced from the default table, like any model step
        # What the provider saw: the instructions, the tools and the output tool.
        first = server.requests[0].body
        names = (
            {t["function"]["name"] for t in first["tools"]}
            if vendor == "openai"
            else {t["name"] for t in first["tools"]}
        )
        assert names == {"lookup_order", "send_email", "refund", OUTPUT_TOOL}
        assert first["temperature"] == 0.2
    finally:
        await close_runtime(runtime)
