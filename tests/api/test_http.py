"""The JSON routes against a real server and worker, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import toren
from toren.agents.resolver import DirectoryResolver
from toren.api import create_app, running_server
from toren.core.contract.events import RunStarted, make_event
from toren.core.drivers.runs import new_run_id
from toren.store import Store
from toren.store.base import NewRun, RunRecord

from .support import SECRET, TOKEN, Api, read_sse, registry


def error_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and body["error"]["message"]
    return dict(body["error"])


async def test_start_get_and_idempotency(api: Api) -> None:
    async with api.http() as http:
        r = await http.post("/v1/runs", json={"agent": "echo", "input": {"n": 2}})
        assert r.status_code == 201, r.text
        run = r.json()
        assert run["agent"] == "echo" and run["process"] == "main" and run["status"] == "queued"
        assert (await http.get(f"/v1/runs/{run['id']}")).json()["id"] == run["id"]

        body = {"agent": "echo", "input": {"n": 1}, "idempotency_key": "order-17"}
        first = await http.post("/v1/runs", json=body)
        again = await http.post("/v1/runs", json=body)
        assert (first.status_code, again.status_code) == (201, 200)
        assert first.json()["id"] == again.json()["id"]
        by_header = await http.post(
            "/v1/runs",
            json={"agent": "echo", "input": {"n": 1}},
            headers={"Idempotency-Key": "order-17"},
        )
        assert by_header.status_code == 200 and by_header.json()["id"] == first.json()["id"]

        conflict = await http.post("/v1/runs", json={**body, "input": {"n": 5}})
        assert conflict.status_code == 409 and error_of(conflict)["code"] == "idempotency_conflict"
        mismatch = await http.post("/v1/runs", json=body, headers={"Idempotency-Key": "other"})
        assert mismatch.status_code == 409 and error_of(mismatch)["code"] == "idempotency_conflict"

        # The deprecated spelling still works for one more minor, and says so.
        old = await http.post(
            "/v1/runs", json={"agent": "echo", "input": {"n": 1}, "idempotencyKey": "order-17"}
        )
        assert old.status_code == 200 and old.json()["id"] == first.json()["id"]
        assert old.headers["Deprecation"] == "true"
        assert (
            "'POST /v1/runs idempotency_key'" in old.headers["Warning"]
            and "0.3.0" in old.headers["Warning"]
        )
        assert "Deprecation" not in first.headers
        both = await http.post("/v1/runs", json={**body, "idempotencyKey": "other"})
        assert both.status_code == 409 and error_of(both)["code"] == "idempotency_conflict"

    done = await api.client.wait(run["id"], timeout=20)
    assert done.status == "completed" and done.output["turns"] == 2
    assert done.usage.steps == 2 and done.usage.input_tokens > 0


async def test_list_filters_and_cursor_pagination(api: Api) -> None:
    ids = [(await api.client.start_run("approval", {"i": i})).id for i in range(5)]
    other = await api.client.start_run("slow", {"n": 1}, process="batch")
    async with api.http() as http:
        seen: list[str] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"agent": "approval", "limit": 2}
            if cursor:
                params["cursor"] = cursor
            page = (await http.get("/v1/runs", params=params)).json()
            seen += [r["id"] for r in page["runs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert seen == sorted(ids, reverse=True)  # newest first, each once
        by_process = (await http.get("/v1/runs", params={"process": "batch"})).json()["runs"]
        assert [r["id"] for r in by_process] == [other.id]
        await api.client.wait(other.id, timeout=20)
        completed = (await http.get("/v1/runs", params={"status": "completed"})).json()["runs"]
        assert other.id in [r["id"] for r in completed]
        bad = await http.get("/v1/runs", params={"status": "exploded"})
        assert bad.status_code == 422 and error_of(bad)["code"] == "invalid_request"


async def test_events_after_and_pages(api: Api) -> None:
    run = await api.client.start_run("slow", {"n": 6})
    await api.client.wait(run.id, timeout=20)
    stored = await api.store.load_events(run.id)
    page = await api.client.events(run.id, limit=3)
    assert [e.seq for e in page.events] == [e.seq for e in stored[:3]]
    assert page.next_after == stored[2].seq
    rest = await api.client.events(run.id, after=page.next_after, limit=1000)
    assert [e.seq for e in rest.events] == [e.seq for e in stored[3:]] and rest.next_after is None
    assert rest.events[-1].type == "RunCompleted"
    assert rest.events[-1].payload == {"output": {"ticks": 6}}


async def test_message_wakes_a_waiting_run(api: Api) -> None:
    run = await api.client.start_run("approval", {})
    await toren.wait_for_run(api.store, run.id, until=("waiting",), timeout=20)
    assert (await api.client.get_run(run.id)).waiting_for == ["approve"]
    async with api.http() as http:
        r = await http.post(
            f"/v1/runs/{run.id}/messages", json={"name": "approve", "payload": "yes"}
        )
        assert r.status_code == 202 and r.json()["run_id"] == run.id
        done = await api.client.wait(run.id, timeout=20)
        assert done.output == {"decision": "yes"}
        late = await http.post(f"/v1/runs/{run.id}/messages", json={"name": "approve"})
        assert late.status_code == 409 and error_of(late)["code"] == "run_finished"
        missing = await http.post("/v1/runs/run_nope/messages", json={"name": "approve"})
        assert missing.status_code == 404 and error_of(missing)["code"] == "run_not_found"


async def test_cancel(api: Api) -> None:
    waiting = await api.client.start_run("approval", {})
    running = await api.client.start_run("slow", {"n": 500})
    await toren.wait_for_run(api.store, waiting.id, until=("waiting",), timeout=20)
    while len(await api.store.load_events(running.id)) < 3:  # mid-run: steps recorded
        await asyncio.sleep(0.01)
    for run_id in (waiting.id, running.id):
        assert (await api.client.cancel(run_id)).cancel_requested
    assert (await api.client.wait(waiting.id, timeout=20)).status == "cancelled"
    assert (await api.client.wait(running.id, timeout=5)).status == "cancelled"
    events = await api.store.load_events(running.id)
    assert events[-1].type == "RunCancelled" and len(events) < 100


async def test_agents_health_ready_metrics_plan(api: Api) -> None:
    agents = {a.name: a.processes for a in await api.client.agents()}
    assert agents == {
        "approval": ["main"],
        "echo": ["main"],
        "leaky": ["main"],
        "mend": ["main"],
        "slow": ["batch", "main"],
    }
    run = await api.client.start_run("echo", {"n": 2})
    await api.client.wait(run.id, timeout=20)
    async with api.http() as http:
        assert (await http.get("/v1/health")).json() == {
            "status": "ok",
            "version": toren.__version__,
        }
        assert (await http.get("/v1/ready")).json() == {"status": "ready"}
        metrics = await http.get("/metrics")
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = dict(
            line.rsplit(" ", 1) for line in metrics.text.splitlines() if not line.startswith("#")
        )
        assert samples['toren_runs{status="completed"}'] == "1"
        assert samples['toren_runs{status="failed"}'] == "0"
        assert int(samples["toren_steps_total"]) == 2
        assert int(samples['toren_tokens_total{kind="input"}']) > 0
        for name in (
            "toren_cost_usd_total",
            "toren_lease_recoveries_total",
            "toren_invalidations_total",
            "toren_worker_active_runs",
        ):
            assert name in samples
        plan = (await http.get("/v1/plan")).json()
        # Nothing in flight but the waiting/slow runs of other tests: a clean plan.
        assert plan["invalidated"] == 0 and plan["problems"] == 0
        assert plan["runs"] == len(plan["plans"])
        assert all(p["clean"] for p in plan["plans"])
        again = await api.client.plan()
        again.pop("elapsed_ms"), plan.pop("elapsed_ms")
        assert again == plan  # the client reads the same report


async def test_error_bodies(api: Api) -> None:
    async with api.http() as http:
        cases = [
            (await http.get("/v1/runs/run_000000000000000000"), 404, "run_not_found"),
            (await http.get("/v1/runs/%00bad"), 404, "run_not_found"),
            (await http.get("/v1/nowhere"), 404, "not_found"),
            (await http.delete("/v1/runs"), 405, "method_not_allowed"),
            (await http.post("/v1/runs", json={"agent": "ghost"}), 404, "agent_not_found"),
            (
                await http.post("/v1/runs", json={"agent": "echo", "process": "nope"}),
                404,
                "agent_not_found",
            ),
            (
                await http.post(
                    "/v1/runs", content=b"{not json", headers={"content-type": "application/json"}
                ),
                422,
                "invalid_request",
            ),
            (await http.post("/v1/runs", json={"input": 1}), 422, "invalid_request"),
            (await http.get("/v1/runs/x/events", params={"limit": 0}), 422, "invalid_request"),
        ]
        for response, status, code in cases:
            assert (response.status_code, error_of(response)["code"]) == (status, code), (
                response.text
            )

        bad_name = await http.post("/v1/runs", json={"agent": "../etc/passwd"})
        assert bad_name.status_code == 422
        message = error_of(bad_name)["message"]
        assert "agent" in message and "'../etc/passwd' is not a valid name" in message


async def test_body_limit(store: Store) -> None:
    app = create_app(store, registry(), tokens=[TOKEN], max_body_bytes=1000, console=False)
    async with (
        running_server(app) as server,
        httpx.AsyncClient(
            base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http,
    ):
        big = {"agent": "echo", "input": "x" * 2000}
        r = await http.post("/v1/runs", json=big)
        assert r.status_code == 413 and error_of(r)["code"] == "body_too_large"

        async def chunks() -> Any:
            data = json.dumps(big).encode()
            for i in range(0, len(data), 100):
                yield data[i : i + 100]

        chunked = await http.post(
            "/v1/runs", content=chunks(), headers={"content-type": "application/json"}
        )
        assert chunked.status_code == 413 and error_of(chunked)["code"] == "body_too_large"
        assert (await http.post("/v1/runs", json={"agent": "echo"})).status_code == 201
        assert (await store.list_runs()) and len(await store.list_runs()) == 1


class BrokenStore:
    """A store whose reads fail with an error quoting a secret and internals."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def list_runs(self, **kw: Any) -> Any:
        raise RuntimeError(f"connection to db failed, password={SECRET}")

    async def get_run(self, run_id: str) -> Any:
        raise toren.errors.StorageError(f"disk on fire near {SECRET}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_server_errors_are_generic(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(BrokenStore(store), registry(), tokens=[TOKEN])  # type: ignore[arg-type]
    async with (
        running_server(app) as server,
        httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": TOKEN}) as http,
    ):
        for path in ("/v1/runs", "/v1/runs/run_1"):
            r = await http.get(path)
            assert r.status_code == 500
            assert r.json() == {
                "error": {
                    "code": "internal_error",
                    "message": "the server failed to handle this request; see its logs",
                }
            }
        ready = await http.get("/v1/ready")
        assert ready.status_code == 503 and error_of(ready)["code"] == "not_ready"
        assert SECRET not in ready.text
    assert "Traceback" not in r.text


async def test_provider_keys_never_leave_the_server(api: Api) -> None:
    run = await api.client.start_run("leaky", {"note": "fine"})
    done = await api.client.wait(run.id, timeout=20)
    assert done.status == "failed"
    stored = await api.store.load_events(run.id)
    # The tool's error is redacted before it is recorded (its message and traceback)...
    assert not any(SECRET in e.payload_json() for e in stored)
    assert any("[redacted]" in e.payload_json() for e in stored)
    async with api.http() as http:
        for path in (
            f"/v1/runs/{run.id}",
            f"/v1/runs/{run.id}/events",
            f"/v1/runs/{run.id}/stream",
            "/v1/runs",
        ):
            text = (await http.get(path)).text
            assert SECRET not in text and "[redacted]" in text, path  # ...never in a response


async def test_concurrent_idempotent_starts_make_one_run(api: Api) -> None:
    async with api.http() as http:
        results = await asyncio.gather(
            *(
                http.post("/v1/runs", json={"agent": "echo", "idempotency_key": "same"})
                for _ in range(10)
            )
        )
    assert {r.json()["id"] for r in results} == {results[0].json()["id"]}
    assert sorted(r.status_code for r in results).count(201) == 1


def nested(depth: int) -> Any:
    """``depth`` levels of objects and arrays: {"a": [{"a": [...]}]}."""
    value: Any = "leaf"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


def depth_of(value: Any) -> int:
    depth = 0
    while isinstance(value, dict | list):
        value, depth = (value["a"] if isinstance(value, dict) else value[0]), depth + 1
    return depth


async def test_deeply_nested_json_is_refused_and_nothing_is_stored(api: Api) -> None:
    waiting = await api.client.start_run("approval", {})
    await toren.wait_for_run(api.store, waiting.id, until=("waiting",), timeout=20)
    before = [r.id for r in await api.store.list_runs(limit=200)]
    async with api.http() as http:
        ok = await http.post("/v1/runs", json={"agent": "approval", "input": nested(64)})
        assert ok.status_code == 201, ok.text  # the documented limit itself is accepted
        assert depth_of(ok.json()["input"]) == 64
        refused = [
            await http.post("/v1/runs", json={"agent": "approval", "input": nested(65)}),
            await http.post("/v1/runs", json={"agent": "approval", "input": nested(300)}),
            await http.post(
                f"/v1/runs/{waiting.id}/messages", json={"name": "other", "payload": nested(300)}
            ),
            # Deeper than Python's JSON parser goes: refused with the same limit named.
            await http.post(
                "/v1/runs",
                content=b'{"agent": "approval", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}",
                headers={"content-type": "application/json"},
            ),
        ]
        for r, what, depth in zip(
            refused,
            ["run input", "run input", "message payload", "run input"],
            [65, 300, 300, 5000],
            strict=True,
        ):
            assert r.status_code == 422 and error_of(r)["code"] == "invalid_request", r.text
            # The host API's and the CLI's words: the depth found, where, the limit.
            root = "payload" if what == "message payload" else "input"
            assert (
                f"{what} nests objects and arrays {depth} levels deep (level 65 at {root}"
                in error_of(r)["message"]
            ), r.text
            assert error_of(r)["message"].endswith("); expected at most 64 levels"), r.text
        assert error_of(refused[1])["message"].startswith("body.input: run input nests")
        assert error_of(refused[2])["message"].startswith("body.payload: message payload nests")
        listed = await http.get("/v1/runs", params={"limit": 200})
        assert listed.status_code == 200
    after = [r.id for r in await api.store.list_runs(limit=200)]
    assert after == [ok.json()["id"], *before]  # the refused runs were not stored
    assert await api.store.next_message(waiting.id, ["other"]) is None


async def _store_unchecked(store: Store, agent: str, input: Any) -> RunRecord:
    """A run stored without the entry points' checks, through the store's own method
    (the entry points refuse such an input; an agent's output can be as deep)."""
    now = time.time()
    run_id = new_run_id(now)
    started = make_event(
        run_id,
        RunStarted(agent=agent, process="main", input=input),
        slot="run:start",
        created_at=now,
    )
    run, _ = await store.create_run(NewRun(run_id, agent, "main", input, None, now, started))
    return run


async def test_a_stored_deep_value_never_breaks_reading_runs(api: Api) -> None:
    deep = await _store_unchecked(api.store, "approval", {"deep": nested(400)})
    await toren.wait_for_run(api.store, deep.id, until=("waiting",), timeout=20)
    async with api.http() as http:
        for path in ("/v1/runs", f"/v1/runs/{deep.id}", f"/v1/runs/{deep.id}/events"):
            r = await http.get(path)
            assert r.status_code == 200, (path, r.text[:300])
        run = (await http.get(f"/v1/runs/{deep.id}")).json()
        # The run is readable; what lies past the redactor's bound comes back as a marker.
        cut = run["input"]["deep"]
        for _ in range(126):
            cut = cut["a"] if isinstance(cut, dict) else cut[0]
        assert cut == "[nested deeper than 128 levels]"
        started = (await http.get(f"/v1/runs/{deep.id}/events")).json()["events"][0]
        assert started["type"] == "RunStarted" and "[nested deeper than" in json.dumps(started)
        await api.client.cancel(deep.id)
        async with http.stream("GET", f"/v1/runs/{deep.id}/stream") as stream:
            messages = await read_sse(stream, until=lambda m: m.get("event") == "end")
        assert messages[-1]["event"] == "end"
        assert messages[-1]["data"]["run"]["status"] == "cancelled"


async def test_agent_errors_and_error_bodies_are_redacted(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = "plain-value-0123456789"  # not key-shaped: only the environment names it
    monkeypatch.setenv("ACME_API_KEY", plain)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "agent.yaml").write_text("name: broken\nmodel: scripted:echo\ninstructions: hi\n")
    (broken / "tools.py").write_text(
        f"import os\nraise RuntimeError('refused ' + os.environ['ACME_API_KEY'] + ' {SECRET}')\n"
    )
    app = create_app(store, DirectoryResolver(tmp_path), tokens=[TOKEN], console=False)
    async with (
        running_server(app) as server,
        httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": TOKEN}) as http,
    ):
        agents = await http.get("/v1/agents")
        assert agents.status_code == 200
        (info,) = agents.json()["agents"]
        assert info["name"] == "broken" and "RuntimeError: refused [redacted]" in info["error"]
        responses = [
            agents,
            await http.post("/v1/runs", json={"agent": "broken"}),  # 400 agent_config_invalid
            await http.post("/v1/runs", json={"agent": SECRET}),  # 404 quoting the name
            await http.post("/v1/runs", json={"agent": f"{plain} {SECRET}"}),  # 422 details
        ]
        assert [r.status_code for r in responses] == [200, 400, 404, 422]
        for r in responses:
            assert SECRET not in r.text and plain not in r.text, r.text
            assert "[redacted]" in r.text, r.text


async def test_agent_errors_name_paths_relative_to_the_agents_root(
    store: Store, tmp_path: Path
) -> None:
    """A client never learns where the server keeps its agents: an agent whose tools.py
    fails to import, or a name no agent has, is described with paths relative to the
    agents root (``broken/tools.py:2``), on ``GET /v1/agents`` and ``POST /v1/runs``."""
    root = tmp_path / "srv-secret-layout" / "agents"
    broken = root / "broken"
    broken.mkdir(parents=True)
    (broken / "agent.yaml").write_text("name: broken\nmodel: scripted:echo\ninstructions: hi\n")
    (broken / "tools.py").write_text(
        f"x = '{store.url[:6]}'\nraise RuntimeError('tools refused to load')\n"
    )
    app = create_app(store, DirectoryResolver(root), tokens=[TOKEN], console=False)
    async with (
        running_server(app) as server,
        httpx.AsyncClient(base_url=server.url, headers={"X-API-Key": TOKEN}) as http,
    ):
        agents = await http.get("/v1/agents")
        (info,) = agents.json()["agents"]
        assert info["error"].startswith("broken/tools.py:2: importing tools.py"), info
        start = await http.post("/v1/runs", json={"agent": "broken"})
        assert start.status_code == 400
        assert start.json()["error"]["message"].startswith("broken/tools.py:2:"), start.text
        unknown = await http.post("/v1/runs", json={"agent": "nobody"})
        assert unknown.status_code == 404 and "(looked in .)" in unknown.text, unknown.text
        for r in (agents, start, unknown):
            assert str(tmp_path) not in r.text and "srv-secret-layout" not in r.text, r.text


async def test_bodies_that_are_not_json_objects_say_what_is_expected(api: Api) -> None:
    body = json.dumps({"agent": "echo", "input": {"n": 1}}).encode()
    before = await api.store.list_runs(limit=200)
    async with api.http() as http:

        async def post(content: bytes, content_type: str | None) -> dict[str, Any]:
            headers = {"content-type": content_type} if content_type else {}
            r = await http.post("/v1/runs", content=content, headers=headers)
            return {"status": r.status_code, **error_of(r)}

        wrong_type = await post(body, "text/plain")
        assert wrong_type["status"] == 415 and wrong_type["code"] == "unsupported_media_type"
        assert wrong_type["message"] == "expected Content-Type application/json; got 'text/plain'"
        no_type = await post(body, None)
        assert no_type["status"] == 415
        assert no_type["message"] == "expected Content-Type application/json; the request has none"
        truncated = await post(body[:-2], "application/json")
        assert (truncated["status"], truncated["code"]) == (422, "invalid_request")
        assert truncated["message"] == (
            f"body is not valid JSON: Expecting ',' delimiter at position {len(body) - 2}"
        )
        empty = await post(b"", "application/json")
        assert empty["message"] == "the request body is empty; expected a JSON object"
        array = await post(b"[1, 2]", "application/json")
        assert array["message"] == "the request body is an array; expected a JSON object"
        not_utf8 = await post(b'{"agent": "echo", "input": "\xff"}', "application/json")
        assert not_utf8["status"] == 422 and "not valid UTF-8" in not_utf8["message"]
        message = await http.post(
            "/v1/runs/run_0190c2a5e1f3a1b2c3d4e5/messages",
            content=b'{"name": "approve"}',
            headers={"content-type": "text/plain"},
        )
        assert message.status_code == 415 and "application/json" in error_of(message)["message"]
        charset = await http.post(
            "/v1/runs", content=body, headers={"content-type": "application/json; charset=utf-8"}
        )
        assert charset.status_code == 201, charset.text
    assert len(await api.store.list_runs(limit=200)) == len(before) + 1


async def test_a_garbage_cursor_is_refused(api: Api) -> None:
    ids = [(await api.client.start_run("approval", {"i": i})).id for i in range(2)]
    async with api.http() as http:
        for cursor in ("zzz", "run_", "run_zzz", ids[0].upper(), ids[0] + "0"):
            r = await http.get("/v1/runs", params={"cursor": cursor})
            assert r.status_code == 422, (cursor, r.text)
            error = error_of(r)
            assert error["code"] == "invalid_request"
            assert error["message"].startswith(f"query.cursor: {cursor!r} is not a cursor; use ")
            assert "next_cursor" in error["message"] and "'run_' and 22" in error["message"]
        page = await http.get("/v1/runs", params={"cursor": ids[1]})
        assert page.status_code == 200 and ids[0] in [r["id"] for r in page.json()["runs"]]


async def test_event_objects_carry_the_whole_envelope(api: Api) -> None:
    """Every column of docs/event-log.md's envelope, slot included, on every surface."""
    run = await api.client.start_run("slow", {"n": 2})
    await api.client.wait(run.id, timeout=20)
    stored = await api.store.load_events(run.id)
    envelope = {
        "seq",
        "run_id",
        "type",
        "stream",
        "position",
        "generation",
        "slot",
        "digest",
        "code_version",
        "worker_id",
        "created_at",
        "format_version",
        "chain",  # since 0.2 (docs/digest.md §7)
        "payload",
    }
    async with api.http() as http:
        body = (await http.get(f"/v1/runs/{run.id}/events")).json()
    assert all(set(e) == envelope for e in body["events"])
    assert [e["chain"] for e in body["events"]] == [e.chain for e in stored]
    assert all(e.chain for e in stored)
    assert [e["slot"] for e in body["events"]] == [e.slot for e in stored]
    assert body["events"][0]["slot"] == "run:start" and body["events"][1]["slot"] == "main#0:0"
    page = await api.client.events(run.id)
    assert [e.slot for e in page.events] == [e.slot for e in stored]


async def test_verify_and_invalidations_endpoints(api: Api) -> None:
    run = await api.client.start_run("slow", {"n": 3})
    await api.client.wait(run.id, timeout=20)
    async with api.http() as http:
        report = (await http.get(f"/v1/runs/{run.id}/verify")).json()
        assert report["ok"] and report["steps"] == report["verified"] == 3
        assert [c["verdict"] for c in report["checks"]] == ["verified"] * 3
        # What else is covered (docs/digest.md §6, §7): every event links, and the
        # model calls' responses re-derive.
        events = await api.store.load_events(run.id)
        assert report["chain"]["linked"] == len(events) and report["chain"]["breaks"] == []
        assert report["chain"]["head"] == events[-1].chain
        covered = [c["response"] for c in report["checks"]]
        assert set(covered) <= {"verified", "none"} and "verified" in covered
        assert report["responses"]["verified"] == covered.count("verified")
        assert (await http.get(f"/v1/runs/{run.id}/invalidations")).json() == {"invalidations": []}
        assert (await api.client.verify(run.id))["checks"] == report["checks"]
        assert await api.client.invalidations(run.id) == []
        missing = await http.get("/v1/runs/run_missing/verify")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "run_not_found"
