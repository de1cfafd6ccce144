"""``GET /v1/flow``: what holds the fleet back now (docs/flow-control.md): each
concurrency key with unfinished runs (its limit, the runs holding a slot, the runs queued
and since when) and each provider rate limit (its window, the slots taken in it, a 429
block, the runs parked for a slot). The console's Flow page shows it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import cast

from pydantic import BaseModel, Field

from toren.api.state import State, error_responses
from toren.core.contract.clock import SystemClock


class KeyQueue(BaseModel):
    key: str = Field(description="The concurrency key (agent/process, then :value).")
    limit: int | None = Field(description="Its limit; null when a deploy removed it.")
    holding: int = Field(description="Runs holding a slot (running or waiting).")
    queued: int = Field(description="Runs queued for a slot.")
    oldest_queued_at: float | None = Field(
        description="When the longest-waiting queued run was started (Unix seconds)."
    )


class RateLimitView(BaseModel):
    key: str = Field(description="provider:model")
    rpm: int | None = Field(description="Requests per period (null: not limited).")
    tpm: int | None = Field(description="Tokens per period (null: not limited).")
    period: float = Field(description="The window, in seconds (60: per minute).")
    calls_in_window: int = Field(description="Slots taken in the current window.")
    tokens_in_window: int = Field(description="Tokens of those slots (estimated, then used).")
    blocked_until: float | None = Field(
        description="A 429 holds the whole fleet until then (Unix seconds), or null."
    )
    parked: int = Field(description="Runs parked now until their slot.")
    calls: int = Field(description="Calls that took a slot, in all.")
    paced: int = Field(description="Calls that had to wait for their slot, in all.")
    throttled: int = Field(description="429 answers, in all.")


class Flow(BaseModel):
    """Concurrency keys with unfinished runs (most queued first, at most 500) and the
    declared provider rate limits."""

    keys: list[KeyQueue]
    rate_limits: list[RateLimitView]
    now: float = Field(description="The server's time of this view (Unix seconds).")


async def get_flow(state: State) -> dict[str, object]:
    now = SystemClock().now()
    view = await state.store.flow_view(now=now)
    shown = {
        "keys": [dataclasses.asdict(k) for k in view.keys],
        "rate_limits": [dataclasses.asdict(r) for r in view.rate_limits],
        "now": now,
    }
    return cast(dict[str, object], state.redact(shown))


Route = tuple[str, Callable[..., object], dict[str, object]]

ROUTES: list[Route] = [
    (
        "/v1/flow",
        get_flow,
        {
            "methods": ["GET"],
            "response_model": Flow,
            "tags": ["flow control"],
            "summary": "Queues and rate limits now",
            "responses": error_responses(),
        },
    ),
]
