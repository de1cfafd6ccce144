"""RunView: how recorded events print."""

from __future__ import annotations

import io

from rich.console import Console

from toren.cli.view import RunView


def test_a_tool_call_with_garbled_arguments_shows_what_the_model_wrote() -> None:
    out = io.StringIO()
    view = RunView(Console(file=out, width=200, color_system=None))
    call = {
        "id": "c1",
        "name": "send_email",
        "arguments": {},
        "arguments_error": "not valid JSON (...)",
        "raw_arguments": '{"to": "a" "b"}',
    }
    payload = {"provider": "openai", "model": "m", "response": {"text": "", "tool_calls": [call]}}

    view.event({"type": "ModelCallRecorded", "stream": "main", "position": 0, "payload": payload})

    assert '→ asks for send_email({"to": "a" "b"}) arguments not valid' in out.getvalue()


def test_a_model_call_cut_off_in_flight_shows_what_it_counted() -> None:
    out = io.StringIO()
    view = RunView(Console(file=out, width=200, color_system=None))
    view.streaming["main/1"] = "half an ans"
    payload = {
        "stream": "main",
        "position": 1,
        "input_tokens": 2007,
        "output_tokens": 1,
        "cost_usd": "0.006036",
        "reason": "worker draining",
    }

    view.event({"type": "ModelCallCutOff", "stream": "", "position": None, "payload": payload})

    line = out.getvalue()
    assert "✂ model call cut off main/1 (worker draining): 2007 in / 1 out tok" in line
    assert "counted; the step runs again" in line
    assert "main/1" not in view.streaming
