"""The serialisable values that cross the durable boundary, and their recorded forms."""

from __future__ import annotations

import json

from toren.providers.base import ModelResponse, ToolCall, Usage


def test_a_valid_tool_call_records_exactly_as_before() -> None:
    # The assistant message of a response goes into every later request of the run, so
    # a key added here would change their digests and re-run every in-flight run.
    call = ToolCall("c1", "lookup_order", {"order_id": "A-17"})

    assert call.to_dict() == {"id": "c1", "name": "lookup_order", "arguments": {"order_id": "A-17"}}
    assert ModelResponse("", (call,)).message()["tool_calls"] == [call.to_dict()]


def test_a_response_recorded_before_arguments_errors_existed_reads_back() -> None:
    recorded = {
        "text": "",
        "tool_calls": [{"id": "c1", "name": "f", "arguments": {"x": 1}}],
        "usage": {"input_tokens": 3, "output_tokens": 2},
        "finish_reason": "tool_calls",
        "model": "m",
        "a_field_of_a_later_release": True,
    }

    response = ModelResponse.from_dict(recorded)

    (call,) = response.tool_calls
    assert call == ToolCall("c1", "f", {"x": 1})
    assert (call.arguments_error, call.raw_arguments) == (None, None)
    assert response.usage == Usage(3, 2)


def test_a_garbled_tool_call_round_trips_through_json() -> None:
    call = ToolCall("c1", "f", {}, arguments_error="not valid JSON (...): '{'", raw_arguments="{")
    response = ModelResponse("", (call,), finish_reason="tool_calls")

    data = json.loads(json.dumps(response.to_dict()))

    assert data["tool_calls"] == [
        {
            "id": "c1",
            "name": "f",
            "arguments": {},
            "arguments_error": "not valid JSON (...): '{'",
            "raw_arguments": "{",
        }
    ]
    assert ModelResponse.from_dict(data) == response
    assert ToolCall.from_dict(response.message()["tool_calls"][0]) == call
