"""A worker's upkeep besides its ticks (:mod:`toren.core.drivers.worker` runs them as loops):
declaring the code it runs (the agents' schedules and concurrency limits, written to the
store whenever an agent's code version changes: ``toren dev`` reloads) and pruning runs
finished longer ago than the retention setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from toren.core.contract.values import TickStatus
from toren.core.drivers.tickstate import TickDeps
from toren.errors import TorenError

__all__ = ["WorkerMetrics", "declare_limits", "declare_schedules", "processes", "prune_loop"]

log = logging.getLogger("toren.worker")


@dataclass
class WorkerMetrics:
    ticks: Counter[TickStatus] = field(default_factory=Counter)  # by result status
    lease_recoveries: int = 0
    backoffs: int = 0
    invalidations: int = 0
    steps_replayed: int = 0
    steps_executed: int = 0
    pruned_runs: int = 0
    # Why the claim loop woke (notify, timer, poll, capacity) and how many runs the claim
    # after each kind of wake-up found (plus start and more: the claim right after one
    # that filled every free slot).
    wakes: Counter[str] = field(default_factory=Counter)
    claimed: Counter[str] = field(default_factory=Counter)


async def declare_schedules(
    deps: TickDeps,
    declared: dict[str, str],
    *,
    code_version: str,
    started_at: float,
    worker_id: str,
) -> dict[str, str]:
    """Write the agents' schedule definitions when their code versions changed since
    the last declaration; the versions declared."""
    programs = {}
    for name in deps.agents.names():
        try:
            programs[name] = deps.agents.resolve(name, "main")
        except TorenError:
            continue  # a broken agent: its schedules stay as the last good code left them
    versions = {name: p.code_version for name, p in programs.items()}
    if versions == declared:
        return declared
    await declare_limits(deps, sorted(programs), worker_id)
    await deps.store.schedules.declare(
        [d for p in programs.values() for d in p.schedules],
        agents=sorted(programs),
        code_version=code_version,
        started_at=started_at,
        now=deps.clock.now(),
    )
    return versions


async def declare_limits(deps: TickDeps, agents: list[str], worker_id: str) -> None:
    """This code's concurrency limits, for the runs still queued under them: a changed
    limit takes effect without restarting anything, a removed one releases its runs
    (toren.core.contract.flow)."""
    limits: list[tuple[str, str, int | None]] = []
    released = 0
    for name in agents:
        declared = dict(deps.settings.rate_limits)
        for process in processes(deps.agents, name):
            try:
                program = deps.agents.resolve(name, process)
            except TorenError:
                continue
            concurrency = program.concurrency
            limits.append((name, process, concurrency.limit if concurrency else None))
            declared.update(program.rate_limits)
        # A changed provider rate limit re-paces the runs parked on it; a removed one
        # releases them (toren.core.contract.ratelimit).
        released += await deps.store.declare_rate_limits([name], declared, now=deps.clock.now())
    if released:
        log.info("worker %s woke %d runs parked on changed rate limits", worker_id, released)
    changed = await deps.store.set_concurrency_limits(limits)
    if changed:
        log.info(
            "worker %s applied its concurrency limits to %d queued runs",
            worker_id,
            changed,
        )


def processes(agents: Any, name: str) -> tuple[str, ...]:
    try:
        program = agents.resolve(name, "main")
    except Exception:
        return ()
    return tuple(program.processes) or ("main",)


async def prune_loop(
    deps: TickDeps, metrics: WorkerMetrics, stopping: asyncio.Event, worker_id: str
) -> None:
    """Prune runs finished longer ago than the retention setting, one small batch at a
    time: a batch, then ``pause`` while there is more, ``interval`` once caught up.
    Workers pruning at once split the work (see toren.store.retention)."""
    retention = deps.settings.retention
    assert retention.finished_after is not None
    swept_at, pruned_since = deps.clock.now(), 0
    while not stopping.is_set():
        wait = retention.interval
        try:
            now = deps.clock.now()
            done = await deps.store.prune_finished(
                before=now - retention.finished_after, limit=retention.batch
            )
            metrics.pruned_runs += done
            pruned_since += done
            if done:
                log.info("worker %s pruned %d finished runs", worker_id, done)
            if done >= retention.batch:
                wait = retention.pause
            elif pruned_since and now - swept_at >= retention.sweep_interval:
                swept_at, pruned_since = now, 0
                swept = await deps.store.sweep_blobs()
                log.info("worker %s swept %d unreferenced bodies", worker_id, swept)
        except Exception:
            log.exception("worker %s: prune failed; retrying later", worker_id)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), wait)
