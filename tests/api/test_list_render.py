"""GET /v1/runs renders its page straight to JSON (toren.api.render): the body must be the
one the RunList model produced before, byte for byte, and what the fast path cannot vouch
for (a secret, a value nested too deep, an integer beyond 64 bits) must take the general
path. The page carries an ETag; an unchanged page is a 304."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

import toren
from toren.api import create_app, models, render
from toren.core.contract.clock import ManualClock
from toren.core.contract.jsontext import dumps
from toren.redact import Redactor
from toren.store import Store
from toren.store.base import RunRecord, ValueSummary

SECRET = "sk-test-RENDERSECRET0123456789abcdef"
TOKEN = "tok-render-0123456789abcdef"


def records() -> list[RunRecord]:
    base = RunRecord(
        id="run_0190c2a5e1f3a1b2c3d4e5",
        agent="echo",
        process="main",
        status="completed",
        input={"q": 'héllo \u2028 "quoted" \\ </script>', "n": [1, 2.5, -3e-7, None, True]},
        output={"answer": "ok", "big": 12345678901234},
        created_at=1764669600.123456,
        updated_at=1764669601.5,
        input_tokens=10,
        output_tokens=20,
        cost_nanousd=123_456_789,
        saved_nanousd=1_000,
        steps=3,
        code_version="abc123",
    )
    return [
        base,
        dataclasses.replace(
            base,
            id="run_0190c2a5e1f3a1b2c3d4e4",
            status="running",
            input=None,
            output=None,
            summaries={
                "input": ValueSummary(1_000_034, '{"text":"xxxx'),
                "error": ValueSummary(5000, '{"type":"E"'),
            },
            lease_owner="w1",
            lease_expires_at=1764669700.0,
            waiting_for=None,
        ),
        dataclasses.replace(
            base,
            id="run_0190c2a5e1f3a1b2c3d4e3",
            status="waiting",
            output=None,
            waiting_for=["approve", "ünïcode"],
            not_before=1764669800.25,
            blocked_error={"type": "ProviderError", "code": "x", "message": "down"},
            blocked_attempts=2,
            blocked_since=1764669650.0,
            forked_from="run_0190c2a5e1f3a1b2c3d4e0",
            forked_at="main:2",
            retries=1,
            cancel_requested=True,
        ),
        dataclasses.replace(
            base,
            id="run_0190c2a5e1f3a1b2c3d4e2",
            status="failed",
            output=None,
            error={"type": "ValueError", "message": "bad\nline"},
            summaries={"output": ValueSummary(4097, "[" * 10)},
        ),
    ]


def model_body(runs: list[RunRecord], next_cursor: str | None, redactor: Redactor) -> bytes:
    """The body as the RunList response model rendered it before (FastAPI validating and
    serialising the route's dict)."""
    app = FastAPI()

    @app.get("/page", response_model=models.RunList)
    async def page() -> dict[str, Any]:
        return {"runs": [redactor(r.to_dict()) for r in runs], "next_cursor": next_cursor}

    import fastapi.testclient

    with fastapi.testclient.TestClient(app) as client:
        return client.get("/page").content


@pytest.mark.parametrize("cursor", [None, "run_0190c2a5e1f3a1b2c3d4e2"])
def test_fast_body_is_the_models_body_byte_for_byte(cursor: str | None) -> None:
    redactor = Redactor([SECRET])
    runs = records()
    fast = render.runs_page(runs, cursor, redactor)
    assert fast is not None
    assert fast == model_body(runs, cursor, redactor)
    assert render.runs_page([], None, redactor) == model_body([], None, redactor)


@pytest.mark.parametrize(
    "change",
    [
        {"output": {"leak": f"key {SECRET} here"}},  # a secret: redacted by the general path
        {"output": {"key": "sk-" + "A" * 20}},  # a key shape
        {"output": 2**70},  # beyond 64 bits: orjson refuses it
        "deep",  # nested past the redactor's bound (built below)
    ],
)
def test_what_the_fast_path_cannot_vouch_for_takes_the_general_path(change: Any) -> None:
    redactor = Redactor([SECRET])
    if change == "deep":
        value: Any = "leaf"
        for _ in range(140):
            value = [value]
        change = {"input": value}
    assert isinstance(change, dict)
    runs = [dataclasses.replace(records()[0], **change), *records()[1:]]
    assert render.runs_page(runs, None, redactor) is None
    if change.get("output") != 2**70:  # (pydantic serialises big integers; orjson cannot)
        # The general path (app.list_runs) renders what the response model did.
        general = models.RunList.model_validate(
            {"runs": [redactor(r.to_dict()) for r in runs], "next_cursor": None}
        ).model_dump_json()
        assert general.encode() == model_body(runs, None, redactor)
        assert SECRET not in general


def test_a_secret_with_a_character_json_escapes_is_never_trusted_to_the_text() -> None:
    redactor = Redactor(['pass"word-0123456789'])
    assert render.runs_page(records(), None, redactor) is None


@pytest.mark.parametrize(
    ("header", "hit"),
    [
        ('"abc"', True),
        ('W/"abc"', True),
        ('"x", W/"abc"', True),
        ("*", True),
        ('"abd"', False),
        ("abc", False),
        ("", False),
    ],
)
def test_if_none_match(header: str, hit: bool) -> None:
    assert render.not_modified(header, '"abc"') is hit


async def test_list_etag_and_304_over_a_real_store(store: Store) -> None:
    async def echo(ctx: Any, input: Any) -> Any:
        return input

    registry = toren.Registry()
    registry.add("echo", echo)
    # One millisecond apart at least: run ids order by their creation millisecond.
    clock = ManualClock()
    for i in range(3):
        await clock.advance(0.01)
        await toren.start_run(
            store, registry, "echo", {"i": i, "text": "x" * (5000 * i)}, clock=clock
        )
    app = create_app(store, registry, tokens=[TOKEN], console=False)
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(
        transport=transport, base_url="http://127.0.0.1", headers=headers
    ) as http:
        first = await http.get("/v1/runs", params={"limit": 2})
        assert first.status_code == 200 and first.headers["content-type"] == "application/json"
        tag = first.headers["etag"]
        assert first.headers["cache-control"] == "private, no-cache"
        page = first.json()
        assert [r["input_summary"] is not None for r in page["runs"]] == [True, True]
        assert page["runs"][0]["input"] is None and page["next_cursor"] == page["runs"][1]["id"]

        again = await http.get("/v1/runs", params={"limit": 2}, headers={"If-None-Match": tag})
        assert again.status_code == 304 and again.content == b""
        assert again.headers["etag"] == tag

        other = await http.get("/v1/runs", params={"limit": 3}, headers={"If-None-Match": tag})
        assert other.status_code == 200  # another query, another page

        await clock.advance(0.01)
        await toren.start_run(store, registry, "echo", {"i": 3}, clock=clock)
        changed = await http.get("/v1/runs", params={"limit": 2}, headers={"If-None-Match": tag})
        assert changed.status_code == 200 and changed.headers["etag"] != tag
        assert changed.json()["runs"][0]["input"] == {"i": 3}


async def test_list_records_match_the_runs_own_read(store: Store) -> None:
    """The list's row mapping (built without the dataclass __init__) gives the same record
    as the run's own read, but for the values a list leaves out."""

    async def echo(ctx: Any, input: Any) -> Any:
        return input

    registry = toren.Registry()
    registry.add("echo", echo)
    small = await toren.start_run(store, registry, "echo", {"small": True})
    large = await toren.start_run(store, registry, "echo", {"text": "y" * 10_000})
    listed = {r.id: r for r in await store.list_runs(limit=10, summary=True)}
    for run, left_out in ((small, False), (large, True)):
        whole = await store.get_run(run.id)
        assert whole is not None
        text = dumps(whole.input)
        expected = dataclasses.replace(
            whole,
            input=None if left_out else whole.input,
            summaries={"input": ValueSummary(len(text.encode()), text[:256])} if left_out else None,
        )
        assert listed[run.id] == expected


async def test_an_unchanged_row_is_the_same_record_a_changed_one_is_not(store: Store) -> None:
    """Lists remember the records of the rows they returned lately (a console polls the
    same page), so an unchanged row is mapped and rendered once; any change is seen."""
    import time

    async def echo(ctx: Any, input: Any) -> Any:
        return input

    registry = toren.Registry()
    registry.add("echo", echo)
    run = await toren.start_run(store, registry, "echo", {"i": 1})
    (first,) = await store.list_runs(limit=1, summary=True)
    (again,) = await store.list_runs(limit=1, summary=True)
    assert again is first
    redactor = Redactor([SECRET])
    assert render.runs_page([again], None, redactor) == render.runs_page([first], None, redactor)
    await store.request_cancel(run.id, now=time.time())
    (changed,) = await store.list_runs(limit=1, summary=True)
    assert changed is not first and changed.cancel_requested and not first.cancel_requested
    body = render.runs_page([changed], None, redactor)
    assert body is not None and b'"cancel_requested":true' in body


def test_the_memos_are_bounded() -> None:
    from toren.store.sql import ListedRows

    listed = ListedRows(size=2)
    row = [None] * 40
    rows = [tuple([f"run_{i}", *row[1:]]) for i in range(3)]
    records_ = [listed.records([r])[0] for r in rows]
    assert len(listed._found) == 2
    assert listed.records([rows[2]])[0] is records_[2]  # kept: the newest
    assert listed.records([rows[0]])[0] is not records_[0]  # evicted: mapped again
    fragments = render.Fragments(size=2)
    runs = records()
    for run in runs:
        assert fragments.get(run) == render.run_fragment(run)
    assert len(fragments._found) == 2


def test_pages_are_remembered_by_their_fragments_and_bounded() -> None:
    redactor = Redactor([SECRET])
    runs = records()
    pages = render.Pages(max_bytes=4 * 8192)
    first = pages.page(runs, None, redactor)
    assert first is not None and first[0] == render.runs_page(runs, None, redactor)
    assert first[1] == render.etag(first[0])
    assert pages.page(runs, None, redactor) == first  # the same records: the same page
    assert pages.page(runs, "run_0190c2a5e1f3a1b2c3d4e2", redactor) != first  # the cursor
    changed = [dataclasses.replace(runs[0], status="failed"), *runs[1:]]
    other = pages.page(changed, None, redactor)
    assert other is not None and other[1] != first[1] and b'"status":"failed"' in other[0]
    leaky = [dataclasses.replace(runs[0], output={"k": SECRET}), *runs[1:]]
    assert pages.page(leaky, None, redactor) is None
    for i in range(20):
        pages.page([dataclasses.replace(runs[0], steps=i)], None, redactor)
    assert pages._bytes <= pages.max_bytes


def test_a_kept_fragment_holds_no_more_memory_than_its_bytes() -> None:
    """``Fragments`` and ``Pages`` keep fragments; each must cost its length, not the
    buffer orjson grew for it (8 KB and more for a run of 1 KB: 50 concurrent searches
    once held ~35 MB of that slack in a server)."""
    import tracemalloc

    runs = [dataclasses.replace(r, id=f"run_{i:022d}") for i, r in enumerate(records() * 50)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [render.run_fragment(run) for run in runs]
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    length = sum(len(f) for f in kept)
    # A bytes object's header is ~33 bytes; the list ~8 bytes an entry.
    assert held <= length + 64 * len(kept), (held, length, len(kept))
