"""The redactor on its own: what it scrubs, and that no value can make it fail."""

from __future__ import annotations

import json
from typing import Any

from toren.redact import MAX_DEPTH, TOO_DEEP, Redactor

from .support import SECRET


def test_scrubs_strings_and_keys_and_keeps_the_rest() -> None:
    value = {"b": [f"key {SECRET}", 1, 2.5, None, True], SECRET: {"plain-secret-1": "x"}, "a": 0}
    out = Redactor(["plain-secret-1"])(value)
    assert out == {
        "b": ["key [redacted]", 1, 2.5, None, True],
        "[redacted]": {"[redacted]": "x"},
        "a": 0,
    }
    assert list(out) == ["b", "[redacted]", "a"]  # key order kept
    assert value[SECRET] == {"plain-secret-1": "x"}  # a copy: the input is untouched


def test_any_depth_is_handled_and_cut_at_the_bound() -> None:
    value: Any = "leaf"
    for _ in range(100_000):  # far past Python's recursion limit
        value = [value]
    out = Redactor()(value)
    depth = 0
    while isinstance(out, list):
        out, depth = out[0], depth + 1
    assert (depth, out) == (MAX_DEPTH, TOO_DEEP)


def _stream(store: Any) -> Any:
    """A stream of run ``run_x`` whose redactor knows SECRET, driven step by step."""
    from toren.api.sse import RunStream, StreamSettings

    return RunStream(
        store,
        "run_x",
        0,
        live=None,
        redact=Redactor([SECRET]),
        settings=StreamSettings(heartbeat=15, poll_interval=1),
        closing=lambda: False,
    )


def test_a_cut_off_call_resets_its_steps_stream_redactor(store: Any) -> None:
    """A call cut off in flight (``ModelCallCutOff``) runs again from its first delta:
    what the step's redactor held back of the dead attempt neither joins nor hides the
    new attempt's text."""
    from toren.core.contract.events import Event, ModelCallCutOff

    stream = _stream(store)
    assert b"Hello " in (stream._delta({"stream": "", "position": 3, "text": "Hello sk-"}) or b"")
    cut = ModelCallCutOff(stream="", position=3, request_digest="d", provider="scripted")
    body = stream._event(Event("run_x", cut.TYPE, cut, seq=7))
    assert b"sk-" not in body
    fresh = stream._delta({"stream": "", "position": 3, "text": "abcdefghijklmnopqrstuvwxyz"})
    assert fresh is not None and b'"text":"abcdefghijklmnopqrstuvwxyz"' in fresh


def test_a_recorded_call_that_overtakes_its_last_deltas_never_shows_a_held_secret(
    store: Any,
) -> None:
    """The step's recorded event can be read from the store while its last deltas still
    wait in the live queue (they are dropped as stale after it). The redactor then holds
    the start of a secret whose end it never saw; the rest of the text comes from the
    recorded event, so the secret is judged whole and never goes out in clear."""
    from toren.core.contract.events import Event, ModelCallRecorded

    stream = _stream(store)
    whole = f"decided key {SECRET} ok"
    sent = b""
    for piece in (whole[:8], whole[8:16], whole[16:24]):  # "...key sk-test-SECR"
        sent += stream._delta({"stream": "", "position": 3, "text": piece}) or b""
    recorded = ModelCallRecorded(provider="scripted", response={"text": whole})
    sent += stream._event(Event("run_x", recorded.TYPE, recorded, seq=9, position=3))
    assert SECRET[:6].encode() not in sent and b"SECR" not in sent
    deltas = [
        json.loads(block.split("data: ", 1)[1])["text"]
        for block in sent.decode().split("\n\n")
        if block.startswith("event: delta")
    ]
    assert "".join(deltas) == "decided key [redacted] ok"
