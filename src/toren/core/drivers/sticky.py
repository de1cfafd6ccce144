"""Sticky runs: a worker keeps the runs it parked, suspended, and continues them in place.

When a tick parks a run (every branch of its agent code waits on a durable timer or
message), the run is released as ``waiting`` in the log and the row exactly as without
this cache. What changes is what the worker keeps: instead of cancelling the agent task
and forgetting the tick, it keeps the whole tick (:class:`~toren.core.drivers.tick.
TickRunner`: the agent task suspended inside its waits, the journal, the writer's chain)
in a :class:`StickyRuns` cache, bounded by an estimate of its memory.

When the same worker claims that run again (the message arrived, the timer is due), the
tick is taken out of the cache and continued under the new lease: the waits wake, read
the inbox or the clock, write what they receive and the agent code goes on. Nothing is
loaded and nothing replayed. It is continued only when nothing can have changed since it
parked (:meth:`TickRunner.resumable`): the lease is the very next one (no other worker
claimed the run in between), the run is not cancelled, its log ends where this tick left
it, and the agent's code version and program are the ones the task runs. Anything else,
or a cache miss, is the full replay of every other tick: the event log stays the only
truth, and the cache only saves work (ARCHITECTURE.md, "Sticky runs").

Temporal's workers keep a "sticky" cache of workflow executions for the same reason; the
design here is that, with the log check made explicit.
"""

from __future__ import annotations

import asyncio
import collections
from typing import TYPE_CHECKING

from toren.core.contract.records import Lease, RunRecord
from toren.core.contract.values import RunStatus
from toren.errors import TorenError

if TYPE_CHECKING:
    from toren.core.drivers.tick import TickRunner

__all__ = ["ENTRY_BYTES", "EVENT_BYTES", "StickyRuns", "resumable"]

# The estimate of what a kept tick holds, fitted to tracemalloc measurements of
# bench/sticky.py's conversation agent (2, 20 and 60 recorded model steps: 20, 85 and 237
# KB per kept run): a suspended agent task with its contexts and state, plus each folded
# step (its event, and the agent's own copy of the conversation). An estimate, stated as
# one: runs with large payloads hold more; the bench prints both figures.
ENTRY_BYTES = 12_000
EVENT_BYTES = 3_800


class StickyRuns:
    """Parked ticks by run id, least recently parked evicted first once their estimated
    size passes ``max_bytes``. An evicted or discarded tick's agent task is cancelled
    (as an uncached park cancels it), and its run replays on its next claim."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        # taken from the cache; of those, continued in place or found stale (replayed)
        self.hits = self.misses = self.evictions = 0
        self.continued = self.stale = 0
        self._kept: collections.OrderedDict[str, tuple[TickRunner, int]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._kept

    @staticmethod
    def weight(runner: TickRunner) -> int:
        log = runner.state.journal.log
        steps = sum(len(v.steps) + len(v.superseded) for v in log.streams.values())
        return ENTRY_BYTES + EVENT_BYTES * steps

    def keep(self, runner: TickRunner) -> None:
        """Keep a tick that parked with its agent task suspended."""
        self.discard(runner.run_id)
        size = self.weight(runner)
        if size > self.max_bytes:
            runner.discard()
            return
        self._kept[runner.run_id] = (runner, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (old, old_size) = self._kept.popitem(last=False)
            self.bytes -= old_size
            self.evictions += 1
            old.discard()

    def take(self, run_id: str) -> TickRunner | None:
        """The kept tick of ``run_id``, out of the cache (the caller continues it or
        discards it), or None."""
        entry = self._kept.pop(run_id, None)
        if entry is None:
            self.misses += 1
            return None
        runner, size = entry
        self.bytes -= size
        if runner.loop is not asyncio.get_running_loop():  # kept under another event loop
            runner.discard()
            self.misses += 1
            return None
        self.hits += 1
        return runner

    def discard(self, run_id: str) -> None:
        entry = self._kept.pop(run_id, None)
        if entry is not None:
            self.bytes -= entry[1]
            entry[0].discard()

    def clear(self) -> None:
        """Cancel every kept tick (a stopping worker: its runs replay elsewhere)."""
        while self._kept:
            _, (runner, _) = self._kept.popitem()
            runner.discard()
        self.bytes = 0


async def resumable(runner: TickRunner, lease: Lease) -> RunRecord | None:
    """The run's row if ``runner``, kept when the run parked, may continue under
    ``lease``: nothing can have changed since. Else None (the caller replays)."""
    state = runner.state
    kept = state.lease
    if (
        lease.recovered
        or lease.previous_status != RunStatus.WAITING
        or lease.worker_id != kept.worker_id
        or lease.epoch != kept.epoch + 1  # another claim came in between
    ):
        return None
    run = await state.store.get_run(lease.run_id)
    if run is None or run.cancel_requested:
        return None
    try:
        program = state.deps.agents.resolve(run.agent, run.process)
    except TorenError:
        return None
    if (
        program is not runner.program
        or (state.deps.code_version or program.code_version) != state.code_version
    ):
        return None  # a new deploy (or a reload): its code replays the log
    after = state.journal.log.last_seq
    if await state.store.load_events(lease.run_id, after_seq=after, limit=1):
        return None  # the log grew since this tick parked
    return run
