"""Live event streams over Server-Sent Events.

The event log is the source of truth: a stream reads the store after the last seq it
delivered and uses the :class:`~toren.core.drivers.live.LiveHub` only to wake up early and to
forward token deltas. Whatever the hub drops (a full queue, a worker in another process),
the next read of the store catches up, so every event is delivered exactly once and in
order, also across reconnects (``Last-Event-ID`` is the last delivered seq).

Wire format (``text/event-stream``)::

    id: 42                      an event of the log; id = its seq
    event: event
    data: {...Event JSON...}

    event: delta                a token delta of a model call in flight (no id)
    data: {"stream": "main", "position": 3, "text": "Hel"}

    event: replayed             a tick replayed this recorded step from the log (no id)
    data: {"stream": "main", "position": 2, "seq": 7}

    : heartbeat                 a comment, at least every ``heartbeat`` seconds

    event: end                  the run ended; the last message of the stream
    data: {"run": {...Run JSON...}}

The stream ends on the terminal event of the run's *current* attempt: a ``RunFailed``
followed by a ``RunRetried`` (``POST /v1/runs/{id}/retry``) belongs to an earlier attempt,
and the stream goes on with the new one.

    event: error                the stream cannot continue (e.g. an unknown resume id)
    data: {"error": {"code": "...", "message": "..."}}
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from toren.core.contract.events import (
    TERMINAL_TYPES,
    Event,
    ModelCallCutOff,
    ModelCallRecorded,
)
from toren.core.contract.ports import RunStore
from toren.core.drivers.live import LiveHub
from toren.redact import Redactor, StreamRedactor

log = logging.getLogger("toren.api")

PAGE = 500  # events read from the store per query


@dataclass(frozen=True)
class StreamSettings:
    heartbeat: float = 15.0  # seconds of silence before a heartbeat comment
    poll_interval: float = 1.0  # store re-read when no wake-up came (worker elsewhere)
    retry_ms: int = 1000  # the reconnection delay suggested to EventSource clients


def message(event: str | None, data: object, id: int | None = None) -> bytes:
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    # Compact JSON has no raw newlines (they are escaped inside strings): one data line.
    lines.append("data: " + json.dumps(data, ensure_ascii=False, separators=(",", ":")))
    return ("\n".join(lines) + "\n\n").encode()


def error_message(code: str, text: str) -> bytes:
    return message("error", {"error": {"code": code, "message": text}})


@dataclass
class _StepText:
    """A step's live text so far: the redactor its deltas go through, and the raw pieces
    fed to it (the recorded event may have to finish them, see :meth:`RunStream._event`)."""

    redactor: StreamRedactor
    fed: list[str] = field(default_factory=list)


def _recorded_text(event: Event) -> str | None:
    """The text a recorded model call answered, raw (before redaction), if it has one."""
    payload = event.payload
    if isinstance(payload, ModelCallRecorded) and isinstance(payload.response, dict):
        text = payload.response.get("text")
        return text if isinstance(text, str) else None
    return None


async def resume_problem(store: RunStore, run_id: str, after: int) -> str | None:
    """Why ``after`` is not a valid resume point of this run, or None when it is.

    A valid point is 0 (from the start) or the seq of one of this run's events. Anything
    else (a seq of another run, a seq past the end of a finished run, a made-up number)
    would silently skip or miss events, so it is refused."""
    if after == 0:
        return None
    found = await store.load_events(run_id, after_seq=after - 1, limit=1)
    if found and found[0].seq == after:
        return None
    return (
        f"event id {after} is not an event of run {run_id!r}; resume from an id this "
        "stream delivered, or from 0 to replay the run's whole log"
    )


class RunStream:
    """One client's stream of one run. Iterate :meth:`body` for the SSE bytes."""

    def __init__(
        self,
        store: RunStore,
        run_id: str,
        after: int,
        *,
        live: LiveHub | None,
        redact: Redactor,
        settings: StreamSettings,
        closing: Callable[[], bool],
        problem: str | None = None,
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.last = after
        self.live = live
        self.redact = redact
        self.settings = settings
        self.closing = closing
        self.problem = problem
        self._recorded: set[tuple[str, int]] = set()  # steps delivered: their deltas are stale
        self._snapshot: list[tuple[str, int, str]] = []
        # One redactor per step in flight (a secret may be split across its deltas), with
        # the raw text fed to it: when the step's recorded event overtakes its last
        # deltas, the rest of the text comes from the event (see :meth:`_event`).
        self._steps: dict[tuple[object, object], _StepText] = {}
        self._last_write = time.monotonic()
        # Whether the last terminal event delivered is not followed by a RunRetried: the
        # current attempt has ended. Kept across pages and wake-ups.
        self._ended = False

    async def body(self) -> AsyncIterator[bytes]:
        # Subscribe before the first read: a wake-up between the read and the wait is kept.
        queue = self.live.subscribe(self.run_id) if self.live is not None else None
        # In the same turn as the subscription: the queue holds what comes after this.
        partial = getattr(self.live, "partial", None)
        self._snapshot = partial(self.run_id) if partial is not None else []
        try:
            yield f"retry: {self.settings.retry_ms}\n\n".encode()
            if self.problem is not None:
                yield error_message("event_id_unavailable", self.problem)
                return
            async for chunk in self._follow(queue):
                self._last_write = time.monotonic()
                yield chunk
        except Exception:
            log.exception("event stream of run %s failed", self.run_id)
            yield error_message("internal_error", "the stream failed on the server; reconnect")
        finally:
            if queue is not None and self.live is not None:
                self.live.unsubscribe(self.run_id, queue)

    async def _follow(self, queue: asyncio.Queue[dict[str, object]] | None) -> AsyncIterator[bytes]:
        check_row = True
        while not self.closing():
            # The row is read before the events: a run's terminal status is committed
            # with its last events, so once the row says terminal, the read below has all.
            row_ended = False
            if check_row:
                run = await self.store.get_run(self.run_id)
                row_ended = run is None or run.terminal
            batch = await self.store.load_events(self.run_id, after_seq=self.last, limit=PAGE)
            for event in batch:
                yield self._event(event)
                if event.type in TERMINAL_TYPES:
                    self._ended = True
                elif event.type == "RunRetried":
                    # A new attempt: the terminal event before it (and a row read before
                    # it) no longer ends the stream.
                    self._ended = row_ended = False
            if len(batch) == PAGE:
                check_row = False
                continue
            if self._ended or row_ended:
                end = await self._end()
                if end is not None:
                    yield end
                    return
                self._ended, check_row = False, True  # retried meanwhile: read on
                continue
            # A model call already streaming when this reader came: its text so far,
            # as one delta, before the deltas that follow it.
            # Through the step's redactor, as every delta: a secret may sit in it.
            for stream, position, text in self._snapshot:
                if (stream, position) not in self._recorded:
                    snapshot = self._delta({"stream": stream, "position": position, "text": text})
                    if snapshot is not None:
                        yield snapshot
            self._snapshot = []
            items, check_row = await self._wait(queue)
            for item in items:
                if item.get("type") == "status":
                    check_row = True
                elif (live := self._live(item)) is not None:
                    yield live
            if time.monotonic() - self._last_write >= self.settings.heartbeat:
                yield b": heartbeat\n\n"

    def _live(self, item: dict[str, object]) -> bytes | None:
        """What an item of the live hub's queue sends, if anything."""
        kind = item.get("type")
        if kind == "delta" and self._fresh(item):
            return self._delta(item)
        if kind == "replayed":
            return message("replayed", {k: item.get(k) for k in ("stream", "position", "seq")})
        if kind == "event" and isinstance(
            cut := getattr(item.get("event"), "payload", None), ModelCallCutOff
        ):
            # The call was cut off and its step runs again from its first delta: what the
            # step's redactor held back belongs to the dead attempt. Dropped, not sent;
            # the new attempt starts with a fresh redactor (a held ``sk-`` joined to its
            # first words would hide them, or a held prefix would prepend stale text).
            # Reset here, in the queue's order, not when the event is read from the
            # store: the dead attempt's last deltas may still wait in the queue then, and
            # would become the start of the new attempt's text.
            self._steps.pop((cut.stream, cut.position), None)
        return None

    def _delta(self, item: dict[str, object]) -> bytes | None:
        """A delta's text through its step's :class:`StreamRedactor`: the part that is
        safe to send now (None when all of it is held back)."""
        step = (item.get("stream"), item.get("position"))
        held = self._steps.get(step)
        if held is None:
            held = self._steps[step] = _StepText(StreamRedactor(self.redact))
        piece = str(item.get("text") or "")
        held.fed.append(piece)
        text = held.redactor.feed(piece)
        if not text:
            return None
        return message("delta", {"stream": step[0], "position": step[1], "text": text})

    def _event(self, event: Event) -> bytes:
        self.last = event.seq
        held = b""
        if event.position is not None:
            step = (event.stream, event.position)
            self._recorded.add(step)
            # The step's text is complete: what its redactor held back goes out (redacted),
            # so the deltas still add up to the recorded text.
            step_text = self._steps.pop(step, None)
            rest = ""
            if step_text is not None:
                # The recorded event can overtake the step's last deltas (they wait in the
                # queue while the store is read; they are dropped as stale after it). What
                # the redactor holds back is then the start of a secret whose end it never
                # saw: flushed alone it would go out in clear. The recorded text's rest
                # goes through the redactor first, so the secret is judged whole. When
                # there is no such text to finish it with (a call that failed mid-stream,
                # deltas that are not the start of the recorded text), what is held back
                # is dropped, never sent: the event itself carries the redacted record.
                whole, fed = _recorded_text(event), "".join(step_text.fed)
                if whole is not None and whole.startswith(fed):
                    redactor = step_text.redactor
                    rest = redactor.feed(whole[len(fed) :]) + redactor.flush()
            if rest:
                held = message("delta", {"stream": step[0], "position": step[1], "text": rest})
        return held + message("event", self.redact(event.to_dict()), id=event.seq)

    def _fresh(self, delta: dict[str, object]) -> bool:
        return (delta.get("stream"), delta.get("position")) not in self._recorded

    async def _end(self) -> bytes | None:
        """The ``end`` message, or None when the run is no longer terminal (it was retried
        since the events were read: its RunRetried is in the log by now)."""
        run = await self.store.get_run(self.run_id)
        if run is not None and not run.terminal:
            return None
        return message("end", {"run": self.redact(run.to_dict()) if run is not None else None})

    async def _wait(
        self, queue: asyncio.Queue[dict[str, object]] | None
    ) -> tuple[list[dict[str, object]], bool]:
        """Wait for a wake-up, a poll or a heartbeat. Returns the hub's items and whether
        the run row should be re-read (on a poll: the worker may be elsewhere)."""
        quiet = time.monotonic() - self._last_write
        timeout = max(0.0, min(self.settings.poll_interval, self.settings.heartbeat - quiet))
        if queue is None:
            await asyncio.sleep(timeout)
            return [], True
        try:
            first = await asyncio.wait_for(queue.get(), timeout)
        except TimeoutError:
            return [], True
        items = [first]
        while not queue.empty():
            items.append(queue.get_nowait())
        return items, False
