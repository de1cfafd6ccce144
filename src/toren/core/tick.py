"""The tick: one scheduling of a run on a worker.

Load the run's events, fold them (:mod:`toren.core.replay`), re-execute the agent code
from the start resolving each step from the log, then execute live steps (each committed
before the code continues) until the run completes, fails, waits, is cancelled, backs off
or loses its lease. The pure decisions live in ``replay``; this module is the driver that
does the I/O around them, with everything it needs injected through :class:`TickDeps`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import random as _random
import time
import uuid as _uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from toren.config import Settings
from toren.core.clock import Clock, SystemClock
from toren.core.context import Context, RunUsage
from toren.core.digest import (
    HashCache,
    HashedRequest,
    canonical_json,
    message_list_node,
    semantic_params,
)
from toren.core.events import (
    ChildCompleted,
    ChildStarted,
    Event,
    MessageReceived,
    ModelCallRecorded,
    Payload,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunWaiting,
    StreamInvalidated,
    TimerFired,
    TimerScheduled,
    ToolCallRecorded,
    ValueRecorded,
    make_event,
)
from toren.core.program import AgentProgram, AgentResolver, Pricing, ToolDef
from toren.core.replay import (
    Invalidate,
    Live,
    Replay,
    RunLog,
    Step,
    decide,
    descendants,
    invalidation_slot,
    reusable_tool,
    step_slot,
)
from toren.errors import (
    AgentNotFound,
    InfrastructureError,
    LeaseLost,
    LimitExceeded,
    ModelCallFailed,
    ProviderUnavailable,
    RunCancelledSignal,
    RunNotFound,
    StepFailed,
    ToolFailed,
    TorenError,
)
from toren.providers.base import ModelProvider, ModelRequest, ModelResponse, ToolSpec, Usage
from toren.store.base import Lease, Release, RunDelta, RunRecord, Store, WorkerInfo, to_nano

if TYPE_CHECKING:
    from toren.agents.telemetry import Telemetry

log = logging.getLogger("toren.tick")

LiveFeed = Callable[[str, dict[str, Any]], None]  # (run_id, item) -> None; never blocks


@dataclass
class TickDeps:
    """Everything one tick needs, injected, so a tick is testable with fakes."""

    store: Store
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
    i = o = c = steps = inv = 0
    for event in events:
        payload = event.payload
        if isinstance(payload, ModelCallRecorded):
            i += payload.input_tokens
            o += payload.output_tokens
            c += to_nano(payload.cost_usd)
            steps += 1
        elif isinstance(payload, (ToolCallRecorded, ValueRecorded)):
            steps += 1
        elif isinstance(payload, StreamInvalidated):
            inv += 1
    return RunDelta(input_tokens=i, output_tokens=o, cost_nanousd=c, steps=steps, invalidations=inv)


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


def error_dict(exc: BaseException) -> dict[str, Any]:
    code = exc.code if isinstance(exc, TorenError) else "agent_error"
    message = exc.message if isinstance(exc, TorenError) else str(exc)
    return {"type": type(exc).__name__, "code": code, "message": message}


def recorded_error(cls: type[StepFailed], error: Mapping[str, Any], prefix: str = "") -> StepFailed:
    """Rebuild the exception of a recorded failed step (live or replayed alike)."""
    details = {k: v for k, v in error.items() if k != "message"}
    return cls(prefix + str(error.get("message", "step failed")), **details)


def _json_value(value: Any, what: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} is not JSON-serialisable ({exc}); return dicts, lists, strings, "
            "numbers, booleans or None"
        ) from None


class TickRunner:
    """The state of one tick. Contexts call into it; :meth:`run` drives it."""

    def __init__(self, deps: TickDeps, lease: Lease) -> None:
        self.deps = deps
        self.lease = lease
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
        self._barrier: asyncio.Task[Any] | None = None
        self._inflight = 0
        self._waiters: list[tuple[float | None, tuple[str, ...]]] = []
        self._parked: list[tuple[float | None, tuple[str, ...]]] = []
        self._wake = asyncio.Event()
        self._abort: _Abort | None = None
        self._task: asyncio.Task[Any] | None = None
        self._usage = [0, 0, 0, 0]  # input tokens, output tokens, cost nano-USD, steps
        self._pending = _Pending()
        self._next_flush = 0.0
        self._interrupted = False
        self._live_versions: dict[str, float] = {}
        self.replayed = self.executed = self.invalidations = 0
        self._draining = False

    # -- public controls ------------------------------------------------------------------

    def cancel(self) -> None:
        self._stop(_Cancel("cancelled"))

    def begin_drain(self) -> None:
        """Graceful drain: start no new live step; steps in flight finish and are recorded,
        then the run is released (the next worker replays them for free)."""
        self._draining = True
        self._wake.set()

    def drain(self) -> None:
        """Hard drain (the drain window ran out): abandon steps still in flight; they have
        no event, so they run again elsewhere (at-least-once for those steps only)."""
        self._stop(_Drain("worker draining"))

    def _stop(self, abort: _Abort) -> None:
        if self._abort is None:
            self._abort = abort
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._wake.set()

    def usage(self) -> RunUsage:
        i, o, c, s = self._usage
        return RunUsage(i, o, Decimal(c) / Decimal(10**9), s)

    # -- the drive ------------------------------------------------------------------------

    async def run(self) -> TickResult:
        run = await self.store.get_run(self.run_id)
        if run is None:
            raise RunNotFound(f"no run with id {self.run_id!r}")
        self.record = run
        self._usage = [run.input_tokens, run.output_tokens, run.cost_nanousd, run.steps]
        try:
            program = self.deps.agents.resolve(run.agent, run.process)
        except AgentNotFound as exc:
            return await self._defer(exc)
        self.code_version = self.deps.code_version or program.code_version
        events = await self.store.load_events(self.run_id)
        self._correct_totals(run, events)
        self.log = RunLog.fold(self.run_id, events)
        self._known_blobs = {h for e in events for h in _tool_refs(e)}
        self._interrupted = (
            self.lease.recovered
            or self.lease.previous_status == "running"
            or (run.code_version is not None and run.code_version != self.code_version)
        )
        if self.log.terminal is not None:  # finished, but the row was not updated
            return await self._finish_from_log()
        if run.cancel_requested:
            return await self._finish_cancelled()
        if any(e.code_version != self.code_version for e in events if e.digest):
            await self._load_live_versions()
        root = Context(self, run.process, program, run.input)
        telemetry = self.deps.telemetry
        with (
            telemetry.run_span(
                self.run_id, agent=run.agent, process=run.process, code_version=self.code_version
            )
            if telemetry is not None
            else contextlib.nullcontext()
        ):
            self._task = asyncio.ensure_future(self._main(root))
            await self._drive()
            return await self._conclude()

    def _correct_totals(self, run: RunRecord, events: Sequence[Event]) -> None:
        truth = log_totals(events)
        self._pending.add(
            RunDelta(
                input_tokens=truth.input_tokens - run.input_tokens,
                output_tokens=truth.output_tokens - run.output_tokens,
                cost_nanousd=truth.cost_nanousd - run.cost_nanousd,
                steps=truth.steps - run.steps,
                invalidations=truth.invalidations - run.invalidations,
            )
        )
        self._usage = [truth.input_tokens, truth.output_tokens, truth.cost_nanousd, truth.steps]

    async def _main(self, ctx: Context) -> Any:
        output = await ctx.program.fn(ctx, ctx.input)
        self._end_stream(ctx)
        return _json_value(output, f"the output of run {self.run_id!r}")

    async def _drive(self) -> None:
        assert self._task is not None
        while not self._task.done():
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            await asyncio.wait({self._task, woken}, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            if self._task.done() or self._abort is not None:
                break
            if self._draining and self._inflight == 0:
                self._stop(_Drain("worker draining"))
                break
            if self._parkable():
                # Let steps that just resolved run on before deciding the run is idle.
                for _ in range(8):
                    await asyncio.sleep(0)
                if self._parkable() and not self._task.done():
                    # Snapshot first: cancelling the agent task unwinds the waiters.
                    self._parked = list(self._waiters)
                    self._stop(_Park("waiting"))
        with contextlib.suppress(BaseException):
            await self._task

    def _parkable(self) -> bool:
        return bool(self._waiters) and self._inflight == 0

    async def _conclude(self) -> TickResult:
        assert self._task is not None
        abort = self._abort
        if isinstance(abort, _LeaseGone):
            return self._result("lease_lost", error=error_dict(abort.cause))
        if isinstance(abort, _Cancel):
            return await self._finish_cancelled()
        if isinstance(abort, _Drain):
            return await self._release_running("drained", None)
        if isinstance(abort, _BackOff):
            return await self._back_off(abort)
        if isinstance(abort, _Park):
            return await self._park_release()
        exc = self._task.exception() if not self._task.cancelled() else None
        if self._task.cancelled():
            return await self._release_running("drained", None)
        if exc is None:
            output = self._task.result()
            await self._release(
                Release("completed", output=output, events=[self._run_event(RunCompleted(output))])
            )
            return self._result("completed", output=output)
        if isinstance(exc, InfrastructureError):
            log.error("run %s: infrastructure error, lease left to expire: %s", self.run_id, exc)
            return self._result("error", error=error_dict(exc))
        err = error_dict(exc)
        if not isinstance(exc, TorenError):
            log.warning("run %s failed in agent code", self.run_id, exc_info=exc)
        await self._release(Release("failed", error=err, events=[self._run_event(RunFailed(err))]))
        return self._result("failed", error=err)

    def _result(self, status: str, **kw: Any) -> TickResult:
        return TickResult(
            self.run_id,
            status,
            replayed=self.replayed,
            executed=self.executed,
            invalidations=self.invalidations,
            **kw,
        )

    # -- releasing the run ----------------------------------------------------------------

    async def _release(self, release: Release) -> list[Event]:
        barrier = self._barrier
        if barrier is not None and not barrier.done():
            with contextlib.suppress(BaseException):
                await barrier
        async with self._lock:
            release = Release(
                **{**release.__dict__, "delta": self._pending.take(self.code_version)}
            )
            stored = await self.store.release(self.lease, release, now=self.clock.now())
        self._publish_events(stored)
        self._publish({"type": "status", "status": release.status})
        return stored

    async def _park_release(self) -> TickResult:
        deadlines = [d for d, _ in self._parked if d is not None]
        not_before = min(deadlines) if deadlines else None
        names = sorted({n for _, ns in self._parked for n in ns})
        event = self._run_event(RunWaiting(not_before=not_before, messages=names))
        await self._release(
            Release("waiting", not_before=not_before, waiting_for=names, events=[event])
        )
        return self._result("waiting", not_before=not_before)

    async def _release_running(self, status: str, not_before: float | None) -> TickResult:
        await self._release(Release("running", not_before=not_before))
        return self._result(status, not_before=not_before)

    async def _back_off(self, abort: _BackOff) -> TickResult:
        not_before = self.clock.now() + self.deps.settings.drain_window
        log.warning(
            "worker %s (code version %s) backs off run %s: its stream was written by newer "
            "live code version %s; retrying after the drain window (%.0fs)",
            self.deps.worker_id,
            self.code_version,
            self.run_id,
            abort.newer_version,
            self.deps.settings.drain_window,
        )
        return await self._release_running("backed_off", not_before)

    async def _defer(self, exc: AgentNotFound) -> TickResult:
        """This worker does not know the run's agent (a rolling deploy may add it): give
        the run back for later instead of failing it. Nothing is lost."""
        not_before = self.clock.now() + self.deps.settings.drain_window
        log.error("run %s deferred: %s", self.run_id, exc.message)
        await self.store.release(
            self.lease,
            Release("queued", not_before=not_before, error=error_dict(exc)),
            now=self.clock.now(),
        )
        return self._result("deferred", error=error_dict(exc), not_before=not_before)

    async def _finish_cancelled(self) -> TickResult:
        event = self._run_event(RunCancelled(reason="cancel requested"))
        await self._release(Release("cancelled", events=[event]))
        return self._result("cancelled")

    async def _finish_from_log(self) -> TickResult:
        terminal = self.log.terminal
        assert terminal is not None
        status = {"RunCompleted": "completed", "RunFailed": "failed"}.get(
            terminal.type, "cancelled"
        )
        payload = terminal.payload
        output = payload.output if isinstance(payload, RunCompleted) else None
        error = payload.error if isinstance(payload, RunFailed) else None
        await self._release(Release(status, output=output, error=error))
        return self._result(status, output=output, error=error)

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
        except LeaseLost as exc:
            self._stop(_LeaseGone(exc))
            raise _LeaseGone(exc) from None
        for event in stored:
            self.log.apply(event)
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
            slot=step_slot(stream, gen, pos, done),
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
            slot="run:end" if terminal else None,
            code_version=self.code_version,
            worker_id=self.deps.worker_id,
            created_at=self.clock.now(),
        )

    @contextlib.asynccontextmanager
    async def _busy(self) -> AsyncIterator[None]:
        if self._draining:  # no new live work; wait here to be released
            self._wake.set()
            await asyncio.Future()
        self._inflight += 1
        try:
            yield
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self._wake.set()

    # -- decisions ------------------------------------------------------------------------

    def _decide(self, stream: str, pos: int, kind: str, digest: str) -> tuple[Replay | Live, int]:
        """Replay, or run live (after invalidating the stream from here if the recorded step
        differs). Runs synchronously at call time, so decisions follow call order."""
        if self._abort is not None:
            raise self._abort
        view = self.log.stream(stream)
        decision = decide(view, pos, kind, digest)
        if isinstance(decision, Invalidate):
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
        except LeaseLost as exc:
            self._stop(_LeaseGone(exc))
            raise _LeaseGone(exc) from None
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

    # -- steps ----------------------------------------------------------------------------

    def model_step(
        self,
        ctx: Context,
        pos: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> Awaitable[ModelResponse]:
        decision, gen = self._decide(ctx.stream, pos, "model", hashed.digest)
        if isinstance(decision, Replay):
            return self._replay_model(ctx.stream, decision.step, hashed)
        return self._live_model(ctx, pos, gen, hashed, request, on_delta)

    async def _replay_model(self, stream: str, step: Step, hashed: HashedRequest) -> ModelResponse:
        payload = step.first.payload
        assert isinstance(payload, ModelCallRecorded)
        if payload.message_list is not None:
            self._lists[stream] = (hashed.messages, payload.message_list)
        self.replayed += 1
        if self._interrupted:
            self._pending.saved += to_nano(payload.cost_usd)
        if payload.error is not None:
            raise recorded_error(ModelCallFailed, payload.error)
        return ModelResponse.from_dict(payload.response or {})

    def _provider(self, name: str, program: AgentProgram) -> ModelProvider:
        provider = program.providers.get(name) or self.deps.providers.get(name)
        if provider is None:
            known = sorted({*program.providers, *self.deps.providers})
            raise ProviderUnavailable(
                f"no model provider {name!r} is configured for agent {program.agent!r}; "
                f"configured providers: {known or 'none'}"
            )
        return provider

    def _check_budget(self, program: AgentProgram) -> None:
        limit = program.limits.max_cost_usd
        if limit is not None and self._usage[2] >= to_nano(limit):
            raise LimitExceeded(
                f"run {self.run_id!r} has spent ${self.usage().cost_usd} of its "
                f"${limit} budget (limits.max_cost_usd); no further model calls are made"
            )

    async def _live_model(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        hashed: HashedRequest,
        request: ModelRequest,
        on_delta: Callable[[str], None] | None,
    ) -> ModelResponse:
        async with self._busy():
            self._check_budget(ctx.program)
            provider = self._provider(request.provider, ctx.program)

            def delta(text: str) -> None:
                self._publish(
                    {"type": "delta", "stream": ctx.stream, "position": pos, "text": text}
                )
                if on_delta is not None:
                    on_delta(text)

            started = time.perf_counter()
            response: ModelResponse | None = None
            error: dict[str, Any] | None = None
            try:
                response = await self._timed(
                    provider.complete(request, on_delta=delta), ctx.program, "model call"
                )
            except StepFailed as exc:
                error = {**exc.details, **error_dict(exc)}
            latency = (time.perf_counter() - started) * 1000
            usage = response.usage if response else Usage()
            cost = Decimal(0)
            pricing = ctx.program.pricing or self.deps.pricing
            if pricing is not None and response is not None:
                cost = pricing(f"{request.provider}:{request.model}", usage)
            blobs, list_node = self._new_blobs(ctx.stream, request, hashed)
            payload = ModelCallRecorded(
                provider=request.provider,
                model=request.model,
                message_list=list_node,
                message_count=len(hashed.messages),
                tools=hashed.tools,
                params=semantic_params(request.params),
                response=response.to_dict() if response else None,
                error=error,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                cost_usd=str(cost),
                latency_ms=round(latency, 3),
            )
            nano = to_nano(cost)
            await self._write(
                [self._event(ctx.stream, pos, gen, hashed.digest, payload)],
                blobs=blobs,
                delta=RunDelta(
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cost_nanousd=nano,
                    steps=1,
                    code_version=self.code_version,
                ),
            )
            self._count(usage, nano)
            if self.deps.telemetry is not None:
                self.deps.telemetry.on_model_call(
                    self.run_id,
                    ctx.stream,
                    pos,
                    request,
                    response,
                    latency / 1000,
                    False,
                    error=None if error is None else error["message"],
                    cost_usd=cost,
                )
            if error is not None:
                raise recorded_error(ModelCallFailed, error)
            assert response is not None
            return response

    def _count(self, usage: Usage, nano: int = 0) -> None:
        self.executed += 1
        self._usage[0] += usage.input_tokens
        self._usage[1] += usage.output_tokens
        self._usage[2] += nano
        self._usage[3] += 1

    def _new_blobs(
        self, stream: str, request: ModelRequest, hashed: HashedRequest
    ) -> tuple[dict[str, str], str]:
        """The bodies to store for this request and its message list node. When the
        request extends the stream's previous one (a growing conversation), only the new
        messages and one small node are stored: history is stored once."""
        msgs = hashed.messages
        prev_msgs, prev_node = self._lists.get(stream, ([], None))
        start = 0
        if (
            prev_node is not None
            and len(prev_msgs) <= len(msgs)
            and msgs[: len(prev_msgs)] == prev_msgs
        ):
            start = len(prev_msgs)
        else:
            prev_node = None
        blobs: dict[str, str] = {}
        for key, obj in [
            *zip(msgs[start:], request.messages[start:], strict=True),
            *zip(hashed.tools, request.tools, strict=True),
        ]:
            if key not in self._known_blobs:
                body = self.hashes.take_body(key)
                if body is None:
                    body = canonical_json(obj.to_dict() if isinstance(obj, ToolSpec) else obj)
                blobs[key] = body.decode("utf-8")
                self._known_blobs.add(key)
        node, node_body = message_list_node(prev_node, msgs[start:])
        blobs[node] = node_body
        self._lists[stream] = (msgs, node)
        return blobs, node

    async def _timed(self, aw: Awaitable[Any], program: AgentProgram, what: str) -> Any:
        timeout = program.limits.step_timeout
        if timeout is None:
            return await aw
        try:
            return await asyncio.wait_for(aw, timeout)
        except TimeoutError:
            cls = ModelCallFailed if what == "model call" else ToolFailed
            raise cls(
                f"{what} timed out after {timeout}s (limits.step_timeout)", timeout=timeout
            ) from None

    def tool_step(
        self, ctx: Context, pos: int, digest: str, name: str, args: dict[str, Any]
    ) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "tool", digest)
        if isinstance(decision, Replay):
            return self._replay_tool(decision.step)
        tooldef = ctx.program.tools.get(name)
        reuse = None
        if tooldef is None or not tooldef.reexecute:
            reuse = reusable_tool(self.log, self.log.stream(ctx.stream), digest)
            if reuse is not None:
                self.log.reused_seqs.add(reuse.first.seq)  # claimed now, in call order
        return self._live_tool(ctx, pos, gen, digest, name, args, tooldef, reuse)

    async def _replay_tool(self, step: Step) -> Any:
        payload = step.first.payload
        assert isinstance(payload, ToolCallRecorded)
        self.replayed += 1
        if payload.error is not None:
            raise recorded_error(ToolFailed, payload.error, f"tool {payload.name!r} failed: ")
        return payload.result

    async def _live_tool(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        digest: str,
        name: str,
        args: dict[str, Any],
        tooldef: ToolDef | None,
        reuse: Step | None,
    ) -> Any:
        async with self._busy():
            started = time.perf_counter()
            result: Any = None
            error: dict[str, Any] | None = None
            if reuse is not None:
                reused = reuse.first.payload
                assert isinstance(reused, ToolCallRecorded)
                result = reused.result
            elif tooldef is None:
                error = {
                    "type": "UnknownTool",
                    "code": "unknown_tool",
                    "message": f"agent {ctx.agent!r} has no tool {name!r}; "
                    f"its tools are {sorted(ctx.program.tools)}",
                }
            else:
                try:
                    result = await self._timed(_call_tool(tooldef, args), ctx.program, "tool call")
                    result = _json_value(result, f"the result of tool {name!r}")
                except Exception as exc:
                    error = error_dict(exc)
            payload = ToolCallRecorded(
                name=name,
                args=args,
                result=result,
                error=error,
                latency_ms=round((time.perf_counter() - started) * 1000, 3),
                reused_from_seq=reuse.first.seq if reuse is not None else None,
            )
            await self._write(
                [self._event(ctx.stream, pos, gen, digest, payload)],
                delta=RunDelta(steps=1, code_version=self.code_version),
            )
            self._count(Usage())
            if self.deps.telemetry is not None:
                self.deps.telemetry.on_tool_call(
                    self.run_id,
                    ctx.stream,
                    pos,
                    name,
                    payload.latency_ms / 1000,
                    False,
                    error=None if error is None else error["message"],
                )
            if error is not None:
                raise recorded_error(ToolFailed, error, f"tool {name!r} failed: ")
            return result

    def value_step(self, ctx: Context, pos: int, digest: str, what: str) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "value", digest)
        if isinstance(decision, Replay):
            return self._replay_value(decision.step)
        return self._live_value(ctx, pos, gen, digest, what)

    async def _replay_value(self, step: Step) -> Any:
        payload = step.first.payload
        assert isinstance(payload, ValueRecorded)
        self.replayed += 1
        return payload.value

    async def _live_value(self, ctx: Context, pos: int, gen: int, digest: str, what: str) -> Any:
        async with self._busy():
            if what == "now":
                value: Any = self.clock.now()
            elif what == "random":
                value = _random.random()
            else:
                value = str(_uuid.uuid4())
            await self._write(
                [self._event(ctx.stream, pos, gen, digest, ValueRecorded(what=what, value=value))],
                delta=RunDelta(steps=1),
            )
            self._count(Usage())
            return value

    def sleep_step(self, ctx: Context, pos: int, digest: str, seconds: float) -> Awaitable[None]:
        decision, gen = self._decide(ctx.stream, pos, "sleep", digest)
        if isinstance(decision, Replay):
            step = decision.step
            if step.complete:
                self.replayed += 1
                return _done(None)
            payload = step.first.payload
            assert isinstance(payload, TimerScheduled)
            return self._await_timer(ctx, pos, step.first.generation, digest, payload.fire_at)
        return self._start_timer(ctx, pos, gen, digest, seconds)

    async def _start_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, seconds: float
    ) -> None:
        async with self._busy():
            fire_at = self.clock.now() + seconds
            event = self._event(
                ctx.stream, pos, gen, digest, TimerScheduled(fire_at=fire_at, seconds=seconds)
            )
            await self._write([event])
        await self._await_timer(ctx, pos, gen, digest, fire_at)

    async def _await_timer(
        self, ctx: Context, pos: int, gen: int, digest: str, fire_at: float
    ) -> None:
        async with self._busy():
            while (left := fire_at - self.clock.now()) > 0:
                if left <= self.deps.settings.inline_wait:
                    await self.clock.sleep(left)
                else:
                    await self._park(fire_at, ())
            event = self._event(
                ctx.stream, pos, gen, digest, TimerFired(fired_at=self.clock.now()), done=True
            )
            await self._write([event])
            self.executed += 1

    async def _park(self, not_before: float | None, names: tuple[str, ...]) -> None:
        """Wait for the tick to park the run; never returns (the agent task is cancelled)."""
        entry = (not_before, names)
        self._waiters.append(entry)
        self._inflight -= 1
        if self._inflight == 0:
            self._wake.set()
        try:
            await asyncio.Future()
        finally:
            self._inflight += 1
            self._waiters.remove(entry)

    def message_step(
        self, ctx: Context, pos: int, digest: str, name: str, timeout: float | None
    ) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "message", digest)
        if isinstance(decision, Replay):
            step = decision.step
            if step.complete:
                self.replayed += 1
                done = step.done or step.first
                payload = done.payload
                return _done(payload.payload if isinstance(payload, MessageReceived) else None)
            first = step.first.payload
            assert isinstance(first, TimerScheduled)
            return self._await_message(ctx, pos, step.first.generation, digest, name, first.fire_at)
        return self._start_message_wait(ctx, pos, gen, digest, name, timeout)

    async def _start_message_wait(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, timeout: float | None
    ) -> Any:
        deadline = None
        if timeout is not None:
            async with self._busy():
                deadline = self.clock.now() + timeout
                timer = TimerScheduled(fire_at=deadline, seconds=timeout, purpose="message")
                await self._write([self._event(ctx.stream, pos, gen, digest, timer)])
        return await self._await_message(ctx, pos, gen, digest, name, deadline)

    async def _await_message(
        self, ctx: Context, pos: int, gen: int, digest: str, name: str, deadline: float | None
    ) -> Any:
        two_phase = deadline is not None
        async with self._busy():
            while True:
                message = await self.store.next_message(self.run_id, [name])
                if message is not None:
                    received = MessageReceived(
                        name=name, payload=message.payload, inbox_id=message.id
                    )
                    event = self._event(ctx.stream, pos, gen, digest, received, done=two_phase)
                    await self._write([event], consume=message.id)
                    self.executed += 1
                    return message.payload
                now = self.clock.now()
                if deadline is not None and now >= deadline:
                    fired = TimerFired(fired_at=now)
                    await self._write([self._event(ctx.stream, pos, gen, digest, fired, True)])
                    self.executed += 1
                    return None
                if deadline is not None and deadline - now <= self.deps.settings.inline_wait:
                    await self.clock.sleep(min(deadline - now, self.deps.settings.poll_interval))
                else:
                    await self._park(deadline, (name,))

    def child_step(
        self, ctx: Context, pos: int, digest: str, process: str, input: Any
    ) -> Awaitable[Any]:
        decision, gen = self._decide(ctx.stream, pos, "child", digest)
        if isinstance(decision, Replay):
            step = decision.step
            if step.complete:
                self.replayed += 1
                assert step.done is not None
                done = step.done.payload
                assert isinstance(done, ChildCompleted)
                if done.error is not None:
                    return _fail(recorded_error(StepFailed, done.error))
                return _done(done.output)
            return self._run_child(ctx, pos, step.first.generation, digest, process, input, False)
        return self._run_child(ctx, pos, gen, digest, process, input, True)

    async def _run_child(
        self,
        ctx: Context,
        pos: int,
        gen: int,
        digest: str,
        process: str,
        input: Any,
        live: bool,
    ) -> Any:
        child_stream = f"{ctx.stream}/{pos}"
        program = self.deps.agents.resolve(ctx.agent, process)
        if live:
            started = ChildStarted(process=process, input=input, child_stream=child_stream)
            async with self._busy():
                await self._write([self._event(ctx.stream, pos, gen, digest, started)])
        child = Context(self, child_stream, program, input)
        try:
            output = await program.fn(child, input)
            self._end_stream(child)
            output = _json_value(output, f"the output of child stream {child_stream!r}")
        except (Exception, LimitExceeded) as exc:
            err = error_dict(exc)
            async with self._busy():
                await self._write(
                    [self._event(ctx.stream, pos, gen, digest, ChildCompleted(error=err), True)]
                )
            prefix = f"child process {process!r} (stream {child_stream!r}) failed: "
            raise recorded_error(StepFailed, err, prefix) from exc
        async with self._busy():
            await self._write(
                [self._event(ctx.stream, pos, gen, digest, ChildCompleted(output=output), True)]
            )
        return output


async def _done(value: Any) -> Any:
    return value


async def _fail(exc: BaseException) -> Any:
    raise exc


async def _call_tool(tooldef: ToolDef, args: Mapping[str, Any]) -> Any:
    if inspect.iscoroutinefunction(tooldef.fn):
        return await tooldef.fn(**args)
    result = await asyncio.to_thread(tooldef.fn, **args)
    if inspect.isawaitable(result):
        return await result
    return result


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


async def tick(run_id: str, deps: TickDeps, *, lease: Lease | None = None) -> TickResult:
    """Run one tick of ``run_id``. Without a lease, claim the run first (a run leased by a
    live worker, or not runnable yet, is left alone: status ``not_claimed``)."""
    if lease is None:
        leases = await deps.store.claim(
            deps.worker_id,
            1,
            now=deps.clock.now(),
            ttl=deps.settings.lease.ttl,
            only=run_id,
        )
        if not leases:
            if await deps.store.get_run(run_id) is None:
                raise RunNotFound(f"no run with id {run_id!r}")
            return TickResult(run_id, "not_claimed")
        lease = leases[0]
    return await TickRunner(deps, lease).run()
