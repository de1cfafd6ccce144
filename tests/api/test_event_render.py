"""A run's page of events is rendered event by event straight to JSON
(``toren.api.render.event_fragment``): each event the fast path vouches for must be the
bytes the ``Event`` model serialises, and what it cannot vouch for (a secret, nesting
too deep, an integer beyond 64 bits, ``NaN``, a field of another type) must go the
general way, so the page served is the model's page byte for byte."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

import toren
from toren.api import create_app, models, render
from toren.core.contract.events import (
    Event,
    RunStarted,
    ToolCallRecorded,
    UnknownEvent,
    make_event,
    parse_payload,
)
from toren.core.drivers.runs import new_run_id
from toren.redact import MAX_DEPTH, Redactor
from toren.store import Store
from toren.store.base import NewRun

from .test_events_page_stream import TOKEN, call, model_body

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
SECRET = "sk-test-EVENTRENDER0123456789abcdef"
_MODEL: TypeAdapter[models.Event] = TypeAdapter(models.Event)


def model_bytes(event: Event, redactor: Redactor) -> bytes:
    """The event as the general path serialises it (redacted, validated, dumped)."""
    return _MODEL.dump_json(_MODEL.validate_python(redactor(event.to_dict())))


def corpus_events() -> list[Event]:
    """Every event of every run the corpus recorded (60 scenarios: every step kind,
    hostile strings, unknown event types), as the store hands them out."""
    found: list[Event] = []
    for path in sorted(CORPUS.glob("*.json")):
        fixture = json.loads(path.read_text())
        for name, run in fixture["runs"].items():
            run_id = f"run_{path.stem}_{name}"
            for row in run["events"]:
                payload = parse_payload(row["type"], row["payload"], run_id=run_id, seq=row["n"])
                found.append(
                    Event(
                        run_id=run_id,
                        type=row["type"],
                        payload=payload,
                        stream=row["stream"],
                        position=row["position"],
                        generation=row["generation"],
                        slot=row["slot"],
                        digest=row["digest"],
                        code_version=row["code_version"],
                        worker_id="w-corpus",
                        created_at=1764669600.25 + row["n"],
                        format_version=row["format_version"],
                        seq=row["n"],
                    )
                )
    return found


def test_every_corpus_event_renders_as_the_model_does() -> None:
    redactor = Redactor([SECRET])
    events = corpus_events()
    fast = 0
    for event in events:
        fragment = render.event_fragment(event, redactor)
        if fragment is not None:
            fast += 1
            assert fragment == model_bytes(event, redactor), (event.type, event.slot)
    assert len(events) > 500
    # The fast path is the common path: only events holding something it leaves to the
    # general path (the corpus's hostile strings, say) go the other way.
    assert fast >= 0.95 * len(events), (fast, len(events))


def hostile_events(run_id: str) -> list[Event]:
    """Events the fast path must leave to the general path, each for its own reason."""

    slots = iter(range(100, 200))

    def tool(result: Any, **envelope: Any) -> Event:
        pos = next(slots)
        return make_event(
            run_id,
            ToolCallRecorded(name="fetch", args={"q": 1}, result=result),
            **{"position": pos, "slot": f"main#0:{pos}", "created_at": 1764669601.5, **envelope},
        )

    deep: Any = "bottom"
    for _ in range(MAX_DEPTH + 2):
        deep = [deep]
    return [
        tool({"key": SECRET}),  # a secret this server redacts
        tool("a key shape: sk-ant-api03-" + "x" * 40),  # a key shape the redactor knows
        tool(deep),  # deeper than the redactor passes unchanged
        tool(2**70),  # an integer beyond 64 bits (orjson would read it as a float)
        tool(-(2**63) - 1),
        make_event(run_id, UnknownEvent(raw={"later": float("nan")}), created_at=1764669602.0),
        tool("ok", created_at=1764669603),  # an int where the model has a float
    ]


def test_what_the_fast_path_cannot_vouch_for_goes_the_general_way() -> None:
    redactor = Redactor([SECRET])
    run_id = new_run_id(1764669600.0)
    for n, event in enumerate(hostile_events(run_id), start=1):
        stored = dataclasses.replace(event, seq=n)
        assert render.event_fragment(stored, redactor) is None, n
    plain = make_event(
        run_id, ToolCallRecorded(name="fetch", args={}, result="ok"), created_at=1764669604.0
    )
    stored = dataclasses.replace(plain, seq=9)
    assert render.event_fragment(stored, redactor) == model_bytes(stored, redactor)


async def test_the_page_served_is_the_models_page(store: Store) -> None:
    """Ordinary and hostile events in one run, through the app on this backend: the body
    is the page the EventList model serialises, and no secret is in it."""
    run_id = new_run_id(1764669600.0)
    started = make_event(
        run_id, RunStarted(input={"q": "héllo \u2028 </script>"}), slot="run:start"
    )
    ordinary = [
        make_event(
            run_id,
            ToolCallRecorded(name="fetch", args={"i": i}, result={"n": [1, 2.5, -3e-7, None]}),
            position=i + 1,
            slot=f"main#0:{i + 1}",
            created_at=1764669610.125 + i,
        )
        for i in range(5)
    ]
    hostile = hostile_events(run_id)
    record, created = await store.create_run(
        NewRun(
            run_id,
            "echo",
            "main",
            {"q": 1},
            None,
            1764669600.0,
            started,
            events=[*ordinary[:3], *hostile, *ordinary[3:]],
        )
    )
    assert created
    app = create_app(store, toren.Registry(), tokens=[TOKEN, SECRET], console=False)
    redactor = Redactor([TOKEN, SECRET])
    for query, limit in (("limit=100", 100), ("limit=4", 4)):
        pieces: list[bytes] = []
        status = await call(app, f"/v1/runs/{record.id}/events", query, pieces.append)
        assert status == 200
        events = await store.load_events(record.id, after_seq=0, limit=limit)
        items = [redactor(e.to_dict()) for e in events]
        next_after = items[-1]["seq"] if len(items) == limit else None
        body = b"".join(pieces)
        assert body == model_body(items, next_after)
        assert SECRET.encode() not in body
