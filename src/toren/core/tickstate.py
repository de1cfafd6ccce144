"""The tick's driver state: what every step stands on around the pure journal.

The decisions (replay, run live, supersede, back off; reuse claims; replay-exact usage)
are the journal's (:mod:`toren.core.journal`). This module holds what the driver adds:

- :class:`Writer`: ordered writes under the lease: the invalidation barrier (a
  ``Supersede``'s events are written before anything later of the run), the lock, and the
  run row's pending totals, flushed at most once a second by the clock's monotonic time;
- :class:`Parker`: the live steps in flight, the branches parked on durable waits and the
  wake-up of the drive (:meth:`Parker.drive`, shared with the dry run of ``toren plan``);
- :class:`TickState`: one tick: it asks the journal, stamps what it answers (slot,
  worker, code version, time) and writes it, stops the agent code (cancel, drain, lease
  lost, back off, park).

The steps are in :mod:`toren.core.steps`, their effects in :mod:`toren.core.effects`, the
drive (load, replay, park, finish) in :mod:`toren.core.tick`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random as _random
import time
import uuid as _uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from toren.config import Settings
from toren.core.audit import chain
from toren.core.branches import IDLE, READY, UNKNOWN, Branches, verdict
from toren.core.clock import Clock, SystemClock
from toren.core.context import Context, RunUsage
from toren.core.digest import HashCache
from toren.core.effects import RequestBodies, error_dict, json_value, recorded_error
from toren.core.events import Event, ModelCallRecorded, Payload, make_event
from toren.core.fencing import LeaseFence
from toren.core.journal import (
    NO_GUARD,
    BackOff,
    Journal,
    LiveVersions,
    Replay,
    Run,
    Supersede,
    log_totals,
)
from toren.core.ports import JournalStore, ModelProvider
from toren.core.program import AgentProgram, AgentResolver, Limits, Pricing, raised
from toren.core.records import Lease, Release, RunDelta, RunRecord, WorkerInfo
from toren.core.replay import RunLog, end_slot, step_slot
from toren.core.values import RunStatus, StepKind, TickStatus, Totals
from toren.errors import LeaseLost, MessageConsumed, RunCancelledSignal, StorageError

if TYPE_CHECKING:
    from toren.core.ports import Telemetry

log = logging.getLogger("toren.tick")

LiveFeed = Callable[[str, dict[str, Any]], None]  # (run_id, item) -> None; never blocks

__all__ = [
    "FLUSH_INTERVAL",
    "LiveFeed",
    "ReplayGcPause",
    "TickDeps",
    "TickResult",
    "TickState",
    "error_dict",
    "json_value",
    "log_totals",
    "newest_start_by_version",
    "recorded_error",
]


def _new_uuid() -> str:
    return str(_uuid.uuid4())


@dataclass
class TickDeps:
    """Everything one tick needs, injected, so a tick is testable with fakes. Every source
    of nondeterminism a live step records comes from here: the clock (``ctx.now()``,
    timers, the flush cadence, latencies), ``random`` (``ctx.random()``) and ``uuid``
    (``ctx.uuid()``)."""

    store: JournalStore
    agents: AgentResolver
    providers: Mapping[str, ModelProvider] = field(default_factory=dict)
    clock: Clock = field(default_factory=SystemClock)
    settings: Settings = field(default_factory=Settings)
    worker_id: str = "local"
    worker_started_at: float | None = None
    code_version: str | None = None
    pricing: Pricing | None = None
    live: LiveFeed | None = None
    telemetry: Telemetry | None = None  # toren.agents.telemetry.create_telemetry()
    random: Callable[[], float] = _random.random
    uuid: Callable[[], str] = _new_uuid


@dataclass(frozen=True)
class TickResult:
    run_id: str
    status: TickStatus
    output: Any = None
    error: dict[str, Any] | None = None
    not_before: float | None = None
    replayed: int = 0
    executed: int = 0
    invalidations: int = 0


FLUSH_INTERVAL = 1.0  # seconds between run-row total updates within a tick


def monotonic_of(clock: Clock) -> Callable[[], float]:
    """The clock's monotonic time (seconds, for intervals), or the process's when a clock
    of the host's own has none."""
    found = getattr(clock, "monotonic", None)
    return found if callable(found) else time.perf_counter


