"""The run's state in one tick: the part of the composed tick the steps and the driver share.

The tick is three parts and a policy, each with its own state, each given what it needs:

- :class:`TickState` (here): one tick of one run. It holds the :class:`Journal` (the
  decision), a :class:`~toren.core.drivers.writer.Writer` (ordered writes under the lease) and a
  :class:`~toren.core.drivers.parker.Parker` (steps in flight, durable waits); it asks the
  journal, stamps what it answers (slot, worker, code version, time), writes it, and stops
  the agent code (an :mod:`~toren.core.drivers.aborts` ``Abort``: cancel, drain, lease lost, back
  off, park);
- the step handlers (:class:`toren.core.drivers.steps.LiveSteps`): what each ``ctx.<effect>``
  does with the journal's answer; given the state;
- the driver (:class:`toren.core.drivers.tick.TickRunner`): load, drive, release; given the
  deps and the lease, it makes the state and hands the steps to the root context.

What a step does (replay, run live, supersede, back off; reuse a superseded tool call;
the budget) is decided by the journal (:mod:`toren.core.contract.journal`) and the pure policy
beside it (:mod:`toren.core.contract.policy`), which the dry run of ``toren plan`` asks too.

References run one way: the steps hold the state, the driver holds the state, the state
holds neither (see :meth:`TickState.attach`), so a finished tick and its log are freed by
reference counting, not the cycle collector.
"""

from __future__ import annotations

import asyncio
import logging
import random as _random
import uuid as _uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from toren.config import Settings
from toren.core.agent_api.context import Context, RunUsage
from toren.core.agent_api.program import AgentProgram, AgentResolver, Limits, Pricing, raised
from toren.core.contract.clock import Clock, SystemClock, monotonic_of
from toren.core.contract.digest import HashCache
from toren.core.contract.events import Event, ModelCallRecorded, Payload, make_event
from toren.core.contract.journal import (
    NO_GUARD,
    BackOff,
    Journal,
    LiveVersions,
    Replay,
    Run,
    Supersede,
)
from toren.core.contract.ports import JournalStore, ModelProvider
from toren.core.contract.records import InboxMessage, Lease, WorkerInfo
from toren.core.contract.replay import end_slot, step_slot
from toren.core.contract.values import RunStatus, StepKind, TickStatus, Totals
from toren.core.drivers.aborts import (
    Abort,
    BackingOff,
    Cancelling,
    Draining,
    LeaseGone,
    StoreFailed,
)
from toren.core.drivers.effects import RequestBodies
from toren.core.drivers.fencing import LeaseFence
from toren.core.drivers.gcpause import ReplayGcPause
from toren.core.drivers.parker import Parker
from toren.core.drivers.writer import FLUSH_INTERVAL, Writer
from toren.errors import LeaseLost, StorageError

if TYPE_CHECKING:
    from toren.core.contract.ports import Telemetry
    from toren.core.drivers.sticky import StickyRuns

log = logging.getLogger("toren.tick")

LiveFeed = Callable[[str, dict[str, Any]], None]  # (run_id, item) -> None; never blocks

