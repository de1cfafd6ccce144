"""`GET /v1/flow` (what holds runs back now), on SQLite and PostgreSQL: a concurrency key
with its holder and its queue, and a rate limit with the slots taken in its window."""

from __future__ import annotations

import time

from toren.config import RateLimit

from .support import Api
from .test_flow import _status


async def test_the_flow_view_shows_queues_and_rate_limits(api: Api) -> None:
    async with api.http() as http:
        empty = (await http.get("/v1/flow")).json()
    assert empty["keys"] == [] and empty["rate_limits"] == []
    ids = [
        (
            await api.client.start_run(
                "approval", None, concurrency_key="desk-9", concurrency_limit=1
            )
        ).id
        for _ in range(3)
    ]
    await _status(api, ids[0], "waiting")
    limit = RateLimit(rpm=5, tpm=1000, period=60)
    now = time.time()
    for owner in ("a/:0", "b/:0"):
        assert (await api.store.take_rate_slot("fake:m", limit, owner=owner, tokens=40, now=now)).go
    async with api.http() as http:
        response = await http.get("/v1/flow")
    assert response.status_code == 200, response.text
    flow = response.json()
    (key,) = flow["keys"]
    assert {k: key[k] for k in ("key", "limit", "holding", "queued")} == {
        "key": "desk-9",
        "limit": 1,
        "holding": 1,
        "queued": 2,
    }
    assert key["oldest_queued_at"] is not None and key["oldest_queued_at"] <= flow["now"]
    (rate,) = flow["rate_limits"]
    assert {k: rate[k] for k in ("key", "rpm", "tpm", "period")} == {
        "key": "fake:m",
        "rpm": 5,
        "tpm": 1000,
        "period": 60.0,
    }
    assert (rate["calls_in_window"], rate["tokens_in_window"], rate["calls"]) == (2, 80, 2)
    assert rate["blocked_until"] is None and rate["parked"] == 0
    await api.client.send_message(ids[0], "approve", "yes")
    await _status(api, ids[1], "waiting")  # the next one took the slot
    async with api.http() as http:
        (key,) = (await http.get("/v1/flow")).json()["keys"]
    assert (key["holding"], key["queued"]) == (1, 1)


async def test_the_flow_view_needs_the_token(api: Api) -> None:
    async with api.http(token=None) as http:
        assert (await http.get("/v1/flow")).status_code == 401
