"""Live event streams over SSE: exactly once, in order, across disconnects and resumes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from toren.client import AsyncTorenClient, Delta, Event, TorenAPIError, TorenClient
from toren.client._protocol import SSEMessage, StreamState
from toren.redact import Redactor
from toren.store import Store

from .proxy import dropping_proxy
from .support import TOKEN, Api, read_sse, serve_api


def is_end(msg: dict) -> bool:  # type: ignore[type-arg]
    return msg.get("event") in ("end", "error")


async def test_stream_delivers_the_log_deltas_and_end(api: Api) -> None:
    run = await api.client.start_run("echo", {"n": 3})
    async with api.http() as http, http.stream("GET", f"/v1/runs/{run.id}/stream") as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        messages = await read_sse(r, until=is_end)
    events = [m for m in messages if m.get("event") == "event"]
    stored = await api.store.load_events(run.id)
    assert [int(m["id"]) for m in events] == [e.seq for e in stored]
    assert [m["data"] for m in events] == [e.to_dict() for e in stored]
    end = messages[-1]
    assert end["event"] == "end" and "id" not in end
    assert end["data"]["run"]["status"] == "completed" and end["data"]["run"]["id"] == run.id
    for delta in (m for m in messages if m.get("event") == "delta"):
        assert "id" not in delta and set(delta["data"]) == {"stream", "position", "text"}


async def test_disconnect_mid_run_and_resume_with_last_event_id(api: Api) -> None:
    """Read until the run parks waiting for a message, hang up, let the run go on while
    nobody listens, reconnect with Last-Event-ID: every event once, in order."""
    run = await api.client.start_run("approval", {})
    async with api.http() as http:
        async with http.stream("GET", f"/v1/runs/{run.id}/stream") as r:
            first = await read_sse(r, until=lambda m: m.get("data", {}).get("type") == "RunWaiting")
        # Disconnected. The run continues and finishes meanwhile.
        await api.client.send_message(run.id, "approve", "ok")
        await api.client.wait(run.id, timeout=20)
        last_id = [m for m in first if m.get("event") == "event"][-1]["id"]
        async with http.stream(
            "GET", f"/v1/runs/{run.id}/stream", headers={"Last-Event-ID": last_id}
        ) as r:
            second = await read_sse(r, until=is_end)
    seqs = [int(m["id"]) for m in first + second if m.get("event") == "event"]
    stored = await api.store.load_events(run.id)
    assert seqs == [e.seq for e in stored]
    assert len(seqs) == len(set(seqs))
    assert "MessageReceived" in [m["data"]["type"] for m in second if m.get("event") == "event"]
    assert second[-1]["event"] == "end"


async def test_header_wins_over_query_and_query_resumes(api: Api) -> None:
    run = await api.client.start_run("slow", {"n": 3})
    await api.client.wait(run.id, timeout=20)
    stored = await api.store.load_events(run.id)
    async with api.http() as http:
        url = f"/v1/runs/{run.id}/stream"
        async with http.stream("GET", url, params={"after": stored[1].seq}) as r:
            by_query = await read_sse(r, until=is_end)
        async with http.stream(
            "GET", url, params={"after": 0}, headers={"Last-Event-ID": str(stored[-2].seq)}
        ) as r:
            by_header = await read_sse(r, until=is_end)
    assert [int(m["id"]) for m in by_query if "id" in m] == [e.seq for e in stored[2:]]
    assert [int(m["id"]) for m in by_header if "id" in m] == [stored[-1].seq]


async def test_client_stream_resumes_after_dropped_connections(api: Api) -> None:
    run = await api.client.start_run("slow", {"n": 40})
    received: list[int] = []
    async with (
        dropping_proxy(int(api.url.rsplit(":", 1)[1])) as proxy,
        AsyncTorenClient(proxy.url, TOKEN) as c,
    ):
        async for item in c.stream(run.id):
            assert isinstance(item, Event)
            received.append(item.seq)
            if len(received) % 7 == 0:
                proxy.drop_all()  # cut the TCP connection under the client
    stored = await api.store.load_events(run.id)
    assert received == [e.seq for e in stored]
    assert stored[-1].type == "RunCompleted"
    assert proxy.connections >= 5  # it really reconnected


async def test_unavailable_resume_id_is_an_error_event(api: Api) -> None:
    done = await api.client.start_run("echo", {"n": 1})
    other = await api.client.start_run("echo", {"n": 1})
    await api.client.wait(done.id, timeout=20)
    await api.client.wait(other.id, timeout=20)
    last = (await api.store.load_events(done.id))[-1].seq
    foreign = (await api.store.load_events(other.id))[0].seq
    async with api.http() as http:
        for bad in (last + 1000, foreign):
            async with http.stream(
                "GET", f"/v1/runs/{done.id}/stream", headers={"Last-Event-ID": str(bad)}
            ) as r:
                messages = await read_sse(r)
            assert [m["event"] for m in messages] == ["error"]
            error = messages[0]["data"]["error"]
            assert error["code"] == "event_id_unavailable" and str(bad) in error["message"]
    with pytest.raises(TorenAPIError) as info:
        async for _ in api.client.stream(done.id, after=last + 1000):
            pass
    assert info.value.code == "event_id_unavailable"
    missing = await api.client.get_run(done.id)
    assert missing.status == "completed"
    with pytest.raises(TorenAPIError) as info:
        async for _ in api.client.stream("run_missing"):
            pass
    assert (info.value.status, info.value.code) == (404, "run_not_found")


async def test_heartbeats_while_waiting(api: Api) -> None:
    run = await api.client.start_run("approval", {})
    async with api.http() as http, http.stream("GET", f"/v1/runs/{run.id}/stream") as r:
        seen: list[str] = []

        async def read() -> None:
            async for line in r.aiter_lines():
                seen.append(line)
                if seen.count(": heartbeat") >= 2:
                    return

        await asyncio.wait_for(read(), 10)  # heartbeat=0.3s in these tests
    await api.client.cancel(run.id)


async def test_client_stream_with_token_deltas(api: Api) -> None:
    run = await api.client.start_run("approval", {})
    items: list[Event | Delta] = []
    async for item in api.client.stream(run.id, deltas=True):
        items.append(item)
        if isinstance(item, Event) and item.type == "RunWaiting":
            # Subscribed for sure now: the model call after the message streams deltas.
            await api.client.send_message(run.id, "approve", "yes")
    events = [i for i in items if isinstance(i, Event)]
    assert [e.seq for e in events] == [e.seq for e in await api.store.load_events(run.id)]
    last_call = [e for e in events if e.type == "ModelCallRecorded"][-1]
    deltas = [i for i in items if isinstance(i, Delta)]
    text = "".join(d.text for d in deltas if d.position == last_call.position)
    assert text == last_call.payload["response"]["text"]
    # Deltas precede the event that records their step.
    for d in deltas:
        recorded = next(e for e in events if (e.stream, e.position) == (d.stream, d.position))
        assert items.index(d) < items.index(recorded)


async def test_streams_poll_the_store_without_a_live_hub(store: Store) -> None:
    """The worker in another process (no hub): the stream still sees everything."""
    async with serve_api(store, live=False) as api:
        run = await api.client.start_run("slow", {"n": 5})
        seqs = [item.seq async for item in api.client.stream(run.id) if isinstance(item, Event)]
        assert seqs == [e.seq for e in await store.load_events(run.id)]


async def _failed_then_retried(api: Api, fixed: Path) -> str:
    """A run failed by its code, then retried once the code is fixed: it goes on from its
    log and waits for a message ``approve`` (so it is not over when it is streamed)."""
    run = await api.client.start_run("mend", {"fixed": str(fixed)})
    assert (await api.client.wait(run.id, timeout=20)).status == "failed"
    fixed.write_text("fixed")
    retried = await api.client.retry(run.id)
    assert retried.status not in ("failed", "completed")
    return run.id


async def _approve_when_waiting(api: Api, run_id: str) -> None:
    deadline = asyncio.get_running_loop().time() + 20
    while (await api.client.get_run(run_id)).status != "waiting":
        assert asyncio.get_running_loop().time() < deadline, "the retried run never waited"
        await asyncio.sleep(0.02)
    await api.client.send_message(run_id, "approve", "yes")


async def test_stream_of_a_retried_run_ends_with_its_current_attempt(
    api: Api, tmp_path: Path
) -> None:
    """After POST /retry, the RunFailed of the earlier attempt is in the log: the stream
    delivers it and goes on until the new attempt ends (issue 40 item 1)."""
    run_id = await _failed_then_retried(api, tmp_path / "fixed")
    approver = asyncio.create_task(_approve_when_waiting(api, run_id))
    async with api.http() as http, http.stream("GET", f"/v1/runs/{run_id}/stream") as r:
        messages = await asyncio.wait_for(read_sse(r, until=is_end), 30)
    await approver
    types = [m["data"]["type"] for m in messages if m.get("event") == "event"]
    assert types.index("RunFailed") < types.index("RunRetried") < types.index("RunCompleted")
    assert types[-1] == "RunCompleted"
    end = messages[-1]
    assert end["event"] == "end" and end["data"]["run"]["status"] == "completed"
    assert end["data"]["run"]["output"] == {"decision": "yes"}


async def test_client_streams_of_a_retried_run_follow_the_new_attempt(
    api: Api, tmp_path: Path
) -> None:
    """The Python clients' ``stream()`` after ``retry()``: to the new attempt's end."""
    run_id = await _failed_then_retried(api, tmp_path / "fixed")
    approver = asyncio.create_task(_approve_when_waiting(api, run_id))

    async def collect() -> list[str]:
        return [e.type async for e in api.client.stream(run_id) if isinstance(e, Event)]

    types = await asyncio.wait_for(collect(), 30)
    await approver
    assert types[-1] == "RunCompleted" and "RunRetried" in types

    def read_sync() -> list[str]:  # the sync client (in a thread: the server is in this loop)
        with TorenClient(api.url, TOKEN) as sync:
            return [e.type for e in sync.stream(run_id) if isinstance(e, Event)]

    assert await asyncio.to_thread(read_sync) == types


def test_an_end_message_of_a_run_that_goes_on_is_not_the_end() -> None:
    """An older server ends a retried run's stream at the earlier attempt's RunFailed,
    with the run back to ``running``: the client does not stop there (it reconnects
    after the last event and reads on)."""
    state = StreamState("run_1", 0, False, Redactor())
    running = json.dumps({"run": {"id": "run_1", "agent": "a", "status": "running"}})
    assert state.handle(SSEMessage("end", running)) is None and not state.done
    done = json.dumps({"run": {"id": "run_1", "agent": "a", "status": "completed"}})
    assert state.handle(SSEMessage("end", done)) is None and state.done
    assert state.final is not None and state.final.status == "completed"
