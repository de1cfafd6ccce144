"""Provider rate limits shared by the fleet (docs/flow-control.md#provider-rate-limits).

A limit (:class:`toren.config.RateLimit`) caps the calls and tokens of one provider
model ("openai:gpt-4o-mini") in any window of ``period`` seconds, across every worker.
Each call takes a **slot** in the database before it is sent: a row of ``rate_grants``
holding its time and its estimated tokens. The slot is the earliest time at or after the
last one taken (first come, first served) whose window, with the call added, holds at
most ``rpm`` calls and ``tpm`` tokens (:func:`next_slot`). A call whose slot lies in the
future parks its run durably until then (no sleeping in a worker, no event written);
every run computes its own slot once, so a thousand waiting runs wake one at a time,
not all at each freed slot.

A 429 seen on a limited model blocks the key for the whole fleet (``blocked_until``):
for the server's ``retry-after``, at least :func:`throttle_backoff` of its consecutive
429s. While blocked, no slot is granted; once the block ends, one call (the probe) goes
and the others wait for its answer: a success unblocks the key, another 429 doubles the
wait. During a storm the requests sent are the calls in flight when it began plus one
probe per backoff, whatever the number of runs.

Pure: the store applies these under its row lock (toren.store.ratelimits).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextvars import ContextVar
from dataclasses import dataclass

from toren.config import RateLimit
from toren.core.contract.model_types import ModelRequest

__all__ = [
    "PACED",
    "Grant",
    "RateLimit",
    "Throttled",
    "estimate_tokens",
    "next_slot",
    "reason",
    "throttle_backoff",
]

# Output tokens assumed for a request that sets no max_tokens (or max_output_tokens).
DEFAULT_OUTPUT_ESTIMATE = 1024
# A probe (the first call after a block) holds the key this long, at most, for its answer.
PROBE_HOLD = 30.0
# The fleet's backoff after consecutive 429s: 1 s, 2 s, 4 s ... at most 60 s.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 60.0

# Set by the tick around a call of a limited model: a 429 then ends the call at once
# (Throttled) instead of the provider's own retries, so the fleet's bucket paces it.
PACED: ContextVar[bool] = ContextVar("toren_rate_paced", default=False)


class Throttled(Exception):
    """A limited model's provider answered 429: the call was not served (never recorded);
    ``retry_after``: the seconds the server asked for, if it said."""

    def __init__(self, retry_after: float | None, message: str = "") -> None:
        super().__init__(message or "rate limited (HTTP 429)")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Grant:
    """The store's answer to a call asking for a slot: its slot's id and time (``at``,
    now or later; ``go``: now, the call is sent), or, while the key is blocked, no slot
    (``id`` None) and the block's end."""

    id: int | None
    at: float
    key: str
    go: bool = False

    def wait(self, now: float) -> float:
        return max(0.0, self.at - now)


def estimate_tokens(request: ModelRequest) -> int:
    """Tokens a request may use, before it is sent: its text's characters / 4 (messages,
    tools and params, as JSON) plus its ``max_tokens`` (``max_output_tokens``,
    ``max_completion_tokens``), else :data:`DEFAULT_OUTPUT_ESTIMATE`. Corrected after the
    call from the usage the provider reported."""
    chars = sum(len(repr(m)) for m in request.messages) + sum(len(repr(t)) for t in request.tools)
    output = DEFAULT_OUTPUT_ESTIMATE
    for name in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        value = request.params.get(name)
        if type(value) is int and value > 0:
            output = value
            break
    return math.ceil(chars / 4) + output


def next_slot(
    limit: RateLimit,
    grants: Sequence[tuple[float, int]],
    tokens: int,
    now: float,
) -> float:
    """The earliest time at or after ``now`` and after every slot already taken
    (``grants``: (time, tokens), oldest first, those later than now - period) whose window
    of ``period`` seconds, with this call, holds at most ``rpm`` calls and ``tpm`` tokens.
    A call estimated above the whole ``tpm`` counts as ``tpm`` (it waits for an empty
    window). Since no slot is taken after it, the window ending at the slot is the only
    one to check."""
    at = max(now, grants[-1][0]) if grants else now
    if limit.rpm is not None and len(grants) >= limit.rpm:
        # the (n - rpm + 1)-th newest must have left the window
        at = max(at, grants[len(grants) - limit.rpm][0] + limit.period)
    if limit.tpm is not None:
        need = min(tokens, limit.tpm)
        held = sum(t for _, t in grants)
        for when, used in grants:
            if held + need <= limit.tpm:
                break
            held -= used
            at = max(at, when + limit.period)
    return at


def throttle_backoff(strikes: int, retry_after: float | None) -> float:
    """Seconds the fleet waits after its ``strikes``-th 429 in a row: the server's
    ``retry-after`` if longer, else 1 s doubling per strike, at most 60 s."""
    backoff = min(BACKOFF_MAX, BACKOFF_FIRST * 2.0 ** max(0, min(strikes - 1, 30)))
    return max(backoff, retry_after or 0.0)


def reason(key: str, not_before: float | None, now: float) -> str:
    """What a run paced on ``key`` shows: ``waiting: rate limit openai:gpt-4o-mini, next
    slot in 3 s``."""
    if not_before is None or not_before <= now:
        return f"waiting: rate limit {key}, next slot now"
    return f"waiting: rate limit {key}, next slot in {math.ceil(not_before - now)} s"