class _Abort(BaseException):
    """Stops agent code from the outside. BaseException: user code cannot swallow it."""


class _BackOff(_Abort):
    def __init__(self, newer_version: str) -> None:
        super().__init__(newer_version)
        self.newer_version = newer_version


class _Park(_Abort):
    pass


class _Drain(_Abort):
    pass


class _Cancel(_Abort, RunCancelledSignal):
    pass


class _LeaseGone(_Abort):
    def __init__(self, cause: LeaseLost) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _StoreFailed(_Abort):
    """The store failed under a step (unreachable, a statement refused, a row that cannot
    be read). Like a lost lease it ends the tick, and the run is retried once its lease
    runs out; it is not the agent's error to see, nor to swallow: an ``except Exception``
    around ``ctx.model`` that carried on would take a branch no replay can reproduce."""

    def __init__(self, cause: StorageError) -> None:
        super().__init__(str(cause))
        self.cause = cause


class ReplayGcPause:
    """Pauses Python's cycle collector while ticks replay.

    A replay builds one object graph per recorded event (a 10,000-step run: ~50,000
    containers) and keeps it; the collector would re-scan that growing heap again and
    again while the agent code re-runs, a third of the replay's time. The objects are
    acyclic (reference counting frees them), so pausing the collector from the start of a
    tick until its first live step loses nothing. The collector is process-wide, hence one
    count shared by every tick of the process; it comes back on when no tick replays.
    """

    _replaying = 0
    _was_enabled = True

    @classmethod
    def begin(cls) -> None:
        if cls._replaying == 0:
            cls._was_enabled = gc.isenabled()
            gc.disable()
        cls._replaying += 1

    @classmethod
    def end(cls) -> None:
        cls._replaying -= 1
        if cls._replaying == 0 and cls._was_enabled:
            gc.enable()


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
        self.barrier: asyncio.Task[Any] | None = None
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
            release = Release(**{**release.__dict__, "delta": self.take()})
            chained = chain(self.chain, release.events)
            stored = await self.store.release(self.lease, release, now=self.clock.now())
            self.chain = chained
            return stored


