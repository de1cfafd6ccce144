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
    new attempt's text. The reset happens where the cut-off stands in the live queue, not
    when it is read from the store: the dead attempt's last deltas may still wait in the
    queue then (read first, the event would make them the new attempt's first text)."""
    from toren.core.contract.events import Event, ModelCallCutOff

    stream = _stream(store)
    sent = stream._live({"type": "delta", "stream": "", "position": 3, "text": "Hello sk-"})
    assert sent is not None and b"Hello " in sent
    cut = ModelCallCutOff(stream="", position=3, request_digest="d", provider="scripted")
    cut_event = Event("run_x", cut.TYPE, cut, seq=7)
    sent = stream._event(cut_event)  # read from the store before the queue is drained
    # Still in the queue: the dead attempt's last delta, then the cut-off, then the new
    # attempt's first delta.
    for item in (
        {"type": "delta", "stream": "", "position": 3, "text": "test-SE"},
        {"type": "event", "event": cut_event},
    ):
        sent += stream._live(item) or b""
    assert b"sk-" not in sent and b"test-SE" not in sent, sent
    fresh = stream._live(
        {"type": "delta", "stream": "", "position": 3, "text": "abcdefghijklmnopqrstuvwxyz"}
    )
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


def test_a_held_secret_prefix_is_dropped_when_no_recorded_text_can_finish_it(store: Any) -> None:
    """A call that failed mid-stream records no text, and deltas that are not the start of
    the recorded text cannot be finished from it: what the redactor holds back then is
    dropped, never flushed in clear (the event carries the redacted record)."""
    from toren.core.contract.events import Event, ModelCallRecorded

    whole = f"decided key {SECRET} ok"
    for recorded in (
        ModelCallRecorded(provider="scripted", error={"message": "the stream broke"}),
        ModelCallRecorded(provider="scripted", response={"text": "another answer"}),
    ):
        stream = _stream(store)
        sent = b""
        for piece in (whole[:8], whole[8:16], whole[16:24]):  # "...key sk-test-SECR"
            sent += stream._delta({"stream": "", "position": 3, "text": piece}) or b""
        sent += stream._event(Event("run_x", recorded.TYPE, recorded, seq=9, position=3))
        assert b"sk-" not in sent and b"SECR" not in sent, sent


def test_the_trailing_prefix_search_finds_what_trying_every_length_finds() -> None:
    """``StreamRedactor._safe_end`` looks only where a secret's first character is; the
    plain definition (every suffix length of every secret) is the reference."""
    import random

    from toren.redact import StreamRedactor

    def reference(secrets: list[str], text: str) -> int:
        cut = len(text)
        for secret in secrets:
            for k in range(min(len(secret) - 1, len(text)), 0, -1):
                if len(text) - k < cut and text.endswith(secret[:k]):
                    cut = len(text) - k
                    break
        return cut

    rnd = random.Random(20261204)
    alphabet = "abAB-_k "
    for _ in range(5000):
        secrets = ["".join(rnd.choices(alphabet[:-1], k=rnd.randint(8, 14))) for _ in range(3)]
        redactor = Redactor(secrets)
        text = "".join(rnd.choices(alphabet, k=rnd.randint(0, 40)))
        if rnd.random() < 0.5:
            chosen = rnd.choice(redactor.secrets)
            text += chosen[: rnd.randint(1, len(chosen))]
        assert StreamRedactor(redactor)._safe_end(text) == reference(redactor.secrets, text)
