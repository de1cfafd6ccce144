"""Nothing sits silently stuck: a run whose tick fails on an infrastructure error is
given back *blocked* (the error, the failed ticks in a row, the next try), retried with
a capped exponential backoff, and goes on once the cause is gone; a run of an agent no
worker has deployed can be cancelled at once and is not re-claimed in a hot loop."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.providers.fakes import (
    FAKE_KEY,
    Completion,
    FakeModelServer,
    FakeToolCall,
    serve_fake_models,
)
from toren.agents import DirectoryResolver
from toren.config import BlockedRetry, Settings
from toren.errors import MissingProviderKey
from toren.runtime import build_deps
from toren.store import Store

KEY_VAR = "TOREN_TEST_BLOCKED_KEY"
WINDOW = 60.0  # seconds of (manual) time over which the attempts are counted


@pytest.fixture
def fake() -> Iterator[FakeModelServer]:
    with serve_fake_models() as server:
        yield server


def _agent(tmp_path: Path, fake: FakeModelServer) -> Path:
    root = tmp_path / "asker"
    root.mkdir()
    (root / "agent.yaml").write_text(
        "name: asker\n"
        "model: openai:gpt-4o-mini\n"
        "instructions: Ask the human, then answer.\n"
        "tools: [ask_human]\n"
        "providers:\n"
        f"  openai: {{api_key_env: {KEY_VAR}, base_url: '{fake.openai_url}'}}\n"
    )
    return root


def _deps(store: Store, root: Path, clock: toren.ManualClock) -> toren.TickDeps:
    settings = Settings(blocked_retry=BlockedRetry(first=1.0, maximum=300.0))
    deps = build_deps(store, DirectoryResolver(root), settings)
    return dataclasses.replace(deps, clock=clock)


async def test_a_key_removed_after_the_run_started_blocks_it_with_backoff_until_it_is_back(
    store: Store, tmp_path: Path, fake: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_VAR, FAKE_KEY)
    root = _agent(tmp_path, fake)
    clock = toren.ManualClock(1_900_000_000.0)
    deps = _deps(store, root, clock)
    fake.openai.script(
        Completion(tool_calls=(FakeToolCall("c1", "ask_human", {"question": "Which city?"}),)),
        Completion(text="Paris it is."),
    )
    run = await toren.start_run(store, deps.agents, "asker", "Plan my trip", clock=clock)
    assert (await toren.tick(run.id, deps)).status == "waiting"
    assert fake.openai.served == 1

    # The key goes away (a worker redeployed without the secret); the answer arrives.
    monkeypatch.delenv(KEY_VAR)
    await deps.agents.aclose()  # type: ignore[attr-defined]
    deps = _deps(store, root, clock)  # the new worker's
    await toren.send_message(store, run.id, "human", "Paris", clock=clock)

    attempts: list[float] = []
    start = clock.now()
    while clock.now() - start < WINDOW:
        result = await toren.tick(run.id, deps)
        if result.status != "not_claimed":
            assert result.status == "error" and result.error is not None
            attempts.append(clock.now() - start)
        await clock.advance(0.5)
    # 1, 2, 4, 8, 16, 32 s apart: six tries in a minute, not a hot loop.
    assert attempts == [0.0, 1.0, 3.0, 7.0, 15.0, 31.0]
    assert fake.openai.served == 1  # no request went out without a key

    row = await store.get_run(run.id)
    assert row is not None and row.status == "running" and row.lease_owner is None
    shown = row.to_dict()["blocked"]
    assert shown is not None and shown["attempts"] == 6
    assert shown["error"]["code"] == "provider_unavailable"
    assert f"{KEY_VAR} named by providers.openai.api_key_env" in shown["error"]["message"]
    assert shown["since"] == start and shown["retry_at"] == start + 31.0 + 32.0

    # The key is back: the next try completes the run, and it is no longer blocked.
    monkeypatch.setenv(KEY_VAR, FAKE_KEY)
    await clock.advance(shown["retry_at"] - clock.now())
    done = await toren.tick(run.id, deps)
    assert done.status == "completed" and done.output["answer"] == "Paris it is."
    assert fake.openai.served == 2
    await deps.agents.aclose()  # type: ignore[attr-defined]
    final = await store.get_run(run.id)
    assert final is not None and final.blocked_error is None and final.blocked_attempts == 0
    assert final.to_dict()["blocked"] is None


def test_the_backoff_doubles_up_to_its_cap() -> None:
    retry = BlockedRetry(first=1.0, maximum=300.0)
    assert [retry.delay(n) for n in range(1, 12)] == [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 300.0, 300.0,
    ]  # fmt: skip
    assert retry.delay(10_000) == 300.0


async def test_a_provider_without_a_key_is_refused_before_a_run_is_created(
    store: Store, tmp_path: Path, fake: FakeModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(KEY_VAR, raising=False)
    root = _agent(tmp_path, fake)
    resolver = DirectoryResolver(root)
    with pytest.raises(MissingProviderKey) as info:
        resolver.check_ready("asker")
    assert f"{KEY_VAR} named by providers.openai.api_key_env" in info.value.message
    assert await store.list_runs() == []
    # The SDK's own variable, when agent.yaml names none; a base URL needs no key.
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "agent.yaml").write_text("name: plain\nmodel: openai:gpt-4o-mini\n")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(MissingProviderKey, match="set OPENAI_API_KEY or `api_key_env`"):
        DirectoryResolver(plain).check_ready("plain")
    monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_url)
    DirectoryResolver(plain).check_ready("plain")


# -- a deploy that removes an agent -------------------------------------------------------


async def _chain(ctx: toren.Context, input: Any) -> Any:
    return "done"


async def test_a_run_of_an_agent_no_longer_deployed_is_cancelled_within_one_poll(
    store: Store,
) -> None:
    deployed = toren.Registry()
    deployed.add("gone", _chain)
    run = await toren.start_run(store, deployed, "gone")
    settings = Settings(poll_interval=0.05)
    deps = toren.TickDeps(store=store, agents=toren.Registry(), settings=settings)
    async with toren.LocalWorkerRuntime(deps) as worker:
        await _until(lambda: _blocked(store, run.id), "the run to be blocked")
        await store.request_cancel(run.id, now=time.time())
        deadline = time.monotonic() + 10 * settings.poll_interval + 5.0
        while True:
            row = await store.get_run(run.id)
            assert row is not None
            if row.status == "cancelled":
                break
            assert time.monotonic() < deadline, f"still {row.status}"
            await asyncio.sleep(0.01)
        assert worker.results[run.id].status == "cancelled"
    events = [e.type for e in await store.load_events(run.id)]
    assert events == ["RunStarted", "RunCancelled"]
    assert row.to_dict()["blocked"] is None


async def test_a_worker_claims_a_run_it_cannot_load_a_handful_of_times_a_minute(
    store: Store,
) -> None:
    deployed = toren.Registry()
    deployed.add("gone", _chain)
    run = await toren.start_run(store, deployed, "gone")
    clock = toren.ManualClock(time.time())
    settings = Settings(poll_interval=0.01)
    deps = toren.TickDeps(store=store, agents=toren.Registry(), settings=settings, clock=clock)
    async with toren.LocalWorkerRuntime(deps):
        start = clock.now()
        while clock.now() - start < WINDOW:
            # Let the worker poll many times at each simulated second.
            for _ in range(5):
                await asyncio.sleep(0.02)
            await clock.advance(1.0)
        row = await store.get_run(run.id)
    assert row is not None and row.status == "queued"
    # Every claim bumps the lease epoch: 1 + 2 + 4 + 8 + 16 + 32 s apart.
    assert row.lease_epoch <= 7, row.lease_epoch
    assert row.lease_epoch >= 5, row.lease_epoch
    assert row.blocked_error is not None and row.blocked_error["code"] == "agent_not_found"


async def _blocked(store: Store, run_id: str) -> bool:
    row = await store.get_run(run_id)
    return row is not None and row.blocked_error is not None


async def _until(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)