class Parker:
    """Live steps in flight and branches parked on durable waits. A run parks (its tick
    ends, status waiting) when no live step is in flight, some branch waits durably and
    every branch is idle; see :meth:`drive`."""

    __slots__ = ("branches", "draining", "futures", "inflight", "parked", "waiters", "wake")

    def __init__(self) -> None:
        self.branches = Branches()  # parked steps and ctx.gather/task_group joins: see _settled
        self.inflight = 0
        self.waiters: list[tuple[float | None, tuple[str, ...]]] = []
        self.parked: list[tuple[float | None, tuple[str, ...]]] = []
        self.futures: set[asyncio.Future[None]] = set()  # what parked branches await
        self.wake = asyncio.Event()
        self.draining = False

    async def park(self, not_before: float | None, names: tuple[str, ...]) -> None:
        """Wait for the tick to park the run; never returns (the agent task is cancelled).
        Called inside a live step (counted in flight)."""
        entry = (not_before, names)
        parked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(entry)
        self.futures.add(parked)
        self.inflight -= 1
        if self.inflight == 0:
            self.wake.set()
        try:
            with self.branches.parked(parked):  # the tick knows this task waits durably
                await parked
        finally:
            self.inflight += 1
            self.waiters.remove(entry)
            self.futures.discard(parked)

    def parkable(self) -> bool:
        return bool(self.waiters) and self.inflight == 0

    async def drive(
        self,
        task: asyncio.Task[Any],
        *,
        stopped: Callable[[], bool],
        stop: Callable[[str], object],
        grace: float,
        run_id: str,
    ) -> None:
        """Run until the agent task ends or is stopped. ``stop("drain")`` once a draining
        worker has nothing in flight; ``stop("park")`` once the run is idle (the waiters
        are snapshot in :attr:`parked` first: cancelling the agent task unwinds them)."""
        while not task.done():
            self.wake.clear()
            woken = asyncio.ensure_future(self.wake.wait())
            await asyncio.wait({task, woken}, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            if task.done() or stopped():
                break
            if self.draining and self.inflight == 0:
                stop("drain")
                break
            if self.parkable() and await self._settled(task, stopped, grace, run_id):
                self.parked = list(self.waiters)
                stop("park")
        with contextlib.suppress(BaseException):
            await task

    async def _settled(
        self, task: asyncio.Task[Any], stopped: Callable[[], bool], grace: float, run_id: str
    ) -> bool:
        """Whether the run is idle, so that parking loses nothing: every branch of the
        agent code waits on a durable wait. Branches that can run are let run; a branch
        awaiting other work (outside ``ctx``) is waited for, up to ``park_grace`` seconds,
        after which the run parks anyway and that work runs again on resume. False when
        something else came up first (a live step, the end, a cancel, a drain)."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while self.parkable() and not task.done():
            if stopped() or self.draining:
                return False
            found = verdict(task, self.futures.__contains__, self.branches)
            if found.state == IDLE:
                return True
            if found.state == UNKNOWN:  # no way to tell: let ready branches run, then park
                for _ in range(8):
                    await asyncio.sleep(0)
                return self.parkable() and not task.done()
            if found.state == READY:
                await asyncio.sleep(0)
                continue
            now = loop.time()
            if deadline is None:
                deadline = now + grace
            if now >= deadline:
                log.info(
                    "run %s parks while a branch still awaits work outside ctx after %.0fs "
                    "(park_grace); that work is cancelled and runs again when the run resumes",
                    run_id,
                    grace,
                )
                return True
            self.wake.clear()
            woken = asyncio.ensure_future(self.wake.wait())
            await asyncio.wait(
                {*found.futures, task, woken},
                timeout=deadline - now,
                return_when=asyncio.FIRST_COMPLETED,
            )
            woken.cancel()
        return False


class _Busy:
    """Marks a live step in flight. Entering it ends the replay phase (and, while the
    worker drains, blocks: no new live work). Leaving the last one wakes the tick's driver
    only when it has something to decide (a parked waiter, a drain), not after every step.
    Made per step, never kept: the tick must not point back at it (a reference cycle
    would keep the tick's whole log alive until the cycle collector runs)."""

    __slots__ = ("state",)

    def __init__(self, state: TickState) -> None:
        self.state = state

    async def __aenter__(self) -> None:
        s = self.state
        p = s.parker
        if p.draining:  # no new live work; wait here to be released
            p.wake.set()
            await asyncio.Future()
        if s.fence.due():  # stalled near or past the lease: prove it before the effect
            await s._prove_lease()
        s.end_replay()  # the first live step: replay is over
        p.inflight += 1

    async def __aexit__(self, *exc: object) -> None:
        p = self.state.parker
        p.inflight -= 1
        if p.inflight == 0 and (p.waiters or p.draining):
            p.wake.set()


class TickState:
    """The state of one tick: a :class:`Journal`, a :class:`Writer` and a :class:`Parker`.
    Contexts call into its steps (:mod:`toren.core.steps`); :meth:`run` drives it."""

    def __init__(self, deps: TickDeps, lease: Lease, *, granted_at: float | None = None) -> None:
        self.deps = deps
        self.lease = lease
        # The lease's local deadline, checked before every live step (see fencing.py);
        # ``granted_at``: a lease_clock() reading from before the claim was sent.
        lease_settings = deps.settings.lease
        self.fence = LeaseFence(lease, lease_settings.ttl, lease_settings.fence_margin, granted_at)
        self.run_id = lease.run_id
        self.store = deps.store
        self.clock = deps.clock
        self.monotonic = monotonic_of(deps.clock)
        self.hashes = HashCache()
        self.bodies = RequestBodies(self.hashes)
        self.journal = Journal(lease.run_id)
        self.writer = Writer(deps.store, lease, deps.clock)
        self.parker = Parker()
        self.code_version = deps.code_version or "dev"
        self._inbox = asyncio.Lock()  # taking a message: see Steps._await_message
        self._abort: _Abort | None = None
        self._task: asyncio.Task[Any] | None = None
        self._interrupted = False
        self._live: LiveVersions = NO_GUARD
        self.replayed = self.executed = self.invalidations = 0
        self._replaying = False
        self.releasing = False  # giving the run back: the lease is let go on purpose

    @property
    def log(self) -> RunLog:
        return self.journal.log

    @property
    def branches(self) -> Branches:
        return self.parker.branches

    @property
    def raised_limits(self) -> Mapping[str, Any]:
        return self.journal.raised_limits

    @property
    def record(self) -> RunRecord | None:
        return self.writer.record

    @property
    def code_version(self) -> str:
        return self.writer.code_version

    @code_version.setter
    def code_version(self, value: str) -> None:
        self.writer.code_version = value

    # -- public controls ------------------------------------------------------------------

    def begin_replay(self) -> None:
        if not self._replaying and self.deps.settings.pause_gc_on_replay:
            self._replaying = True
            ReplayGcPause.begin()

    def end_replay(self) -> None:
        if self._replaying:
            self._replaying = False
            ReplayGcPause.end()

    def cancel(self) -> None:
        self._stop(_Cancel(RunStatus.CANCELLED.value))  # agent code sees its args: a plain str

    def lose_lease(self, why: str) -> None:
        """Another worker holds the run now (this one's lease ran out): stop at once, so a
        step in flight here is not paid for twice; nothing more can be written anyway."""
        self._stop(_LeaseGone(LeaseLost(why)))

    def begin_drain(self) -> None:
        """Graceful drain: start no new live step; steps in flight finish and are recorded,
        then the run is released (the next worker replays them for free)."""
        self.parker.draining = True
        self.parker.wake.set()

    def drain(self) -> None:
        """Hard drain (the drain window ran out): abandon steps still in flight; they have
        no event, so they run again elsewhere (at-least-once for those steps only)."""
        self._stop(_Drain("worker draining"))

    async def _prove_lease(self) -> None:
        try:
            await self.fence.prove(self.store, self.clock)
        except (LeaseLost, StorageError) as exc:
            raise self._halt(exc) from None

    def _halt(self, exc: LeaseLost | StorageError) -> _Abort:
        """Stop the tick for a store call of a step that failed; the abort to raise into
        the agent code in place of ``exc``."""
        abort = _LeaseGone(exc) if isinstance(exc, LeaseLost) else _StoreFailed(exc)
        self._stop(abort)
        return abort

    def _stop(self, abort: _Abort) -> None:
        if self._abort is None:
            self._abort = abort
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.parker.wake.set()

    def usage(self) -> RunUsage:
        """The run's usage as agent code sees it at this point: the log's totals as they
        stood at the last step replayed or event written (what the live run saw here).
        Once the tick writes, that is everything spent so far. A branch still replaying
        while another already runs live (``asyncio.gather``) sees its own replay position,
        not the totals the live branch has made current."""
        return RunUsage.from_totals(self.journal.usage_at())

    def limits(self, program: AgentProgram) -> Limits:
        """The program's limits, raised where a retry of this run raised them (never
        lowered, and a limit the agent does not set stays unset)."""
        return raised(program.limits, self.journal.raised_limits)

    # -- writing --------------------------------------------------------------------------

    async def _write(
        self,
        events: Sequence[Event],
        *,
        blobs: Mapping[str, str] | None = None,
        step: tuple[int, int, int] | None = None,
        used: Totals | None = None,
        consume: int | None = None,
    ) -> list[Event]:
        try:
            stored = await self.writer.append(
                events, blobs=blobs, step=step, used=used, consume=consume
            )
        except (LeaseLost, StorageError) as exc:
            raise self._halt(exc) from None
        self.journal.recorded(stored)
        self._publish_events(stored)
        return stored

    def _publish(self, item: dict[str, Any]) -> None:
        if self.deps.live is not None:
            self.deps.live(self.run_id, item)

    def _publish_events(self, events: Sequence[Event]) -> None:
        for event in events:
            self._publish({"type": "event", "event": event})

    def _event(
        self, stream: str, pos: int, gen: int, digest: str, payload: Payload, done: bool = False
    ) -> Event:
        return make_event(
            self.run_id,
            payload,
            stream=stream,
            position=pos,
            generation=gen,
            slot=step_slot(stream, gen, pos, done, self.journal.retries),
            digest=digest,
            code_version=self.code_version,
            worker_id=self.deps.worker_id,
            created_at=self.clock.now(),
        )

    def _run_event(self, payload: Payload) -> Event:
        terminal = payload.TYPE in ("RunCompleted", "RunFailed", "RunCancelled")
        return make_event(
            self.run_id,
            payload,
            slot=end_slot(self.journal.retries) if terminal else None,
            code_version=self.code_version,
            worker_id=self.deps.worker_id,
            created_at=self.clock.now(),
        )

    def _busy(self) -> _Busy:
        """``async with self._busy():`` around a live step's work (see :class:`_Busy`)."""
        return _Busy(self)

    # -- decisions: the journal answers, the tick stamps and writes ------------------------

    def _request(
        self, stream: str, pos: int, kind: StepKind, digest: str, reusable: bool = True
    ) -> Replay | Run:
        """Replay, or run live (after superseding the stream from here if the recorded step
        differs). Runs synchronously at call time, so answers follow call order."""
        if self._abort is not None:
            raise self._abort
        answer = self.journal.request(
            stream,
            pos,
            kind,
            digest,
            code_version=self.code_version,
            live_versions=self._live,
            reusable=reusable,
        )
        if isinstance(answer, Replay):
            if self.deps.live is not None:  # watchers mark the step replayed (free)
                step = answer.step
                self._publish(
                    {"type": "replayed", "stream": stream, "position": pos, "seq": step.first.seq}
                )
            return answer
        if isinstance(answer, Run):
            return answer
        if isinstance(answer, BackOff):
            raise self._backing_off(answer)
        assert isinstance(answer, Supersede) and answer.run is not None
        self._supersede(answer)
        return answer.run

    def _end_stream(self, ctx: Context) -> None:
        """New code ended the stream earlier than the log: the extra steps are superseded."""
        answer = self.journal.end_stream(
            ctx.stream,
            ctx.positions_taken,
            code_version=self.code_version,
            live_versions=self._live,
        )
        if isinstance(answer, BackOff):
            raise self._backing_off(answer)
        if answer is not None:
            self._supersede(answer)

    def _backing_off(self, answer: BackOff) -> _BackOff:
        abort = _BackOff(answer.newer_version)
        self._stop(abort)
        return abort

    def _supersede(self, answer: Supersede) -> None:
        events = [
            make_event(
                self.run_id,
                inv.payload,
                stream=inv.stream,
                generation=inv.generation,
                slot=inv.slot,
                code_version=self.code_version,
                worker_id=self.deps.worker_id,
                created_at=self.clock.now(),
            )
            for inv in answer.invalidations
        ]
        self.invalidations += len(events)
        log.info(
            "run %s: stream %r invalidated from position %d (%s) by code version %s",
            self.run_id,
            answer.stream,
            answer.from_pos,
            answer.cause,
            self.code_version,
        )
        # Written in order before any later write of this run (see Writer.append).
        self.writer.then(lambda: self._write_invalidation(events))

    async def _write_invalidation(self, events: list[Event]) -> None:
        try:
            stored = await self.writer.invalidations(events)
        except (LeaseLost, StorageError) as exc:
            raise self._halt(exc) from None
        self.journal.recorded(stored)
        self._publish_events(stored)

    # -- the invalidation-storm guard's input ----------------------------------------------

    async def _load_live_versions(self) -> None:
        if not self.deps.settings.storm_guard:
            return
        workers = await self.store.live_workers(
            now=self.clock.now(), ttl=self.deps.settings.worker_ttl
        )
        started = self.deps.worker_started_at
        self._live = LiveVersions(
            newest_start_by_version(workers),
            started_at=started if started is not None else self.clock.now(),
        )

    # -- results --------------------------------------------------------------------------

    def _result(self, status: TickStatus, **kw: Any) -> TickResult:
        return TickResult(
            self.run_id,
            status,
            replayed=self.replayed,
            executed=self.executed,
            invalidations=self.invalidations,
            **kw,
        )


def tool_refs(event: Event) -> list[str]:
    payload = event.payload
    return payload.tools if isinstance(payload, ModelCallRecorded) else []


def newest_start_by_version(workers: Sequence[WorkerInfo]) -> dict[str, float]:
    """For each live code version, when its most recently started worker started."""
    newest: dict[str, float] = {}
    for w in workers:
        # A worker serving several agents registers their versions space-separated.
        for version in w.code_version.split():
            newest[version] = max(newest.get(version, 0.0), w.started_at)
    return newest


def _negated(t: Totals) -> Totals:
    return Totals(
        -t.input_tokens,
        -t.output_tokens,
        -t.cost_nanousd,
        -t.saved_nanousd,
        -t.steps,
        -t.invalidations,
    )
