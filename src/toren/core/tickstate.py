"""The state of one tick, and what every step stands on: ordered writes to the log,
the replay decision taken at call time (with honest invalidation), and the
invalidation-storm guard. The steps themselves are in :mod:`toren.core.steps`; the drive
(load, replay, park, finish) in :mod:`toren.core.tick`.
"""

from __future__ import annotations

import asyncio
import bisect
import gc
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from toren.config import Settings
from toren.core.clock import Clock, SystemClock
from toren.core.context import Context, RunUsage
from toren.core.digest import (
    HashCache,
)
from toren.core.events import (
    ChildStarted,
    Event,
    ModelCallRecorded,
    Payload,
    StreamInvalidated,
    ToolCallRecorded,
    ValueRecorded,
    make_event,
)
from toren.core.fencing import LeaseFence
from toren.core.ports import JournalStore, ModelProvider
from toren.core.program import AgentProgram, AgentResolver, Limits, Pricing, raised
from toren.core.records import Lease, RunDelta, RunRecord, WorkerInfo
from toren.core.replay import (
    Invalidate,
    Live,
    Replay,
    RunLog,
    Step,
    decide,
    descendants,
    end_slot,
    invalidation_slot,
    step_slot,
)
from toren.core.text import repair, repair_text
from toren.core.values import to_nano
from toren.errors import (
    LeaseLost,
    RunCancelledSignal,
    StepFailed,
    StorageError,
    TorenError,
)

if TYPE_CHECKING:
    from toren.core.ports import Telemetry

log = logging.getLogger("toren.tick")

LiveFeed = Callable[[str, dict[str, Any]], None]  # (run_id, item) -> None; never blocks


@dataclass
class TickDeps:
    """Everything one tick needs, injected, so a tick is testable with fakes."""

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


@dataclass(frozen=True)
class TickResult:
    run_id: str
    status: str  # completed failed cancelled waiting backed_off drained lease_lost deferred error
    output: Any = None
    error: dict[str, Any] | None = None
    not_before: float | None = None
    replayed: int = 0
    executed: int = 0
    invalidations: int = 0


FLUSH_INTERVAL = 1.0  # seconds between run-row total updates within a tick


class _Pending:
    """Totals not yet written to the run row. The run row is a cache of the log: during a
    tick it is updated at most once a second (and at release), which keeps the commit of
    each step to the event row itself; a tick starts by correcting the row from the log,
    so totals lost with a crashed worker come back."""

    __slots__ = ("cost", "input", "invalidations", "output", "saved", "steps")

    def __init__(self) -> None:
        self.input = self.output = self.cost = self.saved = self.steps = 0
        self.invalidations = 0

    def add(self, delta: RunDelta) -> None:
        self.input += delta.input_tokens
        self.output += delta.output_tokens
        self.cost += delta.cost_nanousd
        self.saved += delta.saved_nanousd
        self.steps += delta.steps
        self.invalidations += delta.invalidations

    def take(self, code_version: str) -> RunDelta:
        delta = RunDelta(
            input_tokens=self.input,
            output_tokens=self.output,
            cost_nanousd=self.cost,
            saved_nanousd=self.saved,
            steps=self.steps,
            invalidations=self.invalidations,
            code_version=code_version,
        )
        self.__init__()  # type: ignore[misc]
        return delta


def log_totals(events: Sequence[Event]) -> RunDelta:
    """What the run row's totals should be, from the log alone."""
    return UsageBySeq(events).final()


def _usage_of(event: Event) -> tuple[int, int, int] | None:
    """(input tokens, output tokens, cost nano-USD) of a step event that counts as a step
    in the run's totals; None for any other event."""
    payload = event.payload
    if isinstance(payload, ModelCallRecorded):
        return payload.input_tokens, payload.output_tokens, to_nano(payload.cost_usd)
    if isinstance(payload, (ToolCallRecorded, ValueRecorded)):
        return 0, 0, 0
    return None


