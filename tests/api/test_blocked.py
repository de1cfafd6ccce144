"""The HTTP API of runs that do not move (SQLite and PostgreSQL): a blocked run's
``blocked`` (error, attempts, next try) and ``lease``; a keyless agent refused before a
run is created where the runs execute in-process; a removed agent's run cancelled within
one poll; ``search`` over inputs."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import toren
from toren.agents import DirectoryResolver
from toren.agents.readiness import missing_key_message
from toren.api import create_app, running_server
from toren.client import AsyncTorenClient
from toren.config import BlockedRetry
from toren.errors import ProviderUnavailable
from toren.providers.base import ModelRequest, ModelResponse, Usage
from toren.store import Store

TOKEN = "blocked-test-token-0123456789"


class Keyless:
    def __init__(self) -> None:
        self.has_key = False

    async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
        if not self.has_key:
            raise ProviderUnavailable(missing_key_message("openai", "openai"))
        return ModelResponse(text="ok", usage=Usage(1, 1))


async def _model(ctx: toren.Context, input: Any) -> Any:
    return (await ctx.model("keyless:m", [{"role": "user", "content": str(input)}])).text


@contextlib.asynccontextmanager
async def serve(store: Store, agents: Any, provider: Keyless) -> AsyncIterator[httpx.AsyncClient]:
    deps = toren.TickDeps(
        store=store,
        agents=agents,
        providers={"keyless": provider},
        settings=toren.Settings(
            poll_interval=0.05, blocked_retry=BlockedRetry(first=0.2, maximum=0.5)
        ),
    )
    runtime = toren.LocalWorkerRuntime(deps)
    await runtime.start()
    try:
        app = create_app(
            store, agents, tokens=(TOKEN,), runtime=runtime, console=False, search_interval=0.05
        )
        async with (
            running_server(app) as server,
            httpx.AsyncClient(
                base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
            ) as http,
        ):
            yield http
    finally:
        await runtime.stop(drain_window=0.5)


async def _poll(http: httpx.AsyncClient, run_id: str, check: Any, timeout: float = 20) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        run = (await http.get(f"/v1/runs/{run_id}")).json()
        if check(run):
            return run
        assert time.monotonic() < deadline, run
        await asyncio.sleep(0.05)


async def test_a_blocked_run_through_the_api(store: Store) -> None:
    reg = toren.Registry()
    reg.add("keyless", _model)
    provider = Keyless()
    async with serve(store, reg, provider) as http:
        started = await http.post("/v1/runs", json={"agent": "keyless", "input": "find me"})
        assert started.status_code == 201, started.text
        run_id = started.json()["id"]
        run = await _poll(http, run_id, lambda r: (r["blocked"] or {}).get("attempts", 0) >= 2)
        assert run["status"] == "running" and run["error"] is None
        blocked = run["blocked"]
        assert blocked["error"]["code"] == "provider_unavailable"
        assert blocked["error"]["message"].startswith(
            "no OpenAI API key — set OPENAI_API_KEY or `api_key_env`"
        )
        assert blocked["retry_at"] == run["not_before"] and blocked["since"] <= run["updated_at"]
        assert run["lease_recoveries"] == 0  # not a "dead worker"
        async with AsyncTorenClient(str(http.base_url), TOKEN) as client:
            seen = await client.get_run(run_id)
        assert seen.blocked is not None and seen.blocked["attempts"] >= 2
        deadline = time.monotonic() + 20  # the search indexer runs in the background
        while not (
            listed := (await http.get("/v1/runs", params={"search": "FIND"})).json()["runs"]
        ):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        assert [r["id"] for r in listed] == [run_id] and listed[0]["blocked"] is not None
        assert (await http.get("/v1/runs", params={"search": "100%"})).json()["runs"] == []

        provider.has_key = True
        done = await _poll(http, run_id, lambda r: r["status"] == "completed")
        assert done["output"] == "ok" and done["blocked"] is None and done["lease"] is None


async def test_a_removed_agents_run_is_cancelled_within_one_poll(store: Store) -> None:
    deployed = toren.Registry()
    deployed.add("gone", _model)
    run = await toren.start_run(store, deployed, "gone", "x")
    async with serve(store, toren.Registry(), Keyless()) as http:
        blocked = await _poll(
            http, run.id, lambda r: r["blocked"] is not None and r["lease"] is None
        )
        assert blocked["status"] == "queued"
        assert blocked["blocked"]["error"]["code"] == "agent_not_found"
        asked = await http.post(f"/v1/runs/{run.id}/cancel")
        assert asked.status_code == 202
        # One poll of the worker (0.05 s here), with room for a loaded machine.
        done = await _poll(http, run.id, lambda r: r["status"] == "cancelled", timeout=5)
        assert done["blocked"] is None


async def test_a_keyless_agent_is_refused_before_a_run_is_created(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    (tmp_path / "keyless").mkdir()
    (tmp_path / "keyless" / "agent.yaml").write_text("name: keyless\nmodel: openai:gpt-4o-mini\n")
    resolver = DirectoryResolver(tmp_path)
    async with serve(store, resolver, Keyless()) as http:
        refused = await http.post("/v1/runs", json={"agent": "keyless", "input": "hi"})
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert error["code"] == "provider_key_missing"
        assert "set OPENAI_API_KEY or `api_key_env`" in error["message"]
        assert (await http.get("/v1/runs")).json()["runs"] == []
    await resolver.aclose()
