"""Provider rate limits across a fleet (issue 37): PostgreSQL with three worker processes,
SQLite with one, against a loopback OpenAI server that enforces its own limits in a
sliding window and answers 429 above them (tests.providers.fakes.ProviderLimit).

- With Toren's limit just under the provider's, the provider sees 0 requests over its
  limit, and every run completes; with no limit, the provider's 429s are the baseline.
- A 429 storm: the provider answers 429 to everything for a while; the requests sent
  during it are bounded by the documented backoff (the calls in flight when it began,
  plus one probe per backoff step), not by the number of runs.

The window is 2 s (RateLimit.period, a documented parameter) to keep the suite short;
bench/rate_limits.py runs the issue's 60 s figures. Nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
import math
import signal
import subprocess
import time

import toren
from tests.core.ratelimit_worker import spawn
from tests.providers.fakes import ProviderLimit, serve_fake_models
from toren.core.contract.ratelimit import BACKOFF_FIRST

RUNS = 100
KEY = "openai:gpt-4o-mini"
PERIOD = 2.0
CONCURRENCY = 16


def _worker(url: str, openai_url: str, limits: dict[str, object]) -> subprocess.Popen[str]:
    return spawn(url, openai_url, limits, CONCURRENCY)


def _end(process: subprocess.Popen[str]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    assert process.stdout is not None
    process.stdout.close()


async def _fleet(url: str, openai_url: str, limits: dict[str, object], size: int) -> dict[str, str]:
    from tests.core.ratelimit_worker import registry

    store = await toren.connect(url)  # one connection, polled gently: the loopback
    try:  # provider shares this process
        reg = registry()
        workers = [_worker(url, openai_url, limits) for _ in range(size)]  # all from the start
        try:
            ids = [(await toren.start_run(store, reg, "ask", {"i": i})).id for i in range(RUNS)]
            deadline = time.monotonic() + 600  # a hang fails the test instead of the suite
            while True:
                statuses = {i: (await store.get_run(i)).status for i in ids}  # type: ignore[union-attr]
                if all(s in ("completed", "failed", "cancelled") for s in statuses.values()):
                    return statuses
                assert time.monotonic() < deadline, sorted(statuses.values())
                await asyncio.sleep(1.0)
        finally:
            for w in workers:
                _end(w)
    finally:
        await store.close()


def fleet(
    url: str, provider: ProviderLimit, limits: dict[str, object], *, storm: float = 0.0
) -> dict[str, str]:
    """Run RUNS runs of `ask` through the fleet until every one has finished; their
    statuses. ``storm``: the provider answers 429 to everything for that long from the
    first request on."""
    size = 3 if url.startswith("postgres") else 1
    with serve_fake_models() as fake:
        fake.openai.responder = provider
        if storm:
            provider.storm(storm)
        return asyncio.run(_fleet(url, fake.openai_url, limits, size))


def test_a_limit_just_under_the_providers_sends_nothing_over_it(db_url: str) -> None:
    # The provider: 30 calls and 480 tokens per window (a call is 16 tokens: the prompt's
    # 11, 5 out). Toren: 24 calls and 350 tokens (21 calls): the tokens bind first.
    provider = ProviderLimit(rpm=30, tpm=480, period=PERIOD)
    limits = {KEY: {"rpm": 24, "tpm": 350, "period": PERIOD}}
    statuses = fleet(db_url, provider, limits)
    print(
        f"\npeak per window: {provider.peak} calls, {provider.peak_tokens} tokens, over {provider.over}"
    )
    assert provider.over == 0, f"{provider.over} requests over the provider's limit"
    assert set(statuses.values()) == {"completed"}
    assert provider.served == RUNS
    # The limit was used, not just respected: some window held all it allows.
    assert provider.peak_tokens >= 350 - 16
    print(f"\npeak per window: {provider.peak} calls, {provider.peak_tokens} tokens")


def test_without_a_limit_the_provider_answers_429s(db_url: str) -> None:
    """The baseline: the same runs with no Toren limit (each call retries its own 429s)."""
    provider = ProviderLimit(rpm=30, tpm=480, period=PERIOD)
    statuses = fleet(db_url, provider, {})
    assert provider.over > 0
    print(
        f"\nbaseline: {provider.over} requests over the limit answered 429; runs: "
        f"{sorted((s, list(statuses.values()).count(s)) for s in set(statuses.values()))}"
    )


def test_a_429_storm_sends_a_bounded_number_of_requests(db_url: str) -> None:
    storm = 4.0
    provider = ProviderLimit(period=PERIOD, retry_after="1")
    statuses = fleet(db_url, provider, {KEY: {}}, storm=storm)
    size = 3 if db_url.startswith("postgres") else 1
    # docs/flow-control.md: the calls in flight when the storm began (at most the fleet's
    # concurrency), then one probe per backoff step (1 s, 2 s, 4 s ...) while it lasts.
    probes = math.ceil(math.log2(storm / BACKOFF_FIRST + 1)) + 1
    bound = size * CONCURRENCY + probes
    assert 0 < provider.during_storm <= bound, (provider.during_storm, bound)
    assert provider.during_storm < RUNS
    assert set(statuses.values()) == {"completed"}
    print(f"\nstorm: {provider.during_storm} requests during {storm:g}s (bound {bound})")
