"""The verifier's verdicts on hand-made logs: what it reports when the log lacks an input,
when an input was altered, and for events a newer release may write."""

from __future__ import annotations

import json
from typing import Any

from toren.core.contract.digest import message_hash, message_list_node, request_digest
from toren.core.contract.events import (
    Event,
    MessageReceived,
    ModelCallRecorded,
    RunWaiting,
    TimerFired,
    TimerScheduled,
    ToolCallRecorded,
    UnknownEvent,
)
from toren.core.drivers.verify import verify_events

SEQ = iter(range(1, 10_000))


def event(payload: Any, position: int | None, digest: str | None, stream: str = "main") -> Event:
    return Event(
        run_id="r",
        type=payload.TYPE if not isinstance(payload, UnknownEvent) else "AddedLater",
        payload=payload,
        stream=stream if position is not None else "",
        position=position,
        digest=digest,
        seq=next(SEQ),
    )


def test_verdicts() -> None:
    tool = ToolCallRecorded(name="t", args={"a": 1})
    good = request_digest("tool", {"name": "t", "args": {"a": 1}})
    msg = {"role": "user", "content": "hi"}
    h = message_hash(msg)
    node, body = message_list_node(None, [h])
    call = ModelCallRecorded(provider="p", model="m", message_list=node, message_count=1)
    model = request_digest(
        "model", {"provider": "p", "model": "m", "messages": [h], "tools": [], "params": {}}
    )
    sleep = request_digest("sleep", {"seconds": 1})
    wait = request_digest("message", {"name": "go", "timeout": 5})
    events = [
        event(tool, 0, good),
        event(tool, 1, "0" * 64),  # altered
        event(call, 2, model),  # its message blob is missing below
        event(TimerScheduled(seconds=1.0), 3, sleep),  # 0.1: sleep(1) recorded as 1.0
        event(TimerFired(), 3, "f" * 64),  # a completion with another digest
        event(UnknownEvent(raw={}), 4, "a" * 64),  # a step of a newer release
        event(TimerScheduled(seconds=5, purpose="message"), 5, wait),  # 0.1 timed wait
        event(TimerFired(), 5, wait),
        event(RunWaiting(messages=["other"]), None, None),
        event(
            MessageReceived(name="x"), 6, request_digest("message", {"name": "x", "timeout": None})
        ),
    ]
    report = verify_events("r", events, {node: json.loads(body)})
    got = [(c.position, c.event_type, c.verdict) for c in report.checks]
    assert got == [
        (0, "ToolCallRecorded", "verified"),
        (1, "ToolCallRecorded", "mismatch"),
        (2, "ModelCallRecorded", "unverifiable"),
        (3, "TimerScheduled", "verified"),
        (3, "TimerFired", "mismatch"),
        (4, "AddedLater", "unverifiable"),
        (5, "TimerScheduled", "unverifiable"),
        (6, "MessageReceived", "verified"),
    ]
    notes = {c.position: c.note or "" for c in report.checks if c.event_type != "TimerFired"}
    assert "missing" in notes[2] and "integer 1" in notes[3] and "AddedLater" in notes[4]
    assert "none of the names ['other', 'x'] matched" in notes[5]
    assert not report.ok and report.count("mismatch") == 2

    # With the blob, the model call verifies; a blob altered after the fact does not.
    blobs = {node: json.loads(body), h: msg}
    again = verify_events("r", events[2:3], blobs)
    assert [c.verdict for c in again.checks] == ["verified"]
    altered = verify_events("r", events[2:3], {**blobs, h: {"role": "user", "content": "hI"}})
    assert [c.verdict for c in altered.checks] == ["mismatch"]
    assert h in (altered.checks[0].note or "")
