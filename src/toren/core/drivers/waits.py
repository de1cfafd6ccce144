"""The durable waits of a tick: ``ctx.sleep`` timers and ``ctx.wait_for_message``.

A wait is recorded when it starts (a ``TimerScheduled`` when it has a deadline) and when
it ends (``TimerFired``, or the ``MessageReceived`` it took); between the two, a wait
longer than ``inline_wait`` parks the run (:class:`~toren.core.drivers.parker.Parker`). The step
handlers (:class:`~toren.core.drivers.steps.LiveSteps`) decide through the journal and hand the
live part here; both are given the run's state, and neither is kept by it.
"""

from __future__ import annotations

import logging

from toren.core.agent_api.context import Context
from toren.core.contract.events import MessageReceived, TimerFired
from toren.core.drivers.effects import message_timer, sleep_timer
from toren.core.drivers.tickstate import TickState
from toren.errors import MessageConsumed, StorageError

__all__ = ["DurableWaits"]

log = logging.getLogger("toren.tick")


class DurableWaits:
    """The live part of the timer and message steps of one tick, over the run's state."""

    __slots__ = ("run_id", "state")

    def __init__(self, state: TickState) -> None:
        self.state = state
        self.run_id = state.run_id

    async def start_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, seconds: float
    ) -> None:
        async with self.state.busy():
            timer = sleep_timer(seconds, self.state.clock.now())
            event = self.state.event(ctx.stream, pos, gen, digest, timer)
            if seconds > self.state.deps.settings.inline_wait:
                # It parks at once: written with the park (or the next write of another
                # branch). Lost in a crash before either, the replay starts the timer
                # again, and the sleep lasts longer by the time the run was down.
                self.state.defer(event)
            else:  # slept here: a crash must not start it again
                await self.state.write([event])
        await self.await_timer(ctx, pos, gen, digest, timer.fire_at)

    async def await_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, fire_at: float
    ) -> None:
        async with self.state.busy():
            while (left := fire_at - self.state.clock.now()) > 0:
                if left <= self.state.deps.settings.inline_wait:
                    await self.state.clock.sleep(left)
                else:
                    await self.state.parker.park(fire_at, ())
            fired = TimerFired(fired_at=self.state.clock.now())
            # Written with the tick's next write: a crash that loses it leaves the timer
            # due, and the replay fires it again at once (a message wait's timeout is
            # written at once: lost, a message committed late could be taken instead).
            self.state.defer(self.state.event(ctx.stream, pos, gen, digest, fired, done=True))
            self.state.executed += 1

    async def start_message_wait(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, timeout: float | None
    ) -> object:
        deadline = None
        if timeout is not None:
            async with self.state.busy():
                timer = message_timer(name, timeout, self.state.clock.now())
                deadline = timer.fire_at
                await self.state.write([self.state.event(ctx.stream, pos, gen, digest, timer)])
        return await self.await_message(ctx, pos, gen, digest, name, deadline)

    async def await_message(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, deadline: float | None
    ) -> object:
        async with self.state.busy():
            while True:
                # One taker at a time: two waits on one name must not both take a message.
                async with self.state.inbox:
                    received = await self.take_message(ctx, pos, gen, digest, name, deadline)
                if received is not None:
                    self.state.executed += 1
                    return received.payload
                now = self.state.clock.now()
                if deadline is not None and now >= deadline:
                    fired = TimerFired(fired_at=now)
                    await self.state.write(
                        [self.state.event(ctx.stream, pos, gen, digest, fired, True)]
                    )
                    self.state.executed += 1
                    return None
                if deadline is not None and deadline - now <= self.state.deps.settings.inline_wait:
                    await self.state.clock.sleep(
                        min(deadline - now, self.state.deps.settings.poll_interval)
                    )
                else:
                    await self.state.parker.park(deadline, (name,))

    async def take_message(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, deadline: float | None
    ) -> MessageReceived | None:
        """Record the next message named ``name`` as received by this step: first one that
        only superseded steps received (it goes back in line), then the inbox's oldest,
        unless it was sent after the wait's deadline (the timeout came first, even if this
        worker only sees both now; the message stays for a later wait).

        A message another writer consumed between the read and this step's write is
        refused by the store (``MessageConsumed``: nothing written, the lease still
        holds); the step then reads the next one, so the run takes it, or waits, in this
        tick and under its lease. A write whose lease fence failed ends the tick as
        ever (lease lost)."""
        received = self.state.journal.redeliverable(name)
        if received is not None:
            event = self.state.event(
                ctx.stream, pos, gen, digest, received, done=deadline is not None
            )
            await self.state.write([event])
            return received
        refused: set[int] = set()
        while True:
            try:
                # Without a deadline, finding nothing parks the run (see next_message).
                message = await self.state.next_message(name, parks=deadline is None)
            except StorageError as exc:  # a corrupt inbox row, say: not the agent's to see
                raise self.state.halt(exc) from None
            if message is None or (deadline is not None and message.created_at > deadline):
                return None
            if message.id in refused:  # the store offers again what it just refused
                raise self.state.halt(
                    StorageError(
                        f"run {self.run_id!r}: the inbox offers message {message.id} "
                        f"({name!r}) again after refusing it as consumed"
                    )
                ) from None
            received = MessageReceived(name=name, payload=message.payload, inbox_id=message.id)
            event = self.state.event(
                ctx.stream, pos, gen, digest, received, done=deadline is not None
            )
            try:
                await self.state.write([event], consume=message.id)
            except MessageConsumed as exc:
                refused.add(message.id)
                log.info(
                    "run %s: message %d (%r) was consumed by another writer before step "
                    "%s:%d took it; taking the next one (%s)",
                    self.run_id,
                    message.id,
                    name,
                    ctx.stream,
                    pos,
                    exc,
                )
                continue
            return received
