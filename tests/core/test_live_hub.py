"""The live hub's partial texts: what a reader arriving mid-call starts from."""

from __future__ import annotations

from toren.core.contract.events import ROOT, ModelCallCutOff, ModelCallRecorded, make_event
from toren.core.drivers.live import LiveHub


def _delta(hub: LiveHub, position: int, text: str) -> None:
    hub.publish("r", {"type": "delta", "stream": "main", "position": position, "text": text})


def test_a_recorded_call_ends_its_partial_text() -> None:
    hub = LiveHub()
    _delta(hub, 1, "Hel")
    _delta(hub, 1, "lo")
    _delta(hub, 2, "other")
    assert sorted(hub.partial("r")) == [("main", 1, "Hello"), ("main", 2, "other")]
    recorded = make_event("r", ModelCallRecorded(), stream="main", position=1)
    hub.publish("r", {"type": "event", "event": recorded})
    assert hub.partial("r") == [("main", 2, "other")]


def test_a_cut_off_call_ends_its_partial_text() -> None:
    """A cut-off is a run-level event (no position of its own) naming its step: the text
    streamed so far is never recorded, so a reader arriving after it must not see it."""
    hub = LiveHub()
    _delta(hub, 3, "half an ans")
    _delta(hub, 4, "kept")
    cut = make_event("r", ModelCallCutOff(stream="main", position=3, reason="drain"), stream=ROOT)
    hub.publish("r", {"type": "event", "event": cut})
    assert hub.partial("r") == [("main", 4, "kept")]


def test_the_end_of_a_tick_ends_every_partial_text() -> None:
    hub = LiveHub()
    _delta(hub, 1, "x")
    hub.publish("r", {"type": "status", "status": "waiting"})
    assert hub.partial("r") == []
