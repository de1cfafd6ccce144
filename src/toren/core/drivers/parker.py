"""The tick's parker: live steps in flight, the branches parked on durable waits and the
wake-up of the drive (:meth:`Parker.drive`, shared with the dry run of ``toren plan``).
One part of the composed tick (see :mod:`toren.core.drivers.tickstate`); it knows the agent task
and its branches, nothing of the store or the journal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from toren.core.agent_api.branches import IDLE, READY, UNKNOWN, Branches, verdict

__all__ = ["Parker", "Wake"]

log = logging.getLogger("toren.tick")


class Wake:
    """The drive's wake-up: an ``asyncio.Event`` that the drive waits for through a plain
    future (:meth:`waiter`) rather than a task of ``Event.wait()``. A task would be
    created, stepped and cancelled at every turn of the drive, and its first step, queued
    while the agent code runs, keeps the loop from counting as idle, which sends that
    code's first write the long way through the loop (``toren.store.sql.InlineGate``).
    One waiter at a time: the drive's."""

    __slots__ = ("_flag", "_waiter")

    def __init__(self) -> None:
        self._flag = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._flag = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._flag = False

    def is_set(self) -> bool:
        return self._flag

    def waiter(self) -> asyncio.Future[None]:
        """A future done once the wake is set (at once if it is set now); cancel it when
        no longer waited for."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._flag:
            waiter.set_result(None)
        self._waiter = waiter
        return waiter


class Parker:
    """Live steps in flight and branches parked on durable waits. A run parks (its tick
    ends, status waiting) when no live step is in flight, some branch waits durably and
    every branch is idle; see :meth:`drive`."""

    __slots__ = (
        "branches",
        "draining",
        "futures",
        "inflight",
        "paced_on",
        "paced_waits",
        "pacing",
        "parked",
        "suspended",
        "waiters",
        "wake",
    )

    def __init__(self) -> None:
        self.branches = Branches()  # parked steps and ctx.gather/task_group joins: see _settled
        self.inflight = 0
        self.waiters: list[tuple[float | None, tuple[str, ...]]] = []
        self.parked: list[tuple[float | None, tuple[str, ...]]] = []
        # What parked branches await, in the order they parked (a resume wakes them so).
        self.futures: dict[asyncio.Future[None], None] = {}
        self.wake = Wake()
        self.draining = False
        # Parked with the agent task kept, suspended in its waits (a sticky run: see
        # toren.core.drivers.sticky); :meth:`resume` wakes the waits under a new lease.
        self.suspended = False
        # Model calls waiting for their slot of a rate limit, by key (of the waiters), and
        # the keys as the run parked (see toren.core.contract.ratelimit).
        self.pacing: dict[str, int] = {}
        self.paced_on: list[str] = []
        self.paced_waits = 0

    async def park(
        self, not_before: float | None, names: tuple[str, ...], paced: str | None = None
    ) -> None:
        """Wait for the tick to park the run. Returns only when a sticky run is resumed
        (:meth:`resume`: the caller looks at its timer, inbox or slot again); otherwise
        the agent task is cancelled here. Called inside a live step (counted in flight).
        ``paced``: a model call waiting for its slot of this rate limit (no event records
        it)."""
        entry = (not_before, names)
        if paced is not None:
            self.pacing[paced] = self.pacing.get(paced, 0) + 1
        parked: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(entry)
        self.futures[parked] = None
        self.inflight -= 1
        if self.inflight == 0:
            self.wake.set()
        try:
            with self.branches.parked(parked):  # the tick knows this task waits durably
                await parked
        finally:
            self.inflight += 1
            self.waiters.remove(entry)
            self.futures.pop(parked, None)
            if paced is not None:
                self.pacing[paced] -= 1

    def resume(self) -> None:
        """Wake every parked wait of a suspended run (a later tick continues it), in the
        order they parked: the order in which a replay of the run would reach them."""
        self.suspended = False
        self.parked = []
        for parked in list(self.futures):
            if not parked.done():
                parked.set_result(None)

    def parkable(self) -> bool:
        return bool(self.waiters) and self.inflight == 0

    async def drive(
        self,
        task: asyncio.Task[object],
        *,
        stopped: Callable[[], bool],
        stop: Callable[[str], object],
        grace: float,
        run_id: str,
    ) -> None:
        """Run until the agent task ends or is stopped. ``stop("drain")`` once a draining
        worker has nothing in flight; ``stop("park")`` once the run is idle (the waiters
        are snapshot in :attr:`parked` first: cancelling the agent task unwinds them).
        A ``stop("park")`` that :attr:`suspended` the run returns at once, the agent task
        still pending."""
        # The task's end wakes the drive too: one future to wait for at each turn, not
        # ``asyncio.wait`` on two (its callbacks cost one more turn of the loop per wake).
        task.add_done_callback(self._ended)
        try:
            while not task.done():
                self.wake.clear()
                woken = self.wake.waiter()
                try:
                    await woken
                finally:
                    woken.cancel()
                if task.done() or stopped():
                    break
                if self.draining and self.inflight == 0:
                    stop("drain")
                    break
                if self.parkable() and await self._settled(task, stopped, grace, run_id):
                    self.parked = list(self.waiters)
                    self.paced_on = sorted(k for k, n in self.pacing.items() if n > 0)
                    self.paced_waits = sum(self.pacing.values())
                    stop("park")
                    if self.suspended:  # the agent task stays, suspended in its waits
                        return
        finally:
            task.remove_done_callback(self._ended)  # a resumed run's next drive adds it
        with contextlib.suppress(BaseException):
            await task

    def _ended(self, task: asyncio.Task[object]) -> None:
        self.wake.set()

    async def _settled(
        self, task: asyncio.Task[Any], stopped: Callable[[], bool], grace: float, run_id: str
    ) -> bool:
        """Whether the run is idle, so that parking loses nothing: every branch of the
        agent code waits on a durable wait. Branches that can run are let run; a branch
        awaiting other work (outside ``ctx``) is waited for, up to ``park_grace`` seconds,
        after which the run parks anyway and that work runs again on resume. False when
        something else came up first (a live step, the end, a cancel, a drain)."""
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        while self.parkable() and not task.done():
            if stopped() or self.draining:
                return False
            found = verdict(task, self.futures.__contains__, self.branches)
            if found.state == IDLE:
                return True
            if found.state == UNKNOWN:  # no way to tell: let ready branches run, then park
                for _ in range(8):
                    await asyncio.sleep(0)
                return self.parkable() and not task.done()
            if found.state == READY:
                await asyncio.sleep(0)
                continue
            now = loop.time()
            if deadline is None:
                deadline = now + grace
            if now >= deadline:
                log.info(
                    "run %s parks while a branch still awaits work outside ctx after %.0fs "
                    "(park_grace); that work is cancelled and runs again when the run resumes",
                    run_id,
                    grace,
                )
                return True
            self.wake.clear()
            woken = self.wake.waiter()
            await asyncio.wait(
                {*found.futures, task, woken},
                timeout=deadline - now,
                return_when=asyncio.FIRST_COMPLETED,
            )
            woken.cancel()
        return False
