"""The tick's writer: ordered writes of one tick under its lease.

A ``Supersede``'s events go through the barrier, in order, before any later write of the
run; every write is fenced by the lease's epoch in the store; the run row's pending totals
are flushed at most once a second by the clock's monotonic time. One part of the composed
tick (see :mod:`toren.core.drivers.tickstate`); it knows the store and the lease, nothing of the
journal or the agent code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace

from toren.core.contract.audit import chain
from toren.core.contract.clock import Clock, monotonic_of
from toren.core.contract.events import Event
from toren.core.contract.ports import JournalStore
from toren.core.contract.records import Lease, Release, RunDelta, RunRecord
from toren.core.contract.values import Totals
from toren.errors import MessageConsumed

__all__ = ["FLUSH_INTERVAL", "Writer"]

FLUSH_INTERVAL = 1.0  # seconds between run-row total updates within a tick


class Writer:
    """Ordered writes of one tick under its lease. A ``Supersede``'s events are written
    through the barrier, in order, before any later write of the run; every write is
    fenced by the lease's epoch in the store. The run row is a cache of the log: its
    totals are updated at most once a second (and at release), which keeps the commit of
    each step to the event row itself; a tick starts by correcting the row from the log,
    so totals lost with a crashed worker come back."""

    __slots__ = (
        "_tally",
        "barrier",
        "chain",
        "clock",
        "code_version",
        "_deferred",
        "lease",
        "lock",
        "monotonic",
        "next_flush",
        "record",
        "store",
    )

    def __init__(self, store: JournalStore, lease: Lease, clock: Clock) -> None:
        self.store = store
        self.lease = lease
        self.clock = clock
        self.monotonic = monotonic_of(clock)
        self.lock = asyncio.Lock()
        self.barrier: asyncio.Task[object] | None = None
        # Pending totals as one list of ints (input, output, cost nano-USD, saved
        # nano-USD, steps, invalidations), added to in place: a Totals per step would
        # cost more than the rest of the bookkeeping of the step (see bench/RESULTS.md).
        self._tally = [0, 0, 0, 0, 0, 0]
        self.next_flush = float("-inf")
        self.code_version = "dev"
        self.record: RunRecord | None = None
        # The ``chain`` of the run's last stored event: every write of the run goes
        # through this writer, one at a time under its lock, so the events it chains are
        # stored in the order it chains them (docs/event-log.md#the-chain).
        self.chain: str | None = None
        # Events a crash may lose (see defer), written ahead of the next write's.
        self._deferred: list[Event] = []

    @property
    def pending(self) -> Totals:
        """The totals not yet written to the run row."""
        return Totals(*self._tally)

    def add(self, delta: Totals | RunDelta) -> None:
        t = self._tally
        t[0] += delta.input_tokens
        t[1] += delta.output_tokens
        t[2] += delta.cost_nanousd
        t[3] += delta.saved_nanousd
        t[4] += delta.steps
        t[5] += delta.invalidations

    def count_step(self, input_tokens: int, output_tokens: int, cost_nanousd: int) -> None:
        """One step written, with what it used (the hot path's :meth:`add`)."""
        t = self._tally
        t[0] += input_tokens
        t[1] += output_tokens
        t[2] += cost_nanousd
        t[4] += 1

    async def append(
        self,
        events: Sequence[Event],
        *,
        blobs: Mapping[str, str] | None = None,
        step: tuple[int, int, int] | None = None,
        used: Totals | None = None,
        consume: int | None = None,
    ) -> list[Event]:
        """Write after the barrier; ``step``: the events are a step's, which used (input
        tokens, output tokens, nano-USD); ``used``: what events that are not a step add to
        the run's totals (a call cut off in flight). Both are counted after the barrier and
        under the writer's lock, so the run row never carries usage ahead of an earlier
        write, nor (carried by another branch's write) ahead of these events. Raises the store's
        ``LeaseLost`` / ``StorageError``, and ``MessageConsumed`` for a step whose message
        (``consume``) another writer consumed first: the store wrote nothing, and the tick
        goes on under its lease, so what this write counted and the totals it carried
        are given back (see :meth:`_refused`)."""
        barrier = self.barrier
        if barrier is not None and not barrier.done():
            await asyncio.shield(barrier)
        async with self.lock:
            # Counted under the lock: a write of another branch waiting for it cannot
            # carry this usage to the run row ahead of these events.
            if step is not None:
                self.count_step(*step)
            if used is not None:
                self.add(used)
            delta = self.due_delta()
            # A barrier scheduled while this write waited (another branch's supersede)
            # comes first for what was deferred since: deferred events stay for a write
            # after it (what was deferred before may go after it too).
            newer = self.barrier is not barrier and not (
                self.barrier is None or self.barrier.done()
            )
            deferred = [] if newer else self._take_deferred()
            if deferred:
                events = [*deferred, *events]
            chained = chain(self.chain, events)
            try:
                stored = await self.store.append(
                    self.lease,
                    events,
                    blobs=blobs,
                    delta=delta,
                    consume_inbox=consume,
                    now=self.clock.now(),
                )
            except MessageConsumed:
                self._refused(delta, step, used)
                self._deferred[:0] = deferred  # nothing was written: still due
                raise
            self.chain = chained
            record = self.record
            if record is not None and record.blocked_error is not None:
                # The first step written since the run was blocked: it moves again.
                self.record = replace(record, blocked_error=None)
                await self.store.clear_blocked(self.lease, now=self.clock.now())
        return stored

    def _refused(
        self, delta: RunDelta | None, step: tuple[int, int, int] | None, used: Totals | None
    ) -> None:
        """A write the store refused, having written nothing (its message was consumed
        first): its own usage is uncounted, and the pending totals it carried go back
        into the tally, due at once, for the next write (or the release) to carry. Added
        back, not restored from a copy: another branch may have added meanwhile."""
        if step is not None:  # what count_step counted for it
            self.add(Totals(-step[0], -step[1], -step[2], 0, -1, 0))
        if used is not None:
            self.add(_negated(used))
        if delta is not None:
            self.add(delta)
            self.next_flush = float("-inf")

    def defer(self, event: Event) -> None:
        """Write ``event`` ahead of the tick's next step (or its release) instead of in a
        commit of its own. Only for an event whose loss in a crash changes nothing the run
        did: a due timer's ``TimerFired`` (a replay finds the timer due and fires it again
        at once; the agent code cannot tell), a parking timer's ``TimerScheduled`` (the
        replay starts it again). What came after it in the agent code is in no event
        before it is, so the log keeps its order (docs/storage.md)."""
        self._deferred.append(event)

    def _take_deferred(self) -> list[Event]:
        deferred = self._deferred
        if deferred:
            self._deferred = []
        return deferred

    def then(self, write: Callable[[], Awaitable[None]]) -> None:
        """Schedule ``write()`` after every write scheduled so far (the barrier): what a
        synchronous decision must write before anything later of the run."""
        previous = self.barrier

        async def ordered() -> None:
            if previous is not None and not previous.done():
                await asyncio.shield(previous)
            await write()

        self.barrier = asyncio.ensure_future(ordered())

    async def invalidations(self, events: Sequence[Event]) -> list[Event]:
        async with self.lock:  # counted under the lock, as a step's usage is (see append)
            self._tally[5] += len(events)
            # Not the deferred events: they may follow the decision to supersede (a step
            # of the superseded stream run anew), so the next write carries them.
            chained = chain(self.chain, events)
            stored = await self.store.append(
                self.lease, events, delta=self.due_delta(), now=self.clock.now()
            )
            self.chain = chained
            return stored

    def due_delta(self) -> RunDelta | None:
        """The pending totals, when it is time to write them to the run row."""
        now = self.monotonic()
        if now < self.next_flush:
            return None
        self.next_flush = now + FLUSH_INTERVAL
        return self.take()

    def take(self) -> RunDelta:
        i, o, c, saved, steps, invalidations = self._tally
        self._tally = [0, 0, 0, 0, 0, 0]
        return RunDelta(
            input_tokens=i,
            output_tokens=o,
            cost_nanousd=c,
            saved_nanousd=saved,
            steps=steps,
            invalidations=invalidations,
            code_version=self.code_version,
        )

    async def release(self, release: Release) -> list[Event]:
        barrier = self.barrier
        if barrier is not None and not barrier.done():
            with contextlib.suppress(BaseException):  # its failure already stopped the tick
                await barrier
        async with self.lock:
            events = [*self._take_deferred(), *release.events]
            release = Release(**{**release.__dict__, "delta": self.take(), "events": events})
            chained = chain(self.chain, release.events)
            stored = await self.store.release(self.lease, release, now=self.clock.now())
            self.chain = chained
            return stored


def _negated(t: Totals) -> Totals:
    return Totals(
        -t.input_tokens,
        -t.output_tokens,
        -t.cost_nanousd,
        -t.saved_nanousd,
        -t.steps,
        -t.invalidations,
    )
