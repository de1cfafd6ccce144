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
parked (:func:`toren.core.drivers.resume.resumable`): the lease is the very next one (no
other worker claimed the run in between), the run is not cancelled, its log ends where
this tick left it, and the agent's code version and program are the ones the task runs.
Anything else, or a cache miss, is the full replay of every other tick: the event log
stays the only truth, and the cache only saves work (ARCHITECTURE.md, "Sticky runs").

Temporal's workers keep a "sticky" cache of workflow executions for the same reason; the
design here is that, with the log check made explicit.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol


class Kept(Protocol):
    """What the cache needs of a kept tick (:class:`~toren.core.drivers.tick.TickRunner`)."""

    @property
    def run_id(self) -> str: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    def folded_steps(self) -> int: ...
    def discard(self) -> None: ...


__all__ = ["ENTRY_BYTES", "EVENT_BYTES", "Kept", "StickyRuns"]

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
        self._kept: collections.OrderedDict[str, tuple[Kept, int]] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._kept

    @staticmethod
    def weight(runner: Kept) -> int:
        return ENTRY_BYTES + EVENT_BYTES * runner.folded_steps()

    def keep(self, runner: Kept) -> None:
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

    def take(self, run_id: str) -> Kept | None:
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
