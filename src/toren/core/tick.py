"""The tick: one scheduling of a run on a worker.

Load the run's events, fold them (:mod:`toren.core.replay`), re-execute the agent code
from the start resolving each step from the log, then execute live steps (each committed
before the code continues) until the run completes, fails, waits, is cancelled, backs off
or loses its lease. The pure decisions live in ``replay``; the steps in ``steps``; the
tick's state and writes in ``tickstate``; this module drives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from toren.core.branches import IDLE, READY, UNKNOWN, verdict
from toren.core.context import Context
from toren.core.events import (
    Event,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunWaiting,
)
from toren.core.failures import failed_seqs, failure_dict
from toren.core.records import Lease, Release, RunDelta, RunRecord
from toren.core.replay import (
    RunLog,
)
from toren.errors import (
    AgentConfigError,
    AgentNotFound,
    InfrastructureError,
    LeaseLost,
    RunNotFound,
    TorenError,
    UserError,
)

if TYPE_CHECKING:
    pass
from toren.core.fencing import lease_clock
from toren.core.steps import Steps
from toren.core.tickstate import (
    FLUSH_INTERVAL,
    TickDeps,
    TickResult,
    UsageBySeq,
    _BackOff,
    _Cancel,
    _Drain,
    _LeaseGone,
    _Park,
    _StoreFailed,
    _tool_refs,
    error_dict,
    json_value,
    log_totals,
    newest_start_by_version,
    recorded_error,
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
        self.record = run
        try:
            program = self.deps.agents.resolve(run.agent, run.process)
        except (AgentNotFound, AgentConfigError) as exc:
            if run.cancel_requested:  # nothing of the agent is needed to cancel its run
                return await self._finish_cancelled()
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
            # A fork's first tick replays the history it was copied: that is saved too.
            or (self.log.forked is not None and self.lease.previous_status == "queued")
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
        by_seq = UsageBySeq(events)
        truth = by_seq.final()
        self._pending.add(
            RunDelta(
                input_tokens=truth.input_tokens - run.input_tokens,
                output_tokens=truth.output_tokens - run.output_tokens,
                cost_nanousd=truth.cost_nanousd - run.cost_nanousd,
                steps=truth.steps - run.steps,
                invalidations=truth.invalidations - run.invalidations,
            )
        )
        self._usage_by_seq = by_seq

    async def _main(self, ctx: Context) -> Any:
        output = await ctx.program.fn(ctx, ctx.input)
        self._end_stream(ctx)
        return json_value(output, f"the output of run {self.run_id!r}")

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
            if self._parkable() and await self._settled():
                # Snapshot first: cancelling the agent task unwinds the waiters.
                self._parked = list(self._waiters)
                self._stop(_Park("waiting"))
        with contextlib.suppress(BaseException):
            await self._task

    def _parkable(self) -> bool:
        return bool(self._waiters) and self._inflight == 0

    async def _settled(self) -> bool:
        """Whether the run is idle, so that parking loses nothing: every branch of the
        agent code waits on a durable wait. Branches that can run are let run; a branch
        awaiting other work (outside ``ctx``) is waited for, up to ``park_grace`` seconds,
        after which the run parks anyway and that work runs again on resume. False when
        something else came up first (a live step, the end, a cancel, a drain)."""
        assert self._task is not None
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while self._parkable() and not self._task.done():
            if self._abort is not None or self._draining:
                return False
            found = verdict(self._task, self._park_futures.__contains__)
            if found.state == IDLE:
                return True
            if found.state == UNKNOWN:  # no way to tell: let ready branches run, then park
                for _ in range(8):
                    await asyncio.sleep(0)
                return self._parkable() and not self._task.done()
            if found.state == READY:
                await asyncio.sleep(0)
                continue
            now = loop.time()
            if deadline is None:
                deadline = now + self.deps.settings.park_grace
            if now >= deadline:
                log.info(
                    "run %s parks while a branch still awaits work outside ctx after %.0fs "
                    "(park_grace); that work is cancelled and runs again when the run resumes",
                    self.run_id,
                    self.deps.settings.park_grace,
                )
                return True
            self._wake.clear()
            woken = asyncio.ensure_future(self._wake.wait())
            await asyncio.wait(
                {*found.futures, self._task, woken},
                timeout=deadline - now,
                return_when=asyncio.FIRST_COMPLETED,
            )
            woken.cancel()
        return False

    async def _conclude(self) -> TickResult:
        assert self._task is not None
        abort = self._abort
        if isinstance(abort, _LeaseGone):
            return self._result("lease_lost", error=error_dict(abort.cause))
        if isinstance(abort, _StoreFailed):
            return await self._infrastructure_error(abort.cause)
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
            return await self._infrastructure_error(exc)
        err = failure_dict(exc)
        if not isinstance(exc, TorenError):
            log.warning("run %s failed in agent code", self.run_id, exc_info=exc)
        failed = RunFailed(err, failed_seqs=failed_seqs(exc))
        await self._release(Release("failed", error=err, events=[self._run_event(failed)]))
        return self._result("failed", error=err)

    async def _infrastructure_error(self, exc: InfrastructureError) -> TickResult:
        blocked = await self._block(exc)
        return self._result("error", error=error_dict(exc), not_before=blocked)

    async def _block(
        self, exc: InfrastructureError | UserError, status: str = "running"
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
        self.releasing = True
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

    async def _defer(self, exc: AgentNotFound | AgentConfigError) -> TickResult:
        """This worker cannot load the run's agent (not deployed here, or its files are
        broken; a deploy may fix either): give the run back blocked, retried with
        backoff, instead of failing it. Nothing is lost; a cancel ends it at once."""
        # A run no worker could start stays queued (it never ran).
        status = "queued" if self.lease.previous_status == "queued" else "running"
        not_before = await self._block(exc, status)
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
            return TickResult(run_id, "not_claimed")
        lease = leases[0]
    return await TickRunner(deps, lease, granted_at=granted_at).run()
