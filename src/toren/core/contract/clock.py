"""Clocks. The engine asks a clock for the time and to sleep, never ``time`` directly, so
tests can drive time by hand."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        """Seconds for intervals (latencies, the flush cadence): never goes back. A clock
        without it gets the process's (:func:`monotonic_of`)."""
        return time.perf_counter()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))


class ManualClock:
    """A clock that moves only when told. ``sleep`` waits until ``advance`` passes it."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._moved = asyncio.Condition()

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    async def advance(self, seconds: float) -> None:
        self._now += seconds
        async with self._moved:
            self._moved.notify_all()

    async def sleep(self, seconds: float) -> None:
        until = self._now + seconds
        async with self._moved:
            await self._moved.wait_for(lambda: self._now >= until)


def monotonic_of(clock: Clock) -> Callable[[], float]:
    """The clock's monotonic time (seconds, for intervals), or the process's when a clock
    of the host's own has none."""
    found = getattr(clock, "monotonic", None)
    return found if callable(found) else time.perf_counter
