"""The Python clients against a real server: the blocking one (in a thread, the server in
this loop) and the async one; typed results, server error codes, resumed streams."""

from __future__ import annotations

import asyncio
import json
import warnings
from decimal import Decimal

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse

import toren
from toren.api import running_server
from toren.client import (
    Agent,
    AsyncTorenClient,
    Event,
    Run,
    TorenAPIError,
    TorenClient,
    TorenConnectionError,
    TorenMessageWarning,
)
from toren.client._protocol import SSEParser
from toren.errors import TorenError

from .proxy import dropping_proxy
from .support import SECRET, TOKEN, Api


async def test_sync_client_end_to_end(api: Api) -> None:
    def scenario() -> tuple[Run, list[Event], list[Agent]]:
        with TorenClient(api.url, TOKEN) as client:
            run = client.start_run("approval", {"order": "A-17"}, idempotency_key="k-1")
            assert (
                client.start_run("approval", {"order": "A-17"}, idempotency_key="k-1").id == run.id
            )
            assert client.get_run(run.id).agent == "approval"
            streamed: list[Event] = []
            for item in client.stream(run.id):
                assert isinstance(item, Event)
                streamed.append(item)
                if item.type == "RunWaiting":
                    assert client.send_message(run.id, "approve", {"ok": True}) > 0
            final = client.wait(run.id, timeout=20)
            page = client.events(run.id, limit=2)
            assert [e.seq for e in page.events] == [e.seq for e in streamed[:2]]
            listed = client.list_runs(agent="approval", limit=10)
            assert [r.id for r in listed.runs] == [run.id] and listed.next_cursor is None
            return final, streamed, client.agents()

    final, streamed, agents = await asyncio.to_thread(scenario)
    assert final.status == "completed" and final.output == {"decision": {"ok": True}}
    assert final.terminal and isinstance(final.usage.cost_usd, Decimal) and final.usage.steps >= 2
    assert [e.seq for e in streamed] == [e.seq for e in await api.store.load_events(final.id)]
    assert streamed[-1].type == "RunCompleted" and streamed[-1].payload["output"] == final.output
    assert "approval" in {a.name for a in agents}


async def test_sync_stream_resumes_after_drops(api: Api) -> None:
    run = await api.client.start_run("slow", {"n": 25})
    async with dropping_proxy(int(api.url.rsplit(":", 1)[1])) as proxy:

        def consume() -> list[int]:
            seqs: list[int] = []
            with TorenClient(proxy.url, TOKEN) as client:
                for item in client.stream(run.id):
                    assert isinstance(item, Event)
                    seqs.append(item.seq)
                    if len(seqs) % 6 == 0:
                        proxy_loop.call_soon_threadsafe(proxy.drop_all)
            return seqs

        proxy_loop = asyncio.get_running_loop()
        seqs = await asyncio.to_thread(consume)
    assert seqs == [e.seq for e in await api.store.load_events(run.id)]
    assert proxy.connections >= 4


async def test_errors_carry_the_server_code(api: Api) -> None:
    with pytest.raises(TorenAPIError) as info:
        await api.client.get_run("run_doesnotexist")
    assert (info.value.status, info.value.code) == (404, "run_not_found")
    assert isinstance(info.value, TorenError) and "run_doesnotexist" in info.value.message

    with pytest.raises(TorenAPIError) as info:
        await api.client.start_run("Bad Name!")
    assert (info.value.status, info.value.code) == (422, "invalid_request")

    async with AsyncTorenClient(api.url, "wrong") as bad:
        with pytest.raises(TorenAPIError) as info:
            await bad.list_runs()
    assert (info.value.status, info.value.code) == (401, "unauthorized")

    def sync_errors() -> None:
        with TorenClient(api.url, TOKEN) as client, pytest.raises(TorenAPIError) as err:
            client.cancel("run_doesnotexist")
        assert err.value.code == "run_not_found"

    await asyncio.to_thread(sync_errors)

    async with AsyncTorenClient("http://127.0.0.1:9", TOKEN, timeout=2) as nowhere:
        with pytest.raises(TorenConnectionError) as conn:
            await nowhere.health()
    assert conn.value.code == "connection_error"

    waiting = await api.client.start_run("approval", {})
    with pytest.raises(TimeoutError):
        await api.client.wait(waiting.id, timeout=0.2)
    await api.client.cancel(waiting.id)
    assert (await api.client.wait(waiting.id, timeout=20)).status == "cancelled"


async def test_async_list_pages_and_health(api: Api) -> None:
    ids = [(await api.client.start_run("echo", {"n": 1})).id for _ in range(3)]
    first = await api.client.list_runs(limit=2)
    second = await api.client.list_runs(limit=2, cursor=first.next_cursor)
    assert [r.id for r in first.runs + second.runs] == sorted(ids, reverse=True)
    assert second.next_cursor is None
    assert (await api.client.health())["version"] == toren.__version__


