"""Provider rate limits (toren.core.contract.ratelimit): the slot arithmetic, the store's
slots on both databases (reservations, correction, 429 blocks and probes, a changed or
removed limit), and a tick that parks durably for its slot without writing an event."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

import toren
from toren.agents.config import AgentConfig
from toren.config import LeaseSettings, RateLimit, Settings, rate_limits
from toren.core.contract.model_types import ModelRequest
from toren.core.contract.ratelimit import (
    DEFAULT_OUTPUT_ESTIMATE,
    estimate_tokens,
    next_slot,
    reason,
    throttle_backoff,
)
from toren.errors import InvalidInput
from toren.providers.base import ModelResponse, Usage, frozen
from toren.store import Store

KEY = "fake:m"


def test_the_next_slot_keeps_every_window_within_the_limit() -> None:
    limit = RateLimit(rpm=3, period=10)
    assert next_slot(limit, [], 1, 100.0) == 100.0
    assert next_slot(limit, [(95.0, 1), (96.0, 1)], 1, 100.0) == 100.0
    # full: the oldest must leave the window first
    assert next_slot(limit, [(95.0, 1), (96.0, 1), (99.0, 1)], 1, 100.0) == 105.0
    # never before a slot already taken (first come, first served)
    assert next_slot(limit, [(120.0, 1)], 1, 100.0) == 120.0
    tokens = RateLimit(tpm=100, period=10)
    assert next_slot(tokens, [(95.0, 60)], 40, 100.0) == 100.0
    assert next_slot(tokens, [(95.0, 60), (97.0, 30)], 40, 100.0) == 105.0
    assert next_slot(tokens, [(95.0, 60), (97.0, 30)], 80, 100.0) == 107.0
    # a call estimated above the whole limit waits for an empty window, not forever
    assert next_slot(tokens, [(95.0, 60)], 10_000, 100.0) == 105.0


def test_backoff_reason_and_estimate() -> None:
    assert [throttle_backoff(n, None) for n in (1, 2, 3, 8)] == [1.0, 2.0, 4.0, 60.0]
    assert throttle_backoff(1, 7.5) == 7.5
    assert reason(KEY, 103.2, 100.0) == "waiting: rate limit fake:m, next slot in 4 s"
    message = {"role": "user", "content": "x" * 400}
    request = frozen(
        ModelRequest, provider="fake", model="m", messages=(message,), tools=(), params={}
    )
    assert estimate_tokens(request) == -(-len(repr(message)) // 4) + DEFAULT_OUTPUT_ESTIMATE
    capped = frozen(
        ModelRequest,
        provider="fake",
        model="m",
        messages=(message,),
        tools=(),
        params={"max_tokens": 50},
    )
    assert estimate_tokens(capped) == -(-len(repr(message)) // 4) + 50


def test_limits_are_checked_where_they_are_declared() -> None:
    found = rate_limits({"openai:gpt-4o-mini": {"rpm": 500, "tpm": 30000, "period": "1m"}}, "x")
    assert found == {"openai:gpt-4o-mini": RateLimit(rpm=500, tpm=30000, period=60.0)}
    env = Settings.from_env({"TOREN_RATE_LIMITS": '{"a:b": {"rpm": 5}}'})
    assert env.rate_limits == {"a:b": RateLimit(rpm=5)}
    for bad, match in (
        ({"gpt-4o": {"rpm": 1}}, "is not a provider and model"),
        ({"a:b": {"rpm": 0}}, "rpm must be a whole number"),
        ({"a:b": {"rpm": 1, "burst": 2}}, "takes rpm, tpm and period"),
        ({"a:b": {"period": "soon"}}, "bad duration"),
    ):
        with pytest.raises(InvalidInput, match=match):
            rate_limits(bad, "x")
    with pytest.raises(InvalidInput, match="not JSON"):
        Settings.from_env({"TOREN_RATE_LIMITS": "{rpm"})
    config = AgentConfig.model_validate(
        {"name": "a", "rate_limits": {"openai:gpt-4o-mini": {"rpm": 500, "period": "30s"}}}
    )
    assert config.rate_limits["openai:gpt-4o-mini"].value() == RateLimit(rpm=500, period=30.0)
    with pytest.raises(ValueError, match="is not a provider and model"):
        AgentConfig.model_validate({"name": "a", "rate_limits": {"gpt": {"rpm": 1}}})
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        AgentConfig.model_validate({"name": "a", "rate_limits": {"a:b": {"tpm": 0}}})


async def test_slots_are_shared_reserved_and_corrected(store: Store) -> None:
    limit = RateLimit(rpm=2, tpm=100, period=1000)
    now = time.time()
    first = await store.take_rate_slot(KEY, limit, owner="r1/:0", tokens=40, now=now)
    second = await store.take_rate_slot(KEY, limit, owner="r2/:0", tokens=40, now=now)
    assert first.go and second.go
    third = await store.take_rate_slot(KEY, limit, owner="r3/:0", tokens=40, now=now)
    assert not third.go and third.at >= now + 1000  # reserved: when the first leaves
    # asked again, the same call holds the same reservation (no second slot)
    again = await store.take_rate_slot(KEY, limit, owner="r3/:0", tokens=40, now=now + 1)
    assert (again.id, again.at, again.go) == (third.id, third.at, False)
    # corrected: the first used 5 tokens, not 40; a small call now fits the tokens but
    # not the calls (2 per window, both in it)
    assert first.id is not None
    await store.settle_rate_slot(KEY, first.id, tokens=5, ok=True, now=now)
    fourth = await store.take_rate_slot(KEY, limit, owner="r4/:0", tokens=10, now=now)
    assert not fourth.go and fourth.at >= third.at  # in line behind the third


async def test_a_429_blocks_the_key_then_one_probe_goes(store: Store) -> None:
    limit = RateLimit(rpm=100, period=60)
    now = time.time()
    a = await store.take_rate_slot(KEY, limit, owner="a/:0", tokens=1, now=now)
    b = await store.take_rate_slot(KEY, limit, owner="b/:0", tokens=1, now=now)
    until = await store.throttle_rate(KEY, a.id, retry_after=None, now=now)
    assert until >= now + 1.0  # the first strike: 1 s
    # the second 429, of a call sent before the block began, adds no strike
    assert await store.throttle_rate(KEY, b.id, retry_after=None, now=now) == until
    held = await store.take_rate_slot(KEY, limit, owner="c/:0", tokens=1, now=now)
    assert held.id is None and not held.go and held.at == until
    # after the block, one call goes (the probe) and holds the key for its answer
    later = until + 0.01
    probe = await store.take_rate_slot(KEY, limit, owner="c/:0", tokens=1, now=later)
    assert probe.go
    other = await store.take_rate_slot(KEY, limit, owner="d/:0", tokens=1, now=later)
    assert not other.go and other.id is None
    # the probe is refused too: the wait doubles
    assert probe.id is not None
    second = await store.throttle_rate(KEY, probe.id, retry_after=None, now=later)
    assert second >= later + 2.0
    probe2 = await store.take_rate_slot(KEY, limit, owner="d/:0", tokens=1, now=second + 0.01)
    assert probe2.go and probe2.id is not None
    # served: the key is open again for everyone
    await store.settle_rate_slot(KEY, probe2.id, tokens=1, ok=True, now=second + 0.02)
    free = await store.take_rate_slot(KEY, limit, owner="e/:0", tokens=1, now=second + 0.03)
    assert free.go


# -- a tick ------------------------------------------------------------------------------


class Counting:
    """A provider that answers every call and counts them."""

    name = "fake"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
        self.calls += 1
        return ModelResponse(text="ok", usage=Usage(3, 2))

    async def aclose(self) -> None:
        return None


async def ask(ctx: toren.Context, input: Any) -> Any:
    return (await ctx.model(KEY, [{"role": "user", "content": "hi"}], max_tokens=5)).text


def _deps(store: Store, provider: Counting, limit: RateLimit | None) -> toren.TickDeps:
    reg = toren.Registry()
    reg.add("ask", ask)
    settings = toren.Settings(
        lease=LeaseSettings(ttl=2.0, heartbeat=0.1),
        poll_interval=0.05,
        rate_limits={KEY: limit} if limit else {},
    )
    return toren.TickDeps(store=store, agents=reg, settings=settings, providers={"fake": provider})


async def _until(check: Any, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + 30  # a bound against a hang
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, what
        await asyncio.sleep(0.05)


async def test_a_call_over_the_limit_parks_without_an_event_and_a_new_limit_releases_it(
    store: Store,
) -> None:
    provider = Counting()
    tight = RateLimit(rpm=1, period=3600)
    reg = _deps(store, provider, tight).agents
    ids = [(await toren.start_run(store, reg, "ask", {"n": n})).id for n in range(2)]

    async def statuses() -> list[str]:
        return sorted([(await store.get_run(i)).status for i in ids])  # type: ignore[union-attr]

    async with toren.LocalWorkerRuntime(_deps(store, provider, tight), concurrency=10):
        await _until(lambda: _is(statuses(), ["completed", "waiting"]), "one paced run")
    assert provider.calls == 1
    paced = [r for i in ids if (r := await store.get_run(i)) and r.status == "waiting"][0]
    assert paced.paced == KEY and paced.waiting_for == []
    assert paced.not_before is not None and paced.not_before > time.time() + 3000
    assert reason(KEY, paced.not_before, time.time()).startswith(
        "waiting: rate limit fake:m, next slot in 3"
    )
    # No event records the pacing: the log is the one of a run that has not begun.
    assert [e.type for e in await store.load_events(paced.id)] == ["RunStarted"]
    # Why it waits, over HTTP; and the fleet's counts in /metrics.
    from toren.api.app import create_app

    token = "rate-limit-test-token-0123"
    app = create_app(store, reg, tokens=[token])
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://t", headers=headers) as http:
        shown = (await http.get(f"/v1/runs/{paced.id}")).json()
        metrics = (await http.get("/metrics")).text
    assert shown["status"] == "waiting" and shown["rate_limit"]["key"] == KEY
    assert shown["rate_limit"]["reason"].startswith("waiting: rate limit fake:m, next slot in")
    assert 'toren_rate_limit_calls_total{model="fake:m"} 2' in metrics
    assert 'toren_rate_limit_parked_runs{model="fake:m"} 1' in metrics
    assert 'toren_rate_limit_429s_total{model="fake:m"} 0' in metrics
    # A worker with a looser limit (a deploy): the parked run takes a slot under it.
    async with toren.LocalWorkerRuntime(
        _deps(store, provider, RateLimit(rpm=5, period=3600)), concurrency=10
    ):
        await _until(lambda: _is(statuses(), ["completed", "completed"]), "released")
    assert provider.calls == 2
    done = await store.get_run(paced.id)
    assert done is not None and done.paced is None
    assert [e.type for e in await store.load_events(paced.id)] == [
        "RunStarted",
        "ModelCallRecorded",
        "RunCompleted",
    ]


async def test_removing_the_limit_releases_the_parked_runs(store: Store) -> None:
    provider = Counting()
    reg = _deps(store, provider, None).agents
    ids = [(await toren.start_run(store, reg, "ask", {"n": n})).id for n in range(3)]

    async def done() -> int:
        return [(await store.get_run(i)).status for i in ids].count("completed")  # type: ignore[union-attr]

    async with toren.LocalWorkerRuntime(
        _deps(store, provider, RateLimit(rpm=1, period=3600)), concurrency=10
    ):
        await _until(lambda: _eq(done(), 1), "one run")
    async with toren.LocalWorkerRuntime(_deps(store, provider, None), concurrency=10):
        await _until(lambda: _eq(done(), 3), "every run, once the limit is gone")
    assert provider.calls == 3


async def _is(got: Any, expected: list[str]) -> bool:
    return await got == expected


async def _eq(got: Any, expected: int) -> bool:
    return await got == expected
