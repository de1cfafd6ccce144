"""GET /v1/runs/{run_id}/events streams its page: the body is the same bytes the
EventList model produced whole before, and the server holds a few events of it at a time,
not the page (measured with tracemalloc in-process; no wall clock)."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

import toren
from toren.api import create_app, models
from toren.api.app import MAX_EVENTS_PAGE_BYTES
from toren.core.contract.events import RunStarted, ToolCallRecorded, make_event
from toren.core.drivers.runs import new_run_id
from toren.errors import StorageError
from toren.redact import Redactor
from toren.store import Store
from toren.store.base import NewRun

TOKEN = "tok-events-stream-0123456789"
EVENT_CHARS = 600_000
EVENTS = 30  # 18 MB of log: the page stops at 8 MiB


async def big_run(store: Store) -> str:
    run_id = new_run_id(1764669600.0)
    started = make_event(run_id, RunStarted(input={"big": True}), slot="run:start")
    steps = [
        make_event(
            run_id,
            ToolCallRecorded(name="fetch", args={"i": i}, result="é" + "z" * EVENT_CHARS),
            position=i,
            slot=f"main#0:{i}",
            created_at=1764669600.5 + i,
        )
        for i in range(EVENTS)
    ]
    record, created = await store.create_run(
        NewRun(run_id, "big", "main", {"big": True}, None, 1764669600.0, started, events=steps)
    )
    assert created
    return record.id


def model_body(items: list[dict[str, Any]], next_after: int | None) -> bytes:
    """The page as FastAPI serialised the route's dict through EventList before."""
    app = FastAPI()

    @app.get("/page", response_model=models.EventList)
    async def page() -> dict[str, Any]:
        return {"events": items, "next_after": next_after}

    import fastapi.testclient

    with fastapi.testclient.TestClient(app) as client:
        return client.get("/page").content


async def old_page(store: Store, run_id: str, limit: int) -> tuple[list[dict[str, Any]], bool]:
    """The page built whole, as the code before streaming did (the rule: events in order
    while their JSON stays within the budget, in bytes; at least one)."""
    redact = Redactor([TOKEN])
    page: list[dict[str, Any]] = []
    size = 0
    for event in await store.load_events(run_id, after_seq=0, limit=limit):
        item = redact(event.to_dict())
        size += len(models.Event.model_validate(item).model_dump_json().encode())
        if page and size > MAX_EVENTS_PAGE_BYTES:
            return page, True
        page.append(item)
    return page, len(page) == limit