def test_sse_parser() -> None:
    parser = SSEParser()
    lines = ["retry: 1000", "", ": heartbeat", "id: 7", "event: event", "data: {", "data: }", ""]
    out = [m for m in (parser.feed(line) for line in lines) if m is not None]
    assert len(out) == 1
    assert (out[0].id, out[0].event, out[0].data) == ("7", "event", "{\n}")
    assert parser.feed("data: x") is None and parser.feed("").event == "message"  # type: ignore[union-attr]


def test_results_ignore_unknown_fields() -> None:
    run = Run.from_json({"id": "run_1", "agent": "a", "status": "completed", "new_field": 1})
    assert run.terminal and run.usage.steps == 0
    event = Event.from_json({"seq": 3, "run_id": "run_1", "type": "Future", "extra": True})
    assert event.payload == {} and event.type == "Future"


def leaking_server() -> FastAPI:
    """A server that echoes secrets in its errors (an older Toren, or a proxy's error page):
    the client must not pass them on in the errors it raises."""
    app = FastAPI()

    @app.get("/v1/runs/{run_id}")
    async def get_run(run_id: str, request: Request) -> Response:
        message = f"no run; you sent {request.headers['authorization']} and key {SECRET}"
        return JSONResponse(
            {"error": {"code": "run_not_found", "message": message, "details": [{"key": SECRET}]}},
            status_code=404,
        )

    @app.get("/v1/agents")
    async def agents(request: Request) -> Response:
        return PlainTextResponse(f"bad gateway ({request.headers['authorization']})", 502)

    @app.get("/v1/runs/{run_id}/stream")
    async def stream(run_id: str) -> Response:
        error = json.dumps({"error": {"code": "stream_error", "message": f"key {SECRET}"}})
        return Response(f"event: error\ndata: {error}\n\n", media_type="text/event-stream")

    return app


async def test_client_errors_never_carry_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    plain = "plain-value-0123456789"  # not key-shaped: only the environment names it
    monkeypatch.setenv("ACME_API_KEY", plain)
    async with running_server(leaking_server()) as server:
        errors: list[TorenAPIError] = []
        async with AsyncTorenClient(server.url, TOKEN) as client:
            for call in (client.get_run("run_1"), client.agents()):
                with pytest.raises(TorenAPIError) as info:
                    await call
                errors.append(info.value)
            with pytest.raises(TorenAPIError) as info:
                async for _ in client.stream("run_1"):
                    pass
            errors.append(info.value)

        def sync_error() -> TorenAPIError:
            with TorenClient(server.url, TOKEN) as client, pytest.raises(TorenAPIError) as err:
                client.get_run("run_1")
            return err.value

        errors.append(await asyncio.to_thread(sync_error))
    assert [(e.status, e.code) for e in errors] == [
        (404, "run_not_found"),
        (502, "http_error"),
        (200, "stream_error"),
        (404, "run_not_found"),
    ]
    for error in errors:
        text = f"{error} {error.message} {error.details}"
        assert TOKEN not in text and SECRET not in text and plain not in text, text
        assert "[redacted]" in error.message, text
    assert errors[0].details == [{"key": "[redacted]"}]

    async with AsyncTorenClient(f"http://{plain}@127.0.0.1:9", timeout=2) as nowhere:
        with pytest.raises(TorenConnectionError) as conn:
            await nowhere.health()
    assert plain not in str(conn.value) and "[redacted]" in str(conn.value)


async def test_a_message_under_a_name_the_run_does_not_wait_for_is_kept_with_a_warning(
    api: Api,
) -> None:
    """Issue 40 item 4: the API's answer and the Python client name the names the run
    waits for; the message is kept and does not wake the run."""
    run = await api.client.start_run("approval", {})
    await _until_waiting(api, run.id)
    async with api.http() as http:
        answer = await http.post(
            f"/v1/runs/{run.id}/messages", json={"name": "aprove", "payload": "yes"}
        )
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["waiting_for"] == ["approve"]
    assert "waiting for 'approve', not 'aprove'" in body["warning"]
    # Any message wakes the run to look (then it waits again): the client's warning on
    # a second run that has had no message yet.
    other = await api.client.start_run("approval", {})
    await _until_waiting(api, other.id)
    with pytest.warns(TorenMessageWarning, match="waiting for 'approve', not 'aprove'"):
        await api.client.send_message(other.id, "aprove", "again")
    await _until_waiting(api, run.id)
    events = (await api.client.events(run.id, limit=100)).events
    assert "MessageReceived" not in [e.type for e in events], "not taken by the run"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the name it waits for: no warning
        await api.client.send_message(run.id, "approve", "yes")
    assert (await api.client.wait(run.id, timeout=20)).status == "completed"


async def _until_waiting(api: Api, run_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while (await api.client.get_run(run_id)).status != "waiting":
        assert asyncio.get_running_loop().time() < deadline, "the run never waited"
        await asyncio.sleep(0.02)