class UsageBySeq:
    """The run's usage totals as they stood after each event of the log (by seq): what a
    live run saw at a point of its code, so that replay can show the same. ``ctx.usage``
    read during replay must not be the final total, or agent code deciding on it (a
    budget) would take another branch on replay than it took live."""

    __slots__ = ("invalidations", "seqs", "totals")

    def __init__(self, events: Sequence[Event]) -> None:
        self.seqs: list[int] = []
        self.totals: list[tuple[int, int, int, int]] = []
        self.invalidations = 0
        for event in events:
            self.add(event)

    def add(self, event: Event) -> None:
        """Count one more event (its seq above every one counted so far)."""
        used = _usage_of(event)
        if used is not None:
            i, o, c, steps = self.spent()
            self.seqs.append(event.seq)
            self.totals.append((i + used[0], o + used[1], c + used[2], steps + 1))
        elif isinstance(event.payload, StreamInvalidated):
            self.invalidations += 1

    def final(self) -> RunDelta:
        """The totals of the whole log (what the run row should hold)."""
        i, o, c, steps = self.spent()
        return RunDelta(
            input_tokens=i,
            output_tokens=o,
            cost_nanousd=c,
            steps=steps,
            invalidations=self.invalidations,
        )

    def spent(self) -> tuple[int, int, int, int]:
        """(input tokens, output tokens, cost nano-USD, steps) of every event counted."""
        return self.totals[-1] if self.totals else (0, 0, 0, 0)

    def at(self, seq: int) -> tuple[int, int, int, int]:
        """The totals after every event up to ``seq``."""
        n = bisect.bisect_right(self.seqs, seq)
        return self.totals[n - 1] if n else (0, 0, 0, 0)


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


def error_dict(exc: BaseException) -> dict[str, Any]:
    code = exc.code if isinstance(exc, TorenError) else "agent_error"
    message = exc.message if isinstance(exc, TorenError) else str(exc)
    return {"type": type(exc).__name__, "code": code, "message": repair_text(message)}


def recorded_error(cls: type[StepFailed], error: Mapping[str, Any], prefix: str = "") -> StepFailed:
    """Rebuild the exception of a recorded failed step (live or replayed alike)."""
    details = {k: v for k, v in error.items() if k != "message"}
    return cls(prefix + str(error.get("message", "step failed")), **details)


def json_value(value: Any, what: str) -> Any:
    """A plain JSON copy of a value produced by agent code or a tool, as it is recorded:
    strings that are not valid Unicode repaired (see toren.core.text)."""
    try:
        return repair(json.loads(json.dumps(value)))
    except RecursionError:
        raise TypeError(
            f"{what} is nested too deeply to record (objects and arrays inside each other "
            "about a thousand levels deep); return a flatter value"
        ) from None
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} is not JSON-serialisable ({exc}); return dicts, lists, strings, "
            "numbers, booleans or None"
        ) from None


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
        if s._draining:  # no new live work; wait here to be released
            s._wake.set()
            await asyncio.Future()
        if s.fence.due():  # stalled near or past the lease: prove it before the effect
            await s._prove_lease()
        s.end_replay()  # the first live step: replay is over
        s._inflight += 1

    async def __aexit__(self, *exc: object) -> None:
        s = self.state
        s._inflight -= 1
        if s._inflight == 0 and (s._waiters or s._draining):
            s._wake.set()