async def call(app: Any, path: str, query: str, on_body: Callable[[bytes], None]) -> int:
    """One request straight through the ASGI app; body pieces go to ``on_body``."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {TOKEN}".encode())],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 80),
    }
    status = 0
    sent = False

    done = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await done.wait()  # the client stays connected until the response is over
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            on_body(message.get("body", b""))

    try:
        await app(scope, receive, send)
    finally:
        done.set()
    return status


async def test_events_page_is_streamed_in_bounded_memory(store: Store) -> None:
    run_id = await big_run(store)
    app = create_app(store, toren.Registry(), tokens=[TOKEN], console=False)
    path = f"/v1/runs/{run_id}/events"

    pieces: list[bytes] = []
    assert await call(app, path, "limit=1000", pieces.append) == 200
    body = b"".join(pieces)
    items, more = await old_page(store, run_id, 1000)
    assert 8 < len(items) < EVENTS and more  # cut by the 8 MiB budget
    expected = model_body(items, items[-1]["seq"])
    assert body == expected  # byte for byte, so JSON-equal too
    assert json.loads(body)["next_after"] == items[-1]["seq"]
    assert len(body) > 7_000_000

    # The server's memory while it answers, with a reader that keeps nothing.
    received = 0

    def count(piece: bytes) -> None:
        nonlocal received
        received += len(piece)

    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        assert await call(app, path, "limit=1000", count) == 200
        page_peak = tracemalloc.get_traced_memory()[1] - base
        assert received == len(body)
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        assert await call(app, path, "limit=2", count) == 200  # two events only
        two_peak = tracemalloc.get_traced_memory()[1] - base
        # For scale: the same page built whole, then serialised, as before streaming.
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        whole = await old_page(store, run_id, 1000)
        whole_body = models.EventList.model_validate(
            {"events": whole[0], "next_after": None}
        ).model_dump_json()
        whole_peak = tracemalloc.get_traced_memory()[1] - base
        del whole, whole_body
    finally:
        tracemalloc.stop()
    print(f"\npeak: page {page_peak}, two events {two_peak}, built whole {whole_peak}")
    # What a response holds does not grow with the page (13 events of 0.6 MB cost what
    # 2 do: one chunk read and one event's copies in flight), and is a fraction of what
    # building the page whole took.
    assert page_peak < two_peak * 1.5 + 1024 * 1024, (page_peak, two_peak)
    assert page_peak < whole_peak / 2, (page_peak, whole_peak)


async def test_small_pages_and_the_end_of_the_log_are_unchanged(store: Store) -> None:
    run_id = await big_run(store)
    app = create_app(store, toren.Registry(), tokens=[TOKEN], console=False)
    path = f"/v1/runs/{run_id}/events"
    for query, after, limit in (("limit=3", 0, 3), ("after=25&limit=1000", 25, 1000)):
        pieces: list[bytes] = []
        assert await call(app, path, query, pieces.append) == 200
        events = [
            Redactor([TOKEN])(e.to_dict())
            for e in await store.load_events(run_id, after_seq=after, limit=limit)
        ]
        next_after = events[-1]["seq"] if len(events) == limit else None
        assert b"".join(pieces) == model_body(events, next_after)
    missing = await call(app, "/v1/runs/run_0000000000000000000000/events", "", lambda _: None)
    assert missing == 404


class FailingAfterStart:
    """A real store whose event reads fail once the first chunk of a page was read: the
    database gone while a page is streamed (PostgreSQL under 200 concurrent event reads
    gave up waiting for a connection there, issue 34)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.failed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def load_events(self, run_id: str, *, after_seq: int = 0, limit: int | None = None):  # type: ignore[no-untyped-def]
        if after_seq > 0 and self.failed == 0:
            self.failed += 1
            raise StorageError("PostgreSQL error: couldn't get a connection after 30.00 sec")
        return await self._store.load_events(run_id, after_seq=after_seq, limit=limit)


async def test_a_read_failing_mid_page_ends_the_page_instead_of_the_connection(
    store: Store,
) -> None:
    """Once a page's response has started, a failed read cannot become an error status: it
    used to abort the connection (the client read a truncated body). The page now ends
    whole where it was, with ``next_after``, and the next page carries on from there."""
    run_id = new_run_id(1764669600.0)
    started = make_event(run_id, RunStarted(input={}), slot="run:start")
    steps = [
        make_event(
            run_id,
            ToolCallRecorded(name="fetch", args={"i": i}, result=f"r{i}"),
            position=i,
            slot=f"main#0:{i}",
            created_at=1764669600.5 + i,
        )
        for i in range(12)
    ]
    await store.create_run(
        NewRun(run_id, "big", "main", {}, None, 1764669600.0, started, events=steps)
    )
    failing = FailingAfterStart(store)
    app = create_app(failing, toren.Registry(), tokens=[TOKEN], console=False)  # type: ignore[arg-type]
    path = f"/v1/runs/{run_id}/events"
    pieces: list[bytes] = []
    assert await call(app, path, "limit=1000", pieces.append) == 200
    first = json.loads(b"".join(pieces))  # whole JSON: nothing cut
    assert failing.failed == 1
    assert 0 < len(first["events"]) < 13 and first["next_after"] == first["events"][-1]["seq"]
    pieces.clear()
    assert await call(app, path, f"after={first['next_after']}&limit=1000", pieces.append) == 200
    rest = json.loads(b"".join(pieces))
    seqs = [e["seq"] for e in first["events"] + rest["events"]]
    assert seqs == [e.seq for e in await store.load_events(run_id)] and rest["next_after"] is None
