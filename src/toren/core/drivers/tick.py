"""The tick: one scheduling of a run on a worker.

Load the run's events, fold them into a :class:`~toren.core.contract.journal.Journal`, re-execute
the agent code from the start resolving each step from the log, then execute live steps
(each committed before the code continues) until the run completes, fails, waits, is
cancelled, backs off or loses its lease.

The tick is one of two drivers over the journal (the other is the dry run of ``toren
plan``). The journal decides (replay, run, supersede, back off) and holds no I/O, with
the step policies beside it (``policy``); the driver does everything else, in composed
parts: the run's state (``tickstate.TickState``: asking, stamping, stopping), its writes
under the lease (``writer.Writer``), parking (``parker.Parker``), the step handlers
(``steps.LiveSteps``: the effects of each kind), and this module: load, drive, release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from toren.core.agent_api.context import Context
from toren.core.agent_api.program import AgentProgram
from toren.core.contract.audit import tail
from toren.core.contract.events import (
    Event,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunWaiting,
)
from toren.core.contract.failures import failed_seqs, failure_dict
from toren.core.contract.journal import NO_GUARD, Journal, log_totals
from toren.core.contract.records import Lease, Release, RunRecord
from toren.core.contract.values import RunStatus, TickStatus, Totals
from toren.core.drivers.aborts import (
    BackingOff,
    Cancelling,
    Draining,
    LeaseGone,
    Parking,
    StoreFailed,
)
from toren.core.drivers.effects import error_dict, json_value, recorded_error
from toren.core.drivers.fencing import LeaseFence, lease_clock
from toren.core.drivers.resume import resumable
from toren.core.drivers.steps import LiveSteps
from toren.core.drivers.tickstate import (
    TickDeps,
    TickResult,
    TickState,
    newest_start_by_version,
    tool_refs,
)
from toren.core.drivers.writer import FLUSH_INTERVAL
from toren.errors import (
    AgentConfigError,
    AgentNotFound,
    InfrastructureError,
    LeaseLost,
    RunNotFound,
    TorenError,
    UserError,
)

log = logging.getLogger("toren.tick")

__all__ = [
    "FLUSH_INTERVAL",
    "TickDeps",
    "TickResult",
    "TickRunner",
    "error_dict",
    "log_totals",
    "newest_start_by_version",
    "recorded_error",
    "tick",
]


class TickRunner:
    """One tick of one run: the driver. It holds the run's state (:class:`TickState`)
    and hands the step handlers (:class:`LiveSteps`, holding the state) to the root
    context, never keeping them; :meth:`run` drives it. The worker controls it through
    :meth:`cancel`, :meth:`lose_lease`, :meth:`begin_drain` and :meth:`drain`."""

    __slots__ = ("_keep", "_next", "_program", "_task", "loop", "state")

    def __init__(self, deps: TickDeps, lease: Lease, *, granted_at: float | None = None) -> None:
        self.state = TickState(deps, lease, granted_at=granted_at)
        self._task: asyncio.Task[Any] | None = None
        self._program: AgentProgram | None = None  # what the agent task runs
        self.loop = asyncio.get_running_loop()
        self._keep = False  # parked with the agent task suspended: keep this tick
        self._next: tuple[Lease, float | None] | None = None  # the lease to continue under

    @classmethod
    def claimed(
        cls, deps: TickDeps, lease: Lease, *, granted_at: float | None = None
    ) -> TickRunner:
        """The tick for a run just claimed: the one this worker kept suspended when the
        run parked (continued under ``lease`` if nothing changed since; see
        :mod:`toren.core.drivers.sticky`), or a new one."""
        kept = deps.sticky.take(lease.run_id) if deps.sticky is not None else None
        if not isinstance(kept, TickRunner) or kept.state.deps is not deps:
            if kept is not None:  # kept under another host's deps
                kept.discard()
            return cls(deps, lease, granted_at=granted_at)
        kept._next = (lease, granted_at)
        return kept

    @property
    def program(self) -> AgentProgram | None:
        return self._program

    def folded_steps(self) -> int:
        """The steps of the run's log this tick's journal holds (the cache's weight)."""
        return sum(
            len(v.steps) + len(v.superseded) for v in self.state.journal.log.streams.values()
        )

    def discard(self) -> None:
        """Cancel a kept tick's suspended agent task (evicted, or not resumable)."""
        self.state.detach()
        self._task = None

    # -- what the worker reads and tells ---------------------------------------------------

    @property
    def run_id(self) -> str:
        return self.state.run_id

    @property
    def lease(self) -> Lease:
        return self.state.lease

    @property
    def fence(self) -> LeaseFence:
        return self.state.fence

    @property
    def releasing(self) -> bool:
        return self.state.releasing

    def cancel(self) -> None:
        self.state.cancel()

    def lose_lease(self, why: str) -> None:
        self.state.lose_lease(why)

    def begin_drain(self) -> None:
        self.state.begin_drain()

    def drain(self) -> None:
        self.state.drain()

    # -- the drive ------------------------------------------------------------------------

    async def run(self) -> TickResult:
        self._keep = False
        if self._next is None:
            self.state.begin_replay()
        try:
            if self._next is not None:
                return await self._continue(*self._next)
            return await self._run()
        except InfrastructureError as exc:  # reading the run or its log, releasing it
            await self._block(exc)
            raise
        finally:
            self._next = None
            self.state.end_replay()
            if self._keep and self.state.deps.sticky is not None:
                self.state.deps.sticky.keep(self)
            else:
                # The agent task (its frames, a cancelled task's traceback) points back
                # at the state, through the root context and its steps: drop it, so the
                # tick and its log are freed at once, by reference counting, not at the
                # cycle collector's next full pass. A task still running (the tick
                # itself was cancelled or failed) is cancelled first, never orphaned.
                self.discard()

    async def _continue(self, lease: Lease, granted_at: float | None) -> TickResult:
        """Continue this kept tick under the run's next lease, or, if anything may have
        changed since it parked, drop it and replay the run as any tick does. If finding
        out fails (the database), the kept tick is dropped too, and this runner stands for
        the new lease: the worker's retry, and the blocking of the run, go by its epoch,
        not by the epoch the run parked under."""
        try:
            run = await resumable(self.state, self._program, lease)
        except BaseException:
            if self.state.deps.sticky is not None:
                self.state.deps.sticky.stale += 1  # taken, not continued: replays next
            self.discard()
            self.state = TickState(self.state.deps, lease, granted_at=granted_at)
            raise
        sticky = self.state.deps.sticky
        if sticky is not None:
            if run is None:
                sticky.stale += 1
            else:
                sticky.continued += 1
        if run is None:
            self.discard()
            self.state = TickState(self.state.deps, lease, granted_at=granted_at)
            self.state.begin_replay()
            return await self._run()
        self.state.rebind(lease, granted_at)
        self.state.writer.record = run
        if self.state.live_versions is not NO_GUARD:
            await self.state.load_live_versions()
        self.state.parker.resume()
        await self._drive()
        return await self._conclude()

    async def _run(self) -> TickResult:
        # The row as the claim left it, when the claim read it (Lease.record).
        run = self.state.lease.record or await self.state.store.get_run(self.run_id)
        if run is None:
            raise RunNotFound(f"no run with id {self.run_id!r}")
        self.state.writer.record = run
        try:
            program = self.state.deps.agents.resolve(run.agent, run.process)
        except (AgentNotFound, AgentConfigError) as exc:
            if run.cancel_requested:  # nothing of the agent is needed to cancel its run
                self.state.writer.chain = tail(await self.state.store.load_events(self.run_id))
                return await self._finish_cancelled()
            return await self._defer(exc)
        self.state.code_version = self.state.deps.code_version or program.code_version
        self._program = program
        events = await self.state.store.load_events(self.run_id, at_least=run.steps)
        self.state.writer.chain = tail(events)
        self.state.journal = Journal.fold(self.run_id, events)
        self._correct_totals(run)
        self.state.bodies.known = {h for e in events for h in tool_refs(e)}
        self.state.interrupted = (
            self.state.lease.recovered
            or self.state.lease.previous_status == RunStatus.RUNNING
            or (run.code_version is not None and run.code_version != self.state.code_version)
            # A fork's first tick replays the history it was copied: that is saved too.
            or (
                self.state.journal.forked is not None
                and self.state.lease.previous_status == RunStatus.QUEUED
            )
        )
        if self.state.journal.terminal is not None:  # finished, but the row was not updated
            return await self._finish_from_log()
        if run.cancel_requested:
            return await self._finish_cancelled()
        if any(e.code_version != self.state.code_version for e in events if e.digest):
            await self.state.load_live_versions()
        # The steps hold the state; neither the state nor this driver keeps them: only the
        # root context does, and only the agent task holds that (see run()'s finally).
        root = Context(LiveSteps(self.state), run.process, program, run.input)
        telemetry = self.state.deps.telemetry
        with (
            telemetry.run_span(
                self.run_id,
                agent=run.agent,
                process=run.process,
                code_version=self.state.code_version,
            )
            if telemetry is not None
            else contextlib.nullcontext()
        ):
            self._task = asyncio.ensure_future(self._main(root))
            self.state.attach(self._task)
            await self._drive()
            return await self._conclude()

    async def _drive(self) -> None:
        assert self._task is not None
        await self.state.parker.drive(
            self._task,
            stopped=lambda: self.state.abort is not None,
            stop=self._stop_for,
            grace=self.state.deps.settings.park_grace,
            run_id=self.run_id,
        )

    def _stop_for(self, why: str) -> None:
        if why == "drain":
            self.state.stop(Draining("worker draining"))
        elif self.state.deps.sticky is not None and self.state.parker.parked:
            self.state.suspend(Parking(RunStatus.WAITING.value))  # kept, if released
        else:
            self.state.stop(Parking(RunStatus.WAITING.value))

    def _correct_totals(self, run: RunRecord) -> None:
        """The run row is a cache of the log: put right what a crashed tick left unsaid."""
        truth = self.state.journal.usage.final()
        self.state.writer.add(
            Totals(
                input_tokens=truth.input_tokens - run.input_tokens,
                output_tokens=truth.output_tokens - run.output_tokens,
                cost_nanousd=truth.cost_nanousd - run.cost_nanousd,
                steps=truth.steps - run.steps,
                invalidations=truth.invalidations - run.invalidations,
            )
        )

    async def _main(self, ctx: Context) -> Any:
        output = await ctx.program.fn(ctx, ctx.input)
        self.state.end_stream(ctx)
        return json_value(output, f"the output of run {self.run_id!r}")

    async def _conclude(self) -> TickResult:
        assert self._task is not None
        abort = self.state.abort
        if isinstance(abort, LeaseGone):
            return self.state.result(TickStatus.LEASE_LOST, error=error_dict(abort.cause))
        if isinstance(abort, StoreFailed):
            return await self._infrastructure_error(abort.cause)
        if isinstance(abort, Cancelling):
            return await self._finish_cancelled()
        if isinstance(abort, Draining):
            return await self._release_running(TickStatus.DRAINED, None)
        if isinstance(abort, BackingOff):
            return await self._back_off(abort)
        if isinstance(abort, Parking):
            return await self._park_release()
        exc = self._task.exception() if not self._task.cancelled() else None
        if self._task.cancelled():
            return await self._release_running(TickStatus.DRAINED, None)
        if exc is None:
            output = self._task.result()
            await self._release(
                Release(
                    RunStatus.COMPLETED,
                    output=output,
                    events=[self.state.run_event(RunCompleted(output))],
                )
            )
            return self.state.result(TickStatus.COMPLETED, output=output)
        if isinstance(exc, InfrastructureError):
            return await self._infrastructure_error(exc)
        err = failure_dict(exc)
        if not isinstance(exc, TorenError):
            log.warning("run %s failed in agent code", self.run_id, exc_info=exc)
        failed = RunFailed(err, failed_seqs=failed_seqs(exc))
        await self._release(
            Release(RunStatus.FAILED, error=err, events=[self.state.run_event(failed)])
        )
        return self.state.result(TickStatus.FAILED, error=err)

    async def _infrastructure_error(self, exc: InfrastructureError) -> TickResult:
        blocked = await self._block(exc)
        return self.state.result(TickStatus.ERROR, error=error_dict(exc), not_before=blocked)

    async def _block(
        self, exc: InfrastructureError | UserError, status: RunStatus = RunStatus.RUNNING
    ) -> float | None:
        """The tick failed for a reason outside the agent's code (no API key, a provider
        SDK missing, the database, an agent this worker cannot load): the run is not
        over. Give it back marked blocked, with the error, the failed ticks in a row and
        the time of the next try (exponential backoff, capped: ``Settings.blocked_retry``),
        so every surface can say why it does not move. If even that write fails (the
        database is down), the lease is left to expire. Whoever watches the run live
        (``toren run``) learns it from the ``stalled`` item. Returns the retry time."""
        if isinstance(exc, LeaseLost):
            return None  # no stall: the run goes on under another worker
        error = error_dict(exc)
        retry_at = None
        if not self.state.releasing:
            self.state.releasing = True
            attempts = (
                self.state.writer.record.blocked_attempts
                if self.state.writer.record is not None
                else 0
            ) + 1
            now = self.state.clock.now()
            retry_at = now + self.state.deps.settings.blocked_retry.delay(attempts)
            try:
                attempts = await self.state.store.block(
                    self.state.lease, error, status=status, retry_at=retry_at, now=now
                )
            except Exception as failed:
                retry_at = None
                log.error(
                    "run %s: blocked (%s) and could not record it (%s); its lease is left "
                    "to expire",
                    self.run_id,
                    exc,
                    failed,
                )
            else:
                log.error(
                    "run %s blocked (attempt %d, retry in %.0fs): %s",
                    self.run_id,
                    attempts,
                    retry_at - now,
                    exc,
                )
                error = {**error, "attempts": attempts, "retry_at": retry_at}
        self.state.publish({"type": "stalled", "error": error})
        return retry_at

    # -- releasing the run ----------------------------------------------------------------

    async def _release(self, release: Release) -> list[Event]:
        self.state.releasing = True
        stored = await self.state.writer.release(release)
        self.state.publish_events(stored)
        self.state.publish({"type": "status", "status": release.status})
        return stored

    async def _park_release(self) -> TickResult:
        deadlines = [d for d, _ in self.state.parker.parked if d is not None]
        not_before = min(deadlines) if deadlines else None
        names = sorted({n for _, ns in self.state.parker.parked for n in ns})
        parker = self.state.parker
        paced = parker.paced_on[0] if parker.paced_on else None
        # A model call waiting for its rate limit's slot is the fleet's pacing, not the
        # agent's wait: no event records it (a run never paced keeps its log byte for byte).
        events: list[Event] = []
        if len(parker.parked) > parker.paced_waits:
            events.append(self.state.run_event(RunWaiting(not_before=not_before, messages=names)))
        stored = await self._release(
            Release(
                RunStatus.WAITING,
                not_before=not_before,
                waiting_for=names,
                events=events,
                paced=paced,
            )
        )
        if self.state.parker.suspended and self._task is not None and not self._task.done():
            self.state.journal.recorded(stored)  # a kept tick's journal is the whole log
            self._keep = True
        return self.state.result(TickStatus.WAITING, not_before=not_before)

    async def _release_running(self, status: TickStatus, not_before: float | None) -> TickResult:
        await self._release(Release(RunStatus.RUNNING, not_before=not_before))
        return self.state.result(status, not_before=not_before)

    async def _back_off(self, abort: BackingOff) -> TickResult:
        not_before = self.state.clock.now() + self.state.deps.settings.drain_window
        log.warning(
            "worker %s (code version %s) backs off run %s: its stream was written by newer "
            "live code version %s; retrying after the drain window (%.0fs)",
            self.state.deps.worker_id,
            self.state.code_version,
            self.run_id,
            abort.newer_version,
            self.state.deps.settings.drain_window,
        )
        return await self._release_running(TickStatus.BACKED_OFF, not_before)

    async def _defer(self, exc: AgentNotFound | AgentConfigError) -> TickResult:
        """This worker cannot load the run's agent (not deployed here, or its files are
        broken; a deploy may fix either): give the run back blocked, retried with
        backoff, instead of failing it. Nothing is lost; a cancel ends it at once."""
        # A run no worker could start stays queued (it never ran).
        status = (
            RunStatus.QUEUED
            if self.state.lease.previous_status == RunStatus.QUEUED
            else RunStatus.RUNNING
        )
        not_before = await self._block(exc, status)
        return self.state.result(TickStatus.DEFERRED, error=error_dict(exc), not_before=not_before)

    async def _finish_cancelled(self) -> TickResult:
        event = self.state.run_event(RunCancelled(reason="cancel requested"))
        await self._release(Release(RunStatus.CANCELLED, events=[event]))
        return self.state.result(TickStatus.CANCELLED)

    async def _finish_from_log(self) -> TickResult:
        terminal = self.state.journal.terminal
        assert terminal is not None
        status = {"RunCompleted": RunStatus.COMPLETED, "RunFailed": RunStatus.FAILED}.get(
            terminal.type, RunStatus.CANCELLED
        )
        payload = terminal.payload
        output = payload.output if isinstance(payload, RunCompleted) else None
        error = payload.error if isinstance(payload, RunFailed) else None
        await self._release(Release(status, output=output, error=error))
        return self.state.result(TickStatus(status), output=output, error=error)


async def tick(run_id: str, deps: TickDeps, *, lease: Lease | None = None) -> TickResult:
    """Run one tick of ``run_id``. Without a lease, claim the run first (a run leased by a
    live worker, or not runnable yet, is left alone: status ``not_claimed``)."""
    granted_at = None  # a lease passed in is proven (renewed) before its first step
    if lease is None:
        granted_at = lease_clock()
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
            return TickResult(run_id, TickStatus.NOT_CLAIMED)
        lease = leases[0]
    return await TickRunner.claimed(deps, lease, granted_at=granted_at).run()