class TickState:
    """The state of one tick. Contexts call into it; :meth:`run` drives it."""

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
        self.hashes = HashCache()
        self.log = RunLog(lease.run_id)
        self.code_version = deps.code_version or "dev"
        self.record: RunRecord | None = None
        self._known_blobs: set[str] = set()
        # Per stream: the message hashes of its last model request and their list node.
        self._lists: dict[str, tuple[list[str], str]] = {}
        self._lock = asyncio.Lock()
        self._inbox = asyncio.Lock()  # taking a message: see Steps._await_message
        self._barrier: asyncio.Task[Any] | None = None
        self._inflight = 0
        self._waiters: list[tuple[float | None, tuple[str, ...]]] = []
        self._parked: list[tuple[float | None, tuple[str, ...]]] = []
        self._park_futures: set[asyncio.Future[None]] = set()  # what parked branches await
        self._wake = asyncio.Event()
        self._abort: _Abort | None = None
        self._task: asyncio.Task[Any] | None = None
        # The log's usage totals by seq, extended by every event this tick writes: their
        # end is what the run has spent (the budget); ctx.usage reads them as of the
        # highest seq this tick has seen, a step replayed or an event written. Not a replay
        # flag: the replay phase ends at the first live step, while a concurrent branch may
        # still be replaying.
        self._usage_by_seq = UsageBySeq(())
        self._seen_seq = 0
        self._pending = _Pending()
        self._next_flush = 0.0
        self._interrupted = False
        self._live_versions: dict[str, float] = {}
        self.replayed = self.executed = self.invalidations = 0
        self._draining = False
        self._replaying = False
        self.releasing = False  # giving the run back: the lease is let go on purpose

    # -- public controls ------------------------------------------------------------------

    def begin_replay(self) -> None:
        if not self._replaying:
            self._replaying = True
            ReplayGcPause.begin()

    def end_replay(self) -> None:
        if self._replaying:
            self._replaying = False
            ReplayGcPause.end()

    def cancel(self) -> None:
        self._stop(_Cancel("cancelled"))

    def lose_lease(self, why: str) -> None:
        """Another worker holds the run now (this one's lease ran out): stop at once, so a
        step in flight here is not paid for twice; nothing more can be written anyway."""
        self._stop(_LeaseGone(LeaseLost(why)))

    def begin_drain(self) -> None:
        """Graceful drain: start no new live step; steps in flight finish and are recorded,
        then the run is released (the next worker replays them for free)."""
        self._draining = True
        self._wake.set()

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
        self._wake.set()

    def usage(self) -> RunUsage:
        """The run's usage as agent code sees it at this point: the log's totals as they
        stood at the last step replayed or event written (what the live run saw here).
        Once the tick writes, that is everything spent so far. A branch still replaying
        while another already runs live (``asyncio.gather``) sees its own replay position,
        not the totals the live branch has made current."""
        i, o, c, s = self._usage_by_seq.at(self._seen_seq)
        return RunUsage(i, o, Decimal(c) / Decimal(10**9), s)

    def limits(self, program: AgentProgram) -> Limits:
        """The program's limits, raised where a retry of this run raised them (never
        lowered, and a limit the agent does not set stays unset)."""
        return raised(program.limits, self.log.raised_limits)

    # -- writing --------------------------------------------------------------------------

    async def _write(
        self,
        events: Sequence[Event],
        *,
        blobs: Mapping[str, str] | None = None,
        delta: RunDelta | None = None,
        consume: int | None = None,
    ) -> list[Event]:
        barrier = self._barrier
        if barrier is not None and not barrier.done():
            await asyncio.shield(barrier)
        if delta is not None:
            self._pending.add(delta)
        try:
            async with self._lock:
                stored = await self.store.append(
                    self.lease,
                    events,
                    blobs=blobs,
                    delta=self._due_delta(),
                    consume_inbox=consume,
                    now=self.clock.now(),
                )
                if self.record is not None and self.record.blocked_error is not None:
                    # The first step written since the run was blocked: it moves again.
                    self.record = replace(self.record, blocked_error=None)
                    await self.store.clear_blocked(self.lease, now=self.clock.now())
        except (LeaseLost, StorageError) as exc:
            raise self._halt(exc) from None
        for event in stored:
            self.log.apply(event)
            self._usage_by_seq.add(event)
            self._seen_seq = max(self._seen_seq, event.seq)
        self._publish_events(stored)
        return stored

    def _due_delta(self) -> RunDelta | None:
        """The pending totals, when it is time to write them to the run row."""
        now = time.monotonic()
        if now < self._next_flush:
            return None
        self._next_flush = now + FLUSH_INTERVAL
        return self._pending.take(self.code_version)

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
            slot=step_slot(stream, gen, pos, done, self.log.retries),
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
            slot=end_slot(self.log.retries) if terminal else None,
            code_version=self.code_version,
            worker_id=self.deps.worker_id,
            created_at=self.clock.now(),
        )

    def _busy(self) -> _Busy:
        """``async with self._busy():`` around a live step's work (see :class:`_Busy`)."""
        return _Busy(self)

    # -- decisions ------------------------------------------------------------------------

    def _decide(self, stream: str, pos: int, kind: str, digest: str) -> tuple[Replay | Live, int]:
        """Replay, or run live (after invalidating the stream from here if the recorded step
        differs). Runs synchronously at call time, so decisions follow call order."""
        if self._abort is not None:
            raise self._abort
        view = self.log.stream(stream)
        decision = decide(view, pos, kind, digest)
        if isinstance(decision, Replay):
            step = decision.step
            self._seen_seq = max(self._seen_seq, (step.done or step.first).seq)
            if self.deps.live is not None:  # watchers mark the step replayed (free)
                self._publish(
                    {"type": "replayed", "stream": stream, "position": pos, "seq": step.first.seq}
                )
        elif isinstance(decision, Invalidate):
            self._invalidate(
                stream,
                pos,
                expected=decision.expected,
                actual_kind=kind,
                actual_digest=digest,
            )
            return Live(), view.generation
        return decision, view.generation

    def _invalidate(
        self,
        stream: str,
        from_pos: int,
        *,
        expected: Step | None,
        actual_kind: str | None,
        actual_digest: str | None,
    ) -> None:
        view = self.log.stream(stream)
        suffix = [s for p, s in sorted(view.steps.items()) if p >= from_pos]
        self._guard(suffix)
        children = [
            s.first.payload.child_stream
            for s in suffix
            if isinstance(s.first.payload, ChildStarted)
        ]
        if expected is None:
            cause = "stream_ended"
        elif expected.kind != actual_kind:
            cause = "kind_mismatch"
        else:
            cause = "digest_mismatch"
        events = [
            self._invalidation(
                stream,
                view.generation,
                StreamInvalidated(
                    from_pos=from_pos,
                    expected_digest=expected.digest if expected else None,
                    actual_digest=actual_digest,
                    expected_kind=expected.kind if expected else None,
                    actual_kind=actual_kind,
                    code_version=self.code_version,
                    cause=cause,
                ),
            )
        ]
        view.truncate(from_pos)
        for child in descendants(self.log, children):
            child_view = self.log.stream(child)
            if not child_view.steps:
                continue
            self._guard(list(child_view.steps.values()))
            events.append(
                self._invalidation(
                    child,
                    child_view.generation,
                    StreamInvalidated(
                        from_pos=0,
                        code_version=self.code_version,
                        cause="parent_invalidated",
                    ),
                )
            )
            child_view.truncate(0)
        self.invalidations += len(events)
        log.info(
            "run %s: stream %r invalidated from position %d (%s) by code version %s",
            self.run_id,
            stream,
            from_pos,
            cause,
            self.code_version,
        )
        # Written in order before any later write of this run (see _write's barrier).
        previous = self._barrier
        self._barrier = asyncio.ensure_future(self._write_invalidation(previous, events))

    async def _write_invalidation(
        self, previous: asyncio.Task[Any] | None, events: list[Event]
    ) -> None:
        if previous is not None and not previous.done():
            await asyncio.shield(previous)
        try:
            self._pending.invalidations += len(events)
            async with self._lock:
                stored = await self.store.append(
                    self.lease, events, delta=self._due_delta(), now=self.clock.now()
                )
        except (LeaseLost, StorageError) as exc:
            raise self._halt(exc) from None
        self._publish_events(stored)

    def _invalidation(self, stream: str, gen: int, payload: StreamInvalidated) -> Event:
        return make_event(
            self.run_id,
            payload,
            stream=stream,
            generation=gen,
            slot=invalidation_slot(stream, gen),
            code_version=self.code_version,
            worker_id=self.deps.worker_id,
            created_at=self.clock.now(),
        )

    def _end_stream(self, ctx: Context) -> None:
        """New code ended the stream earlier than the log: the extra steps are superseded."""
        view = self.log.stream(ctx.stream)
        if view.length > ctx.positions_taken:
            self._invalidate(
                ctx.stream, ctx.positions_taken, expected=None, actual_kind=None, actual_digest=None
            )

    # -- the invalidation-storm guard -----------------------------------------------------

    async def _load_live_versions(self) -> None:
        workers = await self.store.live_workers(
            now=self.clock.now(), ttl=self.deps.settings.worker_ttl
        )
        self._live_versions = newest_start_by_version(workers)

    def _guard(self, suffix: Sequence[Step]) -> None:
        """During a rolling deploy the current deploy wins: the code version whose live
        workers started most recently. Never overwrite a suffix written by a newer live
        version; back off instead, so versions do not fight over a stream."""
        if not self.deps.settings.storm_guard:
            return
        mine = self._live_versions.get(self.code_version)
        if mine is None:
            mine = self.deps.worker_started_at or self.clock.now()
        for version in {s.code_version for s in suffix} - {self.code_version}:
            theirs = self._live_versions.get(version)
            if theirs is not None and theirs > mine:
                abort = _BackOff(version)
                self._stop(abort)
                raise abort


def _tool_refs(event: Event) -> list[str]:
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
