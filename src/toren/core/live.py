"""The live feed: events and token deltas of running runs, fanned out in-process to
subscribers (the SSE endpoint, ``toren run``'s live view). Best effort by design: the
event log is the source of truth, and readers catch up from it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

ALL = "*"


class LiveHub:
    def __init__(self, maxsize: int = 10_000) -> None:
        self._subs: dict[str, set[asyncio.Queue[dict[str, Any]]]] = defaultdict(set)
        self._maxsize = maxsize

    def publish(self, run_id: str, item: dict[str, Any]) -> None:
        for key in (run_id, ALL):
            for queue in list(self._subs.get(key, ())):
                if queue.full():
                    continue  # a slow reader falls back to the log; never block a run
                queue.put_nowait({"run_id": run_id, **item})

    def subscribe(self, run_id: str = ALL) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(self._maxsize)
        self._subs[run_id].add(queue)
        return queue

    def unsubscribe(self, run_id: str, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._subs[run_id].discard(queue)
        if not self._subs[run_id]:
            del self._subs[run_id]

    __call__ = publish
