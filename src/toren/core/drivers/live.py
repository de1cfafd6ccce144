"""The live feed: events and token deltas of running runs, fanned out in-process to
subscribers (the SSE endpoint, ``toren run``'s live view). Best effort by design: the
event log is the source of truth, and readers catch up from it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from toren.core.contract.events import ModelCallCutOff

ALL = "*"


class LiveHub:
    def __init__(self, maxsize: int = 10_000) -> None:
        self._subs: dict[str, set[asyncio.Queue[dict[str, object]]]] = defaultdict(set)
        self._maxsize = maxsize
        # The text streamed so far by each model call in flight, by run and (stream,
        # position): a reader that subscribes mid-stream starts from the whole partial
        # answer, not mid-sentence. Dropped when the step is recorded or the tick ends.
        self._partial: dict[str, dict[tuple[str, int], str]] = {}

    def partial(self, run_id: str) -> list[tuple[str, int, str]]:
        """(stream, position, text so far) of the run's model calls in flight. Taken in
        the same turn of the loop as :meth:`subscribe`, it and the queue's deltas join
        without a gap or an overlap."""
        return [(s, p, text) for (s, p), text in self._partial.get(run_id, {}).items()]

    def _track(self, run_id: str, item: dict[str, Any]) -> None:
        kind = item.get("type")
        if kind == "delta":
            key = (str(item.get("stream")), int(item.get("position") or 0))
            texts = self._partial.setdefault(run_id, {})
            texts[key] = texts.get(key, "") + str(item.get("text") or "")
        elif kind == "event" and run_id in self._partial:
            event = item.get("event")
            position = getattr(event, "position", None)
            if position is not None:
                self._partial[run_id].pop((getattr(event, "stream", ""), position), None)
            elif isinstance(payload := getattr(event, "payload", None), ModelCallCutOff):
                # A run-level event naming the step whose call was cut off: its text so
                # far will never be recorded, and a reader arriving now must not see it.
                self._partial[run_id].pop((payload.stream, payload.position), None)
        elif kind in ("status", "stalled"):
            self._partial.pop(run_id, None)

    def publish(self, run_id: str, item: dict[str, object]) -> None:
        self._track(run_id, item)
        for key in (run_id, ALL):
            for queue in list(self._subs.get(key, ())):
                if queue.full():
                    continue  # a slow reader falls back to the log; never block a run
                queue.put_nowait({"run_id": run_id, **item})

    def subscribe(self, run_id: str = ALL) -> asyncio.Queue[dict[str, Any]]:
        queue: asyncio.Queue[dict[str, object]] = asyncio.Queue(self._maxsize)
        self._subs[run_id].add(queue)
        return queue

    def unsubscribe(self, run_id: str, queue: asyncio.Queue[dict[str, object]]) -> None:
        self._subs[run_id].discard(queue)
        if not self._subs[run_id]:
            del self._subs[run_id]

    __call__ = publish
