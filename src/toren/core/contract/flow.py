"""Flow control: how many runs of one key may hold a slot at once (docs/flow-control.md).

A run with a concurrency key waits ``queued`` until fewer than its key's limit of runs
hold a slot; it holds no worker slot, no task and no connection meanwhile: the claim
query skips it. A run takes a slot when it is first claimed and holds it until it ends,
waiting included (a run parked on a human's answer is still working on its ticket). Runs
of one key start by priority (higher first), then in the order they were started.

The key is computed when the run starts, from the agent's ``concurrency:`` (a path into
the input) or given by the caller; the limit travels on the run row, so a worker never
needs the agent's code to enforce it, and a deploy that changes the limit updates the
rows of the runs still queued (see ``toren.store.flow``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, get_args

OnConflict = Literal["enqueue", "reject", "cancel_previous"]
ON_CONFLICT: tuple[str, ...] = get_args(OnConflict)
MAX_KEY = 255
MISSING = "<missing>"


@dataclass(frozen=True)
class Concurrency:
    """An agent process's concurrency limit (agent.yaml ``concurrency:``)."""

    limit: int
    key: tuple[str, ...] = ()  # a path into the input; () limits the whole process
    on_conflict: str = "enqueue"

    def key_for(self, agent: str, process: str, input: object) -> str:
        """The run's key: ``agent/process``, then ``:`` and the JSON of the input's value
        at ``key`` (``<missing>`` when the input has none)."""
        base = f"{agent}/{process}"
        if not self.key:
            return base
        value: object = input
        for part in self.key:
            if isinstance(value, dict) and part in value:
                value = value[part]
            else:
                return f"{base}:{MISSING}"
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        return f"{base}:{text}"[:MAX_KEY]


def parse_key(expression: str) -> tuple[str, ...]:
    """``input.customer_id`` -> ``("customer_id",)``; ValueError naming what is expected."""
    parts = expression.split(".")
    if parts[0] != "input" or any(not p for p in parts) or len(parts) > 9:
        raise ValueError(
            f"a path into the run's input such as 'input.customer_id' or "
            f"'input.ticket.id'; found {expression!r}"
        )
    return tuple(parts[1:])


@dataclass(frozen=True)
class Queued:
    """Why a queued run waits, for the CLI, the API and the console."""

    key: str
    limit: int
    holding: int  # runs of the key holding a slot now
    position: int  # 1: the next to start when a slot frees

    def reason(self) -> str:
        return (
            f"queued: concurrency key {self.key!r} is at its limit of {self.limit} "
            f"({self.holding} running or waiting); position {self.position} in its queue"
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "key": self.key,
            "limit": self.limit,
            "holding": self.holding,
            "position": self.position,
            "reason": self.reason(),
        }


@dataclass(frozen=True)
class KeyQueue:
    """One concurrency key as ``GET /v1/flow`` and the console's Flow page show it."""

    key: str
    limit: int | None  # the limit the key's runs carry (None: removed; they run freely)
    holding: int  # runs holding a slot (running or waiting)
    queued: int  # runs waiting for one
    oldest_queued_at: float | None  # when the longest-waiting of them was started


@dataclass(frozen=True)
class RateLimitView:
    """One provider rate limit (``provider:model``) and how much of it the fleet uses."""

    key: str
    rpm: int | None
    tpm: int | None
    period: float
    calls_in_window: int  # slots taken in the current window (reserved ahead included)
    tokens_in_window: int
    blocked_until: float | None  # a 429 stopped the whole fleet until then
    parked: int  # runs parked now for a slot of it
    calls: int  # totals since the limit was first declared
    paced: int
    throttled: int


@dataclass(frozen=True)
class FlowView:
    """What holds the fleet back right now: concurrency keys with runs, and rate limits."""

    keys: tuple[KeyQueue, ...]
    rate_limits: tuple[RateLimitView, ...]