__all__ = [
    "FLUSH_INTERVAL",
    "Busy",
    "LiveFeed",
    "ReplayGcPause",
    "TickDeps",
    "TickResult",
    "TickState",
    "monotonic_of",
    "newest_start_by_version",
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
    # Parked runs kept suspended, continued in place when claimed again (a worker makes
    # one unless Settings.sticky_cache_mb is 0; None: every park cancels its agent task).
    sticky: StickyRuns | None = None


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


class Busy:
    """Marks a live step in flight. Entering it ends the replay phase (and, while the
    worker drains, blocks: no new live work). Leaving the last one wakes the tick's driver
    only when it has something to decide (a parked waiter, a drain), not after every step.
    Made per step, never kept: the state must not point back at it (a reference cycle
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
            await s.prove_lease()
        s.end_replay()  # the first live step: replay is over
        p.inflight += 1

    async def __aexit__(self, *exc: object) -> None:
        p = self.state.parker
        p.inflight -= 1
        if p.inflight == 0 and (p.waiters or p.draining):
            p.wake.set()


class TickState:
    """The state of one tick of one run: a :class:`Journal`, a :class:`Writer` and a
    :class:`Parker`, the lease's fence, the counts, and what stopped the tick. The steps
    (:class:`~toren.core.drivers.steps.LiveSteps`) ask and write through it; the driver
    (:class:`~toren.core.drivers.tick.TickRunner`) loads, drives and releases through it. It
    holds neither: see :meth:`attach` for the one reference it takes to the agent task."""

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
        self.writer.code_version = deps.code_version or "dev"
        self.inbox = asyncio.Lock()  # taking a message: see DurableWaits.await_message
        self.claimed_message = lease.message  # see next_message
        self.unread_at_claim = unread_at_claim(lease)
        self.interrupted = False  # the tick resumes a run cut off (replayed cost is saved)
        self.live_versions: LiveVersions = NO_GUARD
        self.replayed = self.executed = self.invalidations = 0
        self.releasing = False  # giving the run back: the lease is let go on purpose
        self._abort: Abort | None = None
        self._task: asyncio.Task[object] | None = None
        self._replaying = False

    @property
    def code_version(self) -> str:
        return self.writer.code_version

    @code_version.setter
    def code_version(self, value: str) -> None:
        self.writer.code_version = value

    @property
    def abort(self) -> Abort | None:
        """What stopped the tick (the first one), or None while it goes on."""
        return self._abort

    # -- the agent task -------------------------------------------------------------------

    def attach(self, task: asyncio.Task[object]) -> None:
        """The agent task, cancelled by :meth:`stop`. The task (its frames hold the root
        context, which holds the steps, which hold this state) points back here: that is
        a reference cycle while the tick runs, broken by :meth:`detach` when it ends, so
        the state and its log are freed at once by reference counting."""
        self._task = task

    def detach(self) -> None:
        """Drop the agent task (cancelled first if it still runs: never orphaned)."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None

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
        self.stop(Cancelling(RunStatus.CANCELLED.value))  # agent code sees a plain str

    def lose_lease(self, why: str) -> None:
        """Another worker holds the run now (this one's lease ran out): stop at once, so a
        step in flight here is not paid for twice; nothing more can be written anyway."""
        self.stop(LeaseGone(LeaseLost(why)))

    def begin_drain(self) -> None:
        """Graceful drain: start no new live step; steps in flight finish and are recorded,
        then the run is released (the next worker replays them for free)."""
        self.parker.draining = True
        self.parker.wake.set()

    def drain(self) -> None:
        """Hard drain (the drain window ran out): abandon steps still in flight; they have
        no event, so they run again elsewhere (at-least-once for those steps only)."""
        self.stop(Draining("worker draining"))

    async def prove_lease(self) -> None:
        try:
            await self.fence.prove(self.store, self.clock)
        except (LeaseLost, StorageError) as exc:
            raise self.halt(exc) from None

    def halt(self, exc: LeaseLost | StorageError) -> Abort:
        """Stop the tick for a store call of a step that failed; the abort to raise into
        the agent code in place of ``exc``."""
        abort = LeaseGone(exc) if isinstance(exc, LeaseLost) else StoreFailed(exc)
        self.stop(abort)
        return abort

    def suspend(self, abort: Abort) -> None:
        """Park without cancelling the agent task: the run is released as waiting, and
        the task waits in its parked steps for :meth:`rebind` (a sticky run)."""
        if self._abort is None:
            self._abort = abort
        self.parker.suspended = True
        self.parker.wake.set()

    def rebind(self, lease: Lease, granted_at: float | None) -> None:
        """Continue a suspended tick under the run's next lease: a new fence and writer
        lease, no abort, fresh per-tick counts (see :mod:`toren.core.drivers.sticky`)."""
        settings = self.deps.settings.lease
        self.lease = lease
        self.fence = LeaseFence(lease, settings.ttl, settings.fence_margin, granted_at)
        self.writer.lease = lease
        self.claimed_message = lease.message
        self.unread_at_claim = unread_at_claim(lease)
        self._abort = None
        self.releasing = False
        self.replayed = self.executed = self.invalidations = 0

    async def next_message(self, name: str, *, parks: bool = False) -> InboxMessage | None:
        """The oldest unconsumed message named ``name`` in the run's inbox. The first
        read of a tick may be answered by what the claim read (``Lease.message``, the
        inbox's oldest message of any name, if its name is ``name``): nothing but this
        tick's writes consumes a message while it holds the lease, except a writer outside
        the lease protocol, whose take the store then refuses (``MessageConsumed``), as it
        would after a read. A read for a wait that parks if it finds nothing (``parks``)
        is answered None without asking the store once this tick has taken every message
        the claim saw unconsumed (:attr:`unread_at_claim` empty), if that wait's park is
        the run's at once (:meth:`_parks_alone`): a message sent since the claim is the
        park's to see, which looks at the inbox again under the row's lock and wakes the
        run (as it does for a message sent just after a read). Any other read asks the
        store: a wait beside other work would leave a message sent since the claim
        untaken until all that work is done, and then pay a park and a claim for it."""
        claimed, self.claimed_message = self.claimed_message, None
        if claimed is not None and claimed.name == name:
            return claimed
        if (
            parks
            and self.unread_at_claim is not None
            and not self.unread_at_claim
            and self._parks_alone()
        ):
            return None
        return await self.store.next_message(self.run_id, [name])

    def _parks_alone(self) -> bool:
        """Whether the wait running now, finding nothing, parks the run at once: it is the
        only live work in flight (its own ``busy()``), in the agent's own task, with no
        branch of a Toren combinator open, parked or joined. (A task the agent code made
        itself, outside ``ctx``, is not seen here when it is not in a step; the park still
        looks at the inbox then, so a message waits for it, and is never lost.)"""
        p = self.parker
        return p.inflight == 1 and not p.branches.held() and asyncio.current_task() is self._task

    def stop(self, abort: Abort) -> None:
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

    def busy(self) -> Busy:
        """``async with state.busy():`` around a live step's work (see :class:`Busy`)."""
        return Busy(self)

    # -- writing --------------------------------------------------------------------------

    async def write(
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
            raise self.halt(exc) from None
        if consume is not None and self.unread_at_claim is not None:
            self.unread_at_claim.discard(consume)
        self.journal.recorded(stored)
        self.publish_events(stored)
        return stored

    def defer(self, event: Event) -> None:
        """Write ``event`` with the tick's next write (see :meth:`Writer.defer`)."""
        self.writer.defer(event)

    def publish(self, item: dict[str, object]) -> None:
        if self.deps.live is not None:
            self.deps.live(self.run_id, item)

    def publish_events(self, events: Sequence[Event]) -> None:
        for event in events:
            self.publish({"type": "event", "event": event})

    def event(
        self, stream: str, pos: int, gen: int, digest: str, payload: Payload, done: bool = False
    ) -> Event:
        """A step's event, stamped."""
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

    def run_event(self, payload: Payload) -> Event:
        """A run-level event, stamped."""
        terminal = payload.TYPE in ("RunCompleted", "RunFailed", "RunCancelled")
        return make_event(
            self.run_id,
            payload,
            slot=end_slot(self.journal.retries) if terminal else None,
            code_version=self.code_version,
            worker_id=self.deps.worker_id,
            created_at=self.clock.now(),
        )

    # -- decisions: the journal answers, the state stamps and writes -----------------------

    def ask(
        self, stream: str, pos: int, kind: StepKind, digest: str, reusable: bool = True
    ) -> Replay | Run:
        """Replay, or run live (after superseding the stream from here if the recorded step
        differs). Runs synchronously at call time, so answers follow call order.
        ``reusable``: :func:`toren.core.contract.policy.tool_reusable` for a tool call."""
        if self._abort is not None:
            raise self._abort
        answer = self.journal.request(
            stream,
            pos,
            kind,
            digest,
            code_version=self.code_version,
            live_versions=self.live_versions,
            reusable=reusable,
        )
        if isinstance(answer, Replay):
            if self.deps.live is not None:  # watchers mark the step replayed (free)
                step = answer.step
                self.publish(
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

    def end_stream(self, ctx: Context) -> None:
        """New code ended the stream earlier than the log: the extra steps are superseded."""
        answer = self.journal.end_stream(
            ctx.stream,
            ctx.positions_taken,
            code_version=self.code_version,
            live_versions=self.live_versions,
        )
        if isinstance(answer, BackOff):
            raise self._backing_off(answer)
        if answer is not None:
            self._supersede(answer)

    def _backing_off(self, answer: BackOff) -> BackingOff:
        abort = BackingOff(answer.newer_version)
        self.stop(abort)
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
            raise self.halt(exc) from None
        self.journal.recorded(stored)
        self.publish_events(stored)

    # -- the invalidation-storm guard's input ----------------------------------------------

    async def load_live_versions(self) -> None:
        if not self.deps.settings.storm_guard:
            return
        workers = await self.store.live_workers(
            now=self.clock.now(), ttl=self.deps.settings.worker_ttl
        )
        started = self.deps.worker_started_at
        self.live_versions = LiveVersions(
            newest_start_by_version(workers),
            started_at=started if started is not None else self.clock.now(),
        )

    # -- results --------------------------------------------------------------------------

    def result(self, status: TickStatus, **kw: Any) -> TickResult:
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


def unread_at_claim(lease: Lease) -> set[int] | None:
    """The ids of the messages the lease's claim saw unconsumed in the run's inbox, when
    it saw them all (none, or the one it read: ``Lease.message``); None when it did not
    (more than one, one left out of the lease, or a lease made without that read)."""
    if lease.unread == 0:
        return set()
    if lease.unread == 1 and lease.message is not None:
        return {lease.message.id}
    return None
