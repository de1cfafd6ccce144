"""``LocalWorkerRuntime``: a worker you start inside your own process.

It registers itself (id, code version, start time), claims runnable runs with a lease,
runs many ticks concurrently on one event loop, renews its leases and checks for
cancellation on every heartbeat, wakes promptly on new work (Postgres LISTEN/NOTIFY,
in-process signals and short polling on SQLite) and drains on stop: no new claims, running
ticks get up to the drain window to finish, then the rest give their runs back.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
from dataclasses import replace
from typing import Any

from toren.core.contract.records import Lease, WorkerInfo
from toren.core.contract.values import TickStatus
from toren.core.drivers.fencing import lease_clock
from toren.core.drivers.scheduler import POLL, Scheduler
from toren.core.drivers.sticky import StickyRuns
from toren.core.drivers.takeover import take_over_gone
from toren.core.drivers.tick import TickDeps, TickResult, TickRunner, newest_start_by_version
from toren.core.drivers.upkeep import WorkerMetrics, declare_schedules, processes, prune_loop
from toren.errors import CorruptRow, StorageError

log = logging.getLogger("toren.worker")
RESULTS_KEPT = 1000  # tick results a worker keeps (LocalWorkerRuntime.results)

# Longest wait between attempts to re-assert a lease while the database is unreachable:
# a run continues at most this long after the database is back.
REASSERT_MAX_DELAY = 0.5

# How long after a timer's due time an idle worker claims (s): it must find the run due
# (not_before <= now) even if the event loop's clock woke it a hair early.
TIMER_SLACK = 0.002

# While due runs outnumber its slots, a worker claims once a 1/CLAIM_BATCH_FRACTION of its
# slots are free, or CLAIM_GATHER seconds after the first one freed, whichever is first.
CLAIM_BATCH_FRACTION = 4
CLAIM_GATHER = 0.05


class LocalWorkerRuntime:
    def __init__(
        self, deps: TickDeps, *, concurrency: int | None = None, only: str | None = None
    ) -> None:
        """``only``: claim that run and no other (the worker inside ``toren run`` and
        ``toren runs resume``, which must not pick up other runs of the database)."""
        self.deps = deps
        self.only = only
        self.settings = deps.settings
        self.concurrency = concurrency or self.settings.concurrency
        # An explicit, stable worker id (``TickDeps.worker_id`` / ``--worker-id``) lets a
        # restarted worker take back its dead predecessor's runs at once; the default is
        # unique per process, and a dead worker's runs wait for their leases to expire.
        self.stable_id = deps.worker_id != "local"
        self.worker_id = (
            deps.worker_id
            if self.stable_id
            else f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
        )
        self.deps.worker_id = self.worker_id
        if deps.sticky is None and self.settings.sticky_cache_mb > 0:
            deps.sticky = StickyRuns(int(self.settings.sticky_cache_mb * 1_000_000))
        self.metrics = WorkerMetrics()
        # The last tick's result of recently ticked runs, newest last: bounded, so a worker
        # that ticks runs for a month does not keep every output it ever produced.
        self.results: collections.OrderedDict[str, TickResult] = collections.OrderedDict()
        self._active: dict[str, tuple[TickRunner, asyncio.Task[None]]] = {}
        self._stopping = asyncio.Event()
        self._capacity = asyncio.Event()
        self._loops: list[asyncio.Task[None]] = []
        self._stop_task: asyncio.Task[None] | None = None
        self.started_at: float | None = None
        self.scheduler = Scheduler(deps.store.schedules, deps.clock, deps.agents)

    @property
    def code_version(self) -> str:
        if self.deps.code_version:
            return self.deps.code_version
        versions = set()
        for name in self.deps.agents.names():
            for process in processes(self.deps.agents, name):
                versions.add(self.deps.agents.resolve(name, process).code_version)
        return " ".join(sorted(versions)) or "dev"

    async def start(self) -> None:
        now = self.deps.clock.now()
        self.started_at = now
        self.deps.worker_started_at = now
        await self.deps.store.register_worker(
            WorkerInfo(
                self.worker_id,
                self.code_version,
                now,
                now,
                hostname=socket.gethostname(),
                pid=os.getpid(),
            )
        )
        if self.stable_id:
            taken = await self.deps.store.expire_leases(self.worker_id, now=now)
            if taken:
                log.info("worker %s takes back %d runs of its last life", self.worker_id, taken)
        await self._take_over_gone()
        log.info("worker %s started (code version %s)", self.worker_id, self.code_version)
        self._loops = [
            asyncio.ensure_future(self._claim_loop()),
            asyncio.ensure_future(self._heartbeat_loop()),
        ]
        if self.settings.retention.finished_after is not None:
            self._loops.append(asyncio.ensure_future(self._retention_loop()))
        if self.settings.schedules:
            self._loops.append(asyncio.ensure_future(self._schedule_loop()))

    async def __aenter__(self) -> LocalWorkerRuntime:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT start a drain (the process exits when ``stop`` returns)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: asyncio.ensure_future(self.stop()))

    async def wait_stopped(self) -> None:
        """Return once a stop (e.g. from a signal) has finished draining."""
        await self._stopping.wait()
        assert self._stop_task is not None
        await asyncio.shield(self._stop_task)

    # -- claiming -------------------------------------------------------------------------

    async def _claim_loop(self) -> None:
        """Claim while there is room; then sleep until new work is signalled (NOTIFY on
        PostgreSQL, in-process on SQLite), a slot frees, the earliest timer of a parked
        run is due (``store.next_due``), or ``poll_interval`` passes (the safety net for
        what nothing signals: an expired lease, a write from another SQLite process).
        ``metrics.wakes`` counts why it woke, ``metrics.claimed`` the runs each cause
        found."""
        store, clock = self.deps.store, self.deps.clock
        cause, backlog = "start", False
        batch = max(1, self.concurrency // CLAIM_BATCH_FRACTION)
        while not self._stopping.is_set():
            free = self.concurrency - len(self._active)
            if backlog and 0 < free < batch:
                # The last claim filled every slot, so more runs are likely due (a herd of
                # timers): gather a few freed slots for one claim rather than one claim,
                # which sorts every due run, per finished run.
                await self._gather_capacity(batch, CLAIM_GATHER)
                free = self.concurrency - len(self._active)
            leases: list[Lease] = []
            sent = lease_clock()
            if free > 0:
                try:
                    leases = await store.claim(
                        self.worker_id,
                        free,
                        now=clock.now(),
                        ttl=self.settings.lease.ttl,
                        only=self.only,
                    )
                except Exception:
                    log.exception("worker %s: claim failed; retrying", self.worker_id)
                    await asyncio.sleep(self.settings.poll_interval)
                    continue
            for lease in leases:
                self._launch(lease, sent)
            if leases:
                self.metrics.claimed[cause] += len(leases)
            backlog = len(leases) == free and free > 0
            if backlog:
                cause = "more"
                continue  # there may be more work waiting
            timeout, timer = self.settings.poll_interval, False
            if free > 0:  # room to spare: sleep no longer than until the next timer
                due = await self._next_due()
                if due is not None and due - clock.now() < timeout:
                    # A hair after the due time: the claim compares not_before <= now.
                    timeout, timer = max(0.0, due - clock.now()) + TIMER_SLACK, True
            self._capacity.clear()
            work = asyncio.ensure_future(store.wait_for_work(timeout))
            waits: list[asyncio.Future[Any]] = [work]
            if free <= 0:
                waits.append(asyncio.ensure_future(self._capacity.wait()))
            waits.append(asyncio.ensure_future(self._stopping.wait()))
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
            if work.done() and not work.cancelled() and work.exception() is None:
                cause = "notify" if work.result() else ("timer" if timer else "poll")
            else:
                cause = "capacity"
            self.metrics.wakes[cause] += 1

    async def _gather_capacity(self, slots: int, timeout: float) -> None:
        """Wait until ``slots`` slots are free, at most ``timeout`` seconds."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.concurrency - len(self._active) < slots and not self._stopping.is_set():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self._capacity.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._capacity.wait(), left)

    async def _next_due(self) -> float | None:
        """The store's earliest timer after now, or None (also when the store cannot
        tell: then the poll interval is the only bound)."""
        next_due = getattr(self.deps.store, "next_due", None)
        if next_due is None:
            return None
        try:
            due: float | None = await next_due(now=self.deps.clock.now())
        except Exception:
            log.exception("worker %s: reading the next timer failed", self.worker_id)
            return None
        return due

    def _launch(self, lease: Lease, granted_at: float) -> None:
        if lease.recovered:
            self.metrics.lease_recoveries += 1
            log.info(
                "worker %s recovered run %s from an expired lease", self.worker_id, lease.run_id
            )
        stale = self._active.get(lease.run_id)
        if stale is not None:  # this worker stalled past its own lease and claimed it anew
            stale[0].lose_lease(f"run {lease.run_id!r} was claimed again (epoch {lease.epoch})")
        runner = TickRunner.claimed(self.deps, lease, granted_at=granted_at)
        task = asyncio.ensure_future(self._tick(runner))
        self._active[lease.run_id] = (runner, task)

    async def _tick(self, runner: TickRunner) -> None:
        try:
            while True:
                failure = await self._tick_once(runner)
                if failure is None or self._stopping.is_set():
                    return
                granted_at = await self._reassert(runner.lease, failure)
                if granted_at is None:
                    return
                log.info(
                    "worker %s: database back; run %s continues under its lease (epoch %d)",
                    self.worker_id,
                    runner.run_id,
                    runner.lease.epoch,
                )
                task = asyncio.current_task()
                assert task is not None
                # Without what the claim read: the failed attempt may have moved the
                # run's totals since (a tick corrects them from the row it starts with),
                # and may have taken the message (so the count of unread ones is stale).
                lease = replace(runner.lease, record=None, last_seq=None, message=None, unread=None)
                runner = TickRunner(self.deps, lease, granted_at=granted_at)
                self._active[runner.run_id] = (runner, task)
        finally:
            entry = self._active.get(runner.run_id)
            if entry is not None and entry[0] is runner:
                del self._active[runner.run_id]
            self._capacity.set()

    async def _tick_once(self, runner: TickRunner) -> str | None:
        """Run one tick; the message of the database failure that ended it, if one did
        (not a corrupt row: that waits for a repair, not for the database)."""
        try:
            result = await runner.run()
        except StorageError as exc:
            self.metrics.ticks[TickStatus.ERROR] += 1
            log.exception("worker %s: tick of run %s failed", self.worker_id, runner.run_id)
            return None if isinstance(exc, CorruptRow) else exc.message
        except Exception:
            self.metrics.ticks[TickStatus.ERROR] += 1
            log.exception("worker %s: tick of run %s failed", self.worker_id, runner.run_id)
            return None
        self.results[runner.run_id] = result
        self.results.move_to_end(runner.run_id)
        while len(self.results) > RESULTS_KEPT:
            self.results.popitem(last=False)
        self.metrics.ticks[result.status] += 1
        self.metrics.invalidations += result.invalidations
        self.metrics.steps_replayed += result.replayed
        self.metrics.steps_executed += result.executed
        if result.status == TickStatus.BACKED_OFF:
            self.metrics.backoffs += 1
        elif result.status == TickStatus.LEASE_LOST:
            log.warning(
                "worker %s: tick of run %s ended, lease lost: %s",
                self.worker_id,
                runner.run_id,
                (result.error or {}).get("message"),
            )
        error = result.error or {}
        if result.status == TickStatus.ERROR and error.get("code") == StorageError.code:
            return str(error.get("message"))
        return None

    async def _reassert(self, lease: Lease, failure: str) -> float | None:
        """After the database failed under a tick, renew its lease (same epoch) as soon as
        the database answers again, so the run goes on at once instead of idling until
        the lease runs out. The ``lease_clock()`` reading the renewal was sent at, or None
        when the lease is gone (another worker has the run) or the worker is stopping."""
        log.warning(
            "worker %s: run %s paused by a database failure (%s); re-asserting its lease",
            self.worker_id,
            lease.run_id,
            failure,
        )
        delay = 0.05
        while not self._stopping.is_set():
            sent = lease_clock()
            try:
                held = await self.deps.store.renew_lease(
                    lease, expires_at=self.deps.clock.now() + self.settings.lease.ttl
                )
            except Exception:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                delay = min(delay * 2, REASSERT_MAX_DELAY)
                continue
            if held:
                return sent
            log.warning(
                "worker %s: tick of run %s ended, lease lost: the run is another worker's "
                "after the database failure",
                self.worker_id,
                lease.run_id,
            )
            return None
        return None

    # -- retention ------------------------------------------------------------------------

    async def _retention_loop(self) -> None:
        await prune_loop(self.deps, self.metrics, self._stopping, self.worker_id)

    # -- schedules ------------------------------------------------------------------------

    async def _schedule_loop(self) -> None:
        """Declare this code's agent.yaml schedules (again whenever an agent's code version
        changes: ``toren dev`` reloads), then fire what is due, sleeping until the next
        nominal time or :data:`~toren.core.drivers.scheduler.POLL`."""
        declared: dict[str, str] = {}
        while not self._stopping.is_set():
            wait = POLL
            try:
                assert self.started_at is not None
                declared = await declare_schedules(
                    self.deps,
                    declared,
                    code_version=self.code_version,
                    started_at=self.started_at,
                    worker_id=self.worker_id,
                )
                await self.scheduler.look()
                wait = await self.scheduler.sleep_for()
            except Exception:
                log.exception("worker %s: the scheduler failed; looking again", self.worker_id)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)

    # -- heartbeats -----------------------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self.settings.lease.heartbeat)
            if self._stopping.is_set():
                return
            try:
                await self.heartbeat()
            except Exception:
                log.exception("worker %s: heartbeat failed", self.worker_id)

    async def _take_over_gone(self) -> None:
        """Free the runs of workers known to be gone (toren.core.drivers.takeover)."""
        try:
            await take_over_gone(
                self.deps.store,
                me=self.worker_id,
                now=self.deps.clock.now(),
                heartbeat=self.settings.lease.heartbeat,
            )
        except Exception:
            log.exception("worker %s: looking for gone workers failed", self.worker_id)

    async def heartbeat(self) -> None:
        store = self.deps.store
        await store.heartbeat_worker(self.worker_id, now=self.deps.clock.now(), draining=False)
        await self._take_over_gone()
        renewing = {run_id: runner for run_id, (runner, _) in self._active.items()}
        # The local deadline counts from ``sent``; the expiry from ``now``, read after it
        # (not before the statements above: a stall there would leave the database's
        # expiry earlier than the deadline the ticks trust, see toren.core.drivers.fencing).
        sent = lease_clock()
        now = self.deps.clock.now()
        held, cancels = await store.renew(
            self.worker_id, list(renewing), expires_at=now + self.settings.lease.ttl
        )
        for run_id in cancels:
            entry = self._active.get(run_id)
            if entry is not None:
                entry[0].cancel()
        for run_id, runner in renewing.items():
            entry = self._active.get(run_id)
            if entry is None or entry[0] is not runner:
                continue  # that tick ended (a new tick of the run is not judged)
            if run_id in held:
                runner.fence.renewed(sent)  # the run's newest claim here is this runner's
                continue
            if runner.releasing:
                continue  # giving the run back on purpose
            log.warning(
                "worker %s lost its lease on run %s (it ran out, and the run is another "
                "worker's now or released); stopping its tick here",
                self.worker_id,
                run_id,
            )
            runner.lose_lease(f"worker {self.worker_id} no longer holds run {run_id!r}")

    def cancel_local(self, run_id: str) -> bool:
        """Cancel a run this worker is executing right now (the API calls this in-process
        so cancellation does not wait for the next heartbeat)."""
        entry = self._active.get(run_id)
        if entry is None:
            return False
        entry[0].cancel()
        return True

    def live_versions(self, workers: list[WorkerInfo]) -> dict[str, float]:
        return newest_start_by_version(workers)

    # -- stopping -------------------------------------------------------------------------

    async def stop(self, drain_window: float | None = None) -> None:
        """Drain: stop claiming, give running ticks up to the drain window, then make the
        rest release their runs (their in-flight steps will run again elsewhere). Every
        caller waits for the same drain to finish."""
        if self._stop_task is None:
            self._stop_task = asyncio.ensure_future(self._drain(drain_window))
            self._stopping.set()
        await asyncio.shield(self._stop_task)

    async def _drain(self, drain_window: float | None) -> None:
        window = self.settings.drain_window if drain_window is None else drain_window
        store, clock = self.deps.store, self.deps.clock
        with contextlib.suppress(Exception):
            await store.heartbeat_worker(self.worker_id, now=clock.now(), draining=True)
        tasks = [task for _, task in self._active.values()]
        if tasks:
            log.info(
                "worker %s draining %d runs (window %.1fs)", self.worker_id, len(tasks), window
            )
            for runner, _ in list(self._active.values()):
                runner.begin_drain()
            await asyncio.wait(tasks, timeout=window)
        for runner, _ in list(self._active.values()):
            runner.drain()
        rest = [task for _, task in self._active.values()]
        if rest:
            await asyncio.wait(rest)
        if self.deps.sticky is not None:  # kept runs replay under whoever claims them next
            self.deps.sticky.clear()
        for task in self._loops:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        # A stopped worker is no longer live: it must not win the storm guard.
        with contextlib.suppress(Exception):
            await store.heartbeat_worker(self.worker_id, now=0.0, draining=True)
        log.info("worker %s stopped", self.worker_id)

    @property
    def active_runs(self) -> list[str]:
        return list(self._active)
