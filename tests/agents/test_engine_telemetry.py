"""The engine calls the telemetry hooks: spans for the run, model calls and tool calls
with GenAI attributes and ``toren.run_id``, exported by the real OpenTelemetry SDK."""

from __future__ import annotations

from typing import Any

import pytest

import toren
from toren.providers.base import ToolSpec
from toren.providers.scripted import ScriptedProvider
from toren.store import Store

otel = pytest.importorskip("opentelemetry.sdk.trace")


async def test_spans_for_run_model_and_tool(store: Store) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from toren.agents.telemetry import create_telemetry

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    async def agent(ctx: toren.Context, input: Any) -> Any:
        await ctx.model("scripted:echo", [{"role": "user", "content": "hi"}])
        return await ctx.tool("add", {"a": 1, "b": 2})

    reg = toren.Registry()
    reg.add("t", agent, tools={"add": toren.ToolDef("add", lambda a, b: a + b, ToolSpec("add"))})
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        providers={"scripted": ScriptedProvider()},
        telemetry=create_telemetry(tracer_provider=provider),
    )
    run = await toren.start_run(store, reg, "t")
    assert (await toren.tick(run.id, deps)).output == 3
    spans = exporter.get_finished_spans()
    assert len(spans) == 3
    assert all(s.attributes.get("toren.run_id") == run.id for s in spans)
    model = next(s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat")
    assert model.attributes["gen_ai.request.model"] == "echo"
    assert model.attributes["gen_ai.usage.output_tokens"] >= 1
