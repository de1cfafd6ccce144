"""OpenTelemetry spans with GenAI attributes, the no-op fallback, JSON logs."""

from __future__ import annotations

import io
import json
import logging
from decimal import Decimal

import pytest

from toren.agents.telemetry import (
    JsonLogFormatter,
    NoopTelemetry,
    OtelTelemetry,
    create_telemetry,
    run_logger,
)
from toren.providers.base import ModelRequest, ModelResponse, Usage

sdk = pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

REQUEST = ModelRequest(
    provider="openai",
    model="gpt-4o-mini",
    messages=({"role": "user", "content": "hi"},),
    params={"temperature": 0.2, "max_tokens": 50},
)
RESPONSE = ModelResponse(text="hello", usage=Usage(12, 3), model="gpt-4o-mini-2024-07-18")


def _telemetry(**kw: bool) -> tuple[OtelTelemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = create_telemetry(tracer_provider=provider, **kw)
    assert isinstance(telemetry, OtelTelemetry)
    return telemetry, exporter


def test_spans_follow_genai_conventions_and_carry_the_run_id() -> None:
    telemetry, exporter = _telemetry()
    with telemetry.run_span("run-1", agent="support", process="main", code_version="abc"):
        telemetry.on_model_call(
            "run-1", "main", 0, REQUEST, RESPONSE, 0.25, False, cost_usd=Decimal("0.001")
        )
        telemetry.on_tool_call("run-1", "main", 1, "lookup_order", 0.01, False)
        telemetry.on_tool_call("run-1", "main", 2, "send_email", 0.01, False, error="ToolFailed: x")
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "invoke_agent support",
        "chat gpt-4o-mini",
        "execute_tool lookup_order",
        "execute_tool send_email",
    }
    for span in spans.values():
        assert span.attributes is not None and span.attributes["toren.run_id"] == "run-1"
    chat = spans["chat gpt-4o-mini"].attributes or {}
    assert chat["gen_ai.operation.name"] == "chat"
    assert chat["gen_ai.system"] == "openai" and chat["gen_ai.provider.name"] == "openai"
    assert chat["gen_ai.request.model"] == "gpt-4o-mini"
    assert chat["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
    assert chat["gen_ai.usage.input_tokens"] == 12 and chat["gen_ai.usage.output_tokens"] == 3
    assert chat["gen_ai.request.temperature"] == 0.2 and chat["gen_ai.request.max_tokens"] == 50
    assert chat["toren.position"] == 0 and chat["toren.replayed"] is False
    chat_span = spans["chat gpt-4o-mini"]
    assert chat_span.end_time is not None and chat_span.start_time is not None
    assert chat_span.end_time - chat_span.start_time == pytest.approx(0.25e9, rel=0.01)
    root = spans["invoke_agent support"]
    assert chat_span.parent is not None and chat_span.parent.span_id == root.context.span_id
    tool = spans["execute_tool lookup_order"].attributes or {}
    assert tool["gen_ai.operation.name"] == "execute_tool"
    assert tool["gen_ai.tool.name"] == "lookup_order"
    assert not spans["execute_tool send_email"].status.is_ok


def test_replayed_steps_make_no_span_by_default_and_never_report_usage() -> None:
    telemetry, exporter = _telemetry()
    telemetry.on_model_call("r", "main", 0, REQUEST, RESPONSE, 0.0, True)
    assert exporter.get_finished_spans() == ()
    telemetry, exporter = _telemetry(trace_replayed=True)
    telemetry.on_model_call("r", "main", 0, REQUEST, RESPONSE, 0.0, True)
    (span,) = exporter.get_finished_spans()
    assert span.attributes is not None and span.attributes["toren.replayed"] is True
    assert "gen_ai.usage.input_tokens" not in span.attributes


def test_noop_telemetry() -> None:
    telemetry = create_telemetry(enabled=False)
    assert isinstance(telemetry, NoopTelemetry)
    with telemetry.run_span("r", agent="a", process="main"):
        telemetry.on_model_call("r", "main", 0, REQUEST, RESPONSE, 0.1, False)
        telemetry.on_tool_call("r", "main", 1, "t", 0.1, False)


def test_json_logs_are_keyed_by_run_id() -> None:
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(JsonLogFormatter())
    logger = logging.getLogger("toren.test.jsonlogs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        log = run_logger(logger, "run-9", agent="support")
        log.info("step %d done", 3, extra={"stream": "main", "position": 3})
        try:
            raise ValueError("bad")
        except ValueError:
            log.exception("failed")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in buffer.getvalue().splitlines()[:2])
    assert first["msg"] == "step 3 done" and first["level"] == "info"
    assert first["run_id"] == "run-9" and first["agent"] == "support"
    assert first["stream"] == "main" and first["position"] == 3
    assert first["ts"].endswith("+00:00")
    assert second["run_id"] == "run-9" and "ValueError: bad" in second["exc"]
