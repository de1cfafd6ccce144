"""Provider rate limits in a tick: a model call of a limited "provider:model" takes a slot
from the database before it is sent, and parks its run durably until a slot in the
future (toren.core.contract.ratelimit says how slots are found, toren.store.ratelimits
takes them). Nothing here writes an event: a run's log is the same whether or not it was
paced, and a run never paced makes no store call here at all.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from toren.config import RateLimit
from toren.core.agent_api.program import AgentProgram
from toren.core.contract.model_types import ModelRequest
from toren.core.contract.ratelimit import Grant, Throttled, estimate_tokens
from toren.core.drivers.tickstate import TickState
from toren.errors import LeaseLost, StorageError

__all__ = ["Pacing", "Slot", "limit_for"]

log = logging.getLogger("toren.tick")

# A slot at most this far away (and at most the worker's inline_wait) is waited for in
# the worker; a later one parks the run.
INLINE = 1.0


@dataclass(frozen=True)
class Slot:
    key: str
    grant: Grant
    tokens: int  # the estimate it was taken with


def limit_for(program: AgentProgram, state: TickState, request: ModelRequest) -> RateLimit | None:
    """The rate limit of the request's model: the agent's (agent.yaml ``rate_limits:``),
    else the worker's (``Settings.rate_limits``), else None."""
    key = f"{request.provider}:{request.model}"
    return program.rate_limits.get(key) or state.deps.settings.rate_limits.get(key)


class Pacing:
    """The rate-limit part of one tick's model steps, over the run's state."""

    __slots__ = ("state",)

    def __init__(self, state: TickState) -> None:
        self.state = state

    async def slot(self, stream: str, pos: int, request: ModelRequest, limit: RateLimit) -> Slot:
        """Wait for this call's slot: in the worker when it is near, else parked (the
        run is released until then and this step runs again when it is claimed)."""
        state = self.state
        key = f"{request.provider}:{request.model}"
        owner = f"{state.run_id}/{stream}:{pos}"
        tokens = estimate_tokens(request)
        while True:
            now = state.clock.now()
            try:
                grant = await state.store.take_rate_slot(
                    key, limit, owner=owner, tokens=tokens, now=now
                )
            except (LeaseLost, StorageError) as exc:
                raise state.halt(exc) from None
            if grant.go:
                return Slot(key, grant, tokens)
            wait = grant.wait(now)
            if wait <= min(INLINE, state.deps.settings.inline_wait):
                await state.clock.sleep(wait)
            else:
                await state.parker.park(grant.at, (), paced=key)

    async def throttled(self, slot: Slot, exc: Throttled) -> None:
        """The provider answered 429: the key waits for the whole fleet."""
        state = self.state
        try:
            until = await state.store.throttle_rate(
                slot.key, slot.grant.id, retry_after=exc.retry_after, now=state.clock.now()
            )
        except (LeaseLost, StorageError) as err:
            raise state.halt(err) from None
        log.info(
            "run %s: %s answered 429; the fleet waits %.1fs",
            state.run_id,
            slot.key,
            until - state.clock.now(),
        )

    async def settle(self, slot: Slot, used: int, served: bool) -> None:
        """The call's real tokens replace its estimate (a failed call that reported none
        keeps it). Best effort: a failure here only leaves the estimate in the window."""
        if slot.grant.id is None:
            return
        tokens = used if (served or used) else slot.tokens
        try:
            await self.state.store.settle_rate_slot(
                slot.key, slot.grant.id, tokens=tokens, ok=served, now=self.state.clock.now()
            )
        except StorageError as exc:
            log.warning(
                "run %s: could not settle its %s slot: %s", self.state.run_id, slot.key, exc
            )
