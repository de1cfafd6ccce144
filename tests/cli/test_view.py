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
