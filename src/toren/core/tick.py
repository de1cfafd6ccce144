"""The tick: one scheduling of a run on a worker.

Load the run's events, fold them into a :class:`~toren.core.journal.Journal`, re-execute
the agent code from the start resolving each step from the log, then execute live steps
(each committed before the code continues) until the run completes, fails, waits, is
cancelled, backs off or loses its lease.

The tick is one of two drivers over the journal (the other is the dry run of ``toren
plan``). The journal decides (replay, run, supersede, back off) and holds no I/O; the
driver does everything else: the steps' effects (``effects``), stamping and writing what
the journal and the effects return under the lease (``tickstate.Writer``), parking
(``tickstate.Parker``), and this module: load, drive, release.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from toren.core.audit import tail
from toren.core.context import Context
from toren.core.events import (
    Event,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunWaiting,
)
from toren.core.failures import failed_seqs, failure_dict
from toren.core.fencing import lease_clock
from toren.core.journal import Journal
from toren.core.records import Lease, Release, RunRecord
from toren.core.steps import Steps
from toren.core.tickstate import (
    FLUSH_INTERVAL,
    TickDeps,
    TickResult,
    _BackOff,
    _Cancel,
    _Drain,
    _LeaseGone,
    _Park,
    _StoreFailed,
    error_dict,
    json_value,
    log_totals,
    newest_start_by_version,
    recorded_error,
    tool_refs,
)
from toren.core.values import RunStatus, TickStatus, Totals
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


class TickRunner(Steps):
    """One tick of one run. Contexts call into its steps; :meth:`run` drives it."""

    # -- the drive ------------------------------------------------------------------------

    async def run(self) -> TickResult:
        self.begin_replay()
        try:
            return await self._run()
        except InfrastructureError as exc:  # reading the run or its log, releasing it
            await self._block(exc)
            raise
        finally:
            self.end_replay()
            # The agent task (its frames, a cancelled task's traceback) points back at
            # this runner: drop it, so the tick and its log are freed at once, by reference
            # counting, not at the cycle collector's next full pass. A task still running
            # (the tick itself was cancelled or failed) is cancelled first, never orphaned.
            if self._task is not None and not self._task.done():
                self._task.cancel()
            self._task = None

    async def _run(self) -> TickResult:
        run = await self.store.get_run(self.run_id)
        if run is None:
            raise RunNotFound(f"no run with id {self.run_id!r}")
        self.writer.record = run
        try:
            program = self.deps.agents.resolve(run.agent, run.process)
        except (AgentNotFound, AgentConfigError) as exc:
            if run.cancel_requested:  # nothing of the agent is needed to cancel its run
                self.writer.chain = tail(await self.store.load_events(self.run_id))
                return await self._finish_cancelled()
            return await self._defer(exc)
        self.code_version = self.deps.code_version or program.code_version
        events = await self.store.load_events(self.run_id)
        self.writer.chain = tail(events)
        self.journal = Journal.fold(self.run_id, events)
        self._correct_totals(run)
        self.bodies.known = {h for e in events for h in tool_refs(e)}
        self._interrupted = (
            self.lease.recovered
            or self.lease.previous_status == RunStatus.RUNNING
            or (run.code_version is not None and run.code_version != self.code_version)
            # A fork's first tick replays the history it was copied: that is saved too.
            or (self.journal.forked is not None and self.lease.previous_status == RunStatus.QUEUED)
        )
        if self.journal.terminal is not None:  # finished, but the row was not updated
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

    async def _drive(self) -> None:
        assert self._task is not None
        await self.parker.drive(
            self._task,
            stopped=lambda: self._abort is not None,
            stop=self._stop_for,
            grace=self.deps.settings.park_grace,
            run_id=self.run_id,
        )

    def _stop_for(self, why: str) -> None:
        self._stop(_Drain("worker draining") if why == "drain" else _Park(RunStatus.WAITING.value))

    def _correct_totals(self, run: RunRecord) -> None:
        """The run row is a cache of the log: put right what a crashed tick left unsaid."""
        truth = self.journal.usage.final()
        self.writer.add(
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
        self._end_stream(ctx)
        return json_value(output, f"the output of run {self.run_id!r}")

    async def _conclude(self) -> TickResult:
        assert self._task is not None
        abort = self._abort
        if isinstance(abort, _LeaseGone):
            return self._result(TickStatus.LEASE_LOST, error=error_dict(abort.cause))
        if isinstance(abort, _StoreFailed):
            return await self._infrastructure_error(abort.cause)
        if isinstance(abort, _Cancel):
            return await self._finish_cancelled()
        if isinstance(abort, _Drain):
            return await self._release_running(TickStatus.DRAINED, None)
        if isinstance(abort, _BackOff):
            return await self._back_off(abort)
        if isinstance(abort, _Park):
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
                    events=[self._run_event(RunCompleted(output))],
                )
            )
            return self._result(TickStatus.COMPLETED, output=output)
        if isinstance(exc, InfrastructureError):
            return await self._infrastructure_error(exc)
        err = failure_dict(exc)
        if not isinstance(exc, TorenError):
            log.warning("run %s failed in agent code", self.run_id, exc_info=exc)
        failed = RunFailed(err, failed_seqs=failed_seqs(exc))
        await self._release(Release(RunStatus.FAILED, error=err, events=[self._run_event(failed)]))
        return self._result(TickStatus.FAILED, error=err)

    async def _infrastructure_error(self, exc: InfrastructureError) -> TickResult:
        blocked = await self._block(exc)
        return self._result(TickStatus.ERROR, error=error_dict(exc), not_before=blocked)

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
        if not self.releasing:
            self.releasing = True
            attempts = (self.record.blocked_attempts if self.record is not None else 0) + 1
            now = self.clock.now()
            retry_at = now + self.deps.settings.blocked_retry.delay(attempts)
            try:
                attempts = await self.store.block(
                    self.lease, error, status=status, retry_at=retry_at, now=now
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
        self._publish({"type": "stalled", "error": error})
        return retry_at

    # -- releasing the run ----------------------------------------------------------------

    async def _release(self, release: Release) -> list[Event]:
        self.releasing = True
        stored = await self.writer.release(release)
        self._publish_events(stored)
        self._publish({"type": "status", "status": release.status})
        return stored

    async def _park_release(self) -> TickResult:
        deadlines = [d for d, _ in self.parker.parked if d is not None]
        not_before = min(deadlines) if deadlines else None
        names = sorted({n for _, ns in self.parker.parked for n in ns})
        event = self._run_event(RunWaiting(not_before=not_before, messages=names))
        await self._release(
            Release(RunStatus.WAITING, not_before=not_before, waiting_for=names, events=[event])
        )
        return self._result(TickStatus.WAITING, not_before=not_before)

    async def _release_running(self, status: TickStatus, not_before: float | None) -> TickResult:
        await self._release(Release(RunStatus.RUNNING, not_before=not_before))
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
        return await self._release_running(TickStatus.BACKED_OFF, not_before)

    async def _defer(self, exc: AgentNotFound | AgentConfigError) -> TickResult:
        """This worker cannot load the run's agent (not deployed here, or its files are
        broken; a deploy may fix either): give the run back blocked, retried with
        backoff, instead of failing it. Nothing is lost; a cancel ends it at once."""
        # A run no worker could start stays queued (it never ran).
        status = (
            RunStatus.QUEUED
            if self.lease.previous_status == RunStatus.QUEUED
            else RunStatus.RUNNING
        )
        not_before = await self._block(exc, status)
        return self._result(TickStatus.DEFERRED, error=error_dict(exc), not_before=not_before)

    async def _finish_cancelled(self) -> TickResult:
        event = self._run_event(RunCancelled(reason="cancel requested"))
        await self._release(Release(RunStatus.CANCELLED, events=[event]))
        return self._result(TickStatus.CANCELLED)

    async def _finish_from_log(self) -> TickResult:
        terminal = self.journal.terminal
        assert terminal is not None
        status = {"RunCompleted": RunStatus.COMPLETED, "RunFailed": RunStatus.FAILED}.get(
            terminal.type, RunStatus.CANCELLED
        )
        payload = terminal.payload
        output = payload.output if isinstance(payload, RunCompleted) else None
        error = payload.error if isinstance(payload, RunFailed) else None
        await self._release(Release(status, output=output, error=error))
        return self._result(TickStatus(status), output=output, error=error)


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
    return await TickRunner(deps, lease, granted_at=granted_at).run()
