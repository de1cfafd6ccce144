"""Whether agent code is idle: every branch waits on a durable wait, none on other work.

A run parks (its tick ends, status ``waiting``) when the agent code can make no progress
without a message or a timer. Parking cancels the agent task, and with it every branch:
fine for a branch parked on a durable wait (the next tick replays it), not for a branch
in the middle of work the log does not cover (an HTTP call made without ``ctx``, a
computation in a thread). So before parking, the tick walks the agent's tasks: what each
awaits, through ``asyncio.gather``, ``asyncio.wait``, ``asyncio.wait_for``, task groups
and awaited tasks, down to the futures they block on.

This reads asyncio's own bookkeeping (``Task._fut_waiter``, a gather's children, the
locals of the combinator frames): none of it is public API, so every read is guarded and
an interpreter that lays it out differently gives :data:`UNKNOWN`, on which the tick
parks as it would with no way to tell (after letting ready branches run).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

IDLE = "idle"  # every branch waits on a durable wait: park now
READY = "ready"  # some branch can run at once: let it
BUSY = "busy"  # some branch awaits other work: wait for it (see Verdict.futures)
UNKNOWN = "unknown"  # this interpreter's asyncio is not laid out as expected


@dataclass
class Verdict:
    state: str
    futures: list[asyncio.Future[Any]] = field(default_factory=list)  # what BUSY waits on


_MISSING = object()


def _combinator_children(frame: FrameType) -> list[Any] | None:
    """The awaitables an asyncio combinator frame is waiting for, or None."""
    code = frame.f_code
    local = frame.f_locals
    if code is _TASKGROUP_EXIT:
        group = local.get("self")
        tasks = getattr(group, "_tasks", None)
        return list(tasks) if tasks is not None else None
    if code in _WAIT_CODES:
        fs = local.get("fs")
        return list(fs) if fs is not None else None
    if code is _WAIT_FOR:
        fut = local.get("fut")
        return [fut] if fut is not None else None
    return None


def _frames(task: asyncio.Task[Any]) -> Iterator[FrameType]:
    """The frames of a task's await chain, outermost first."""
    coro: Any = task.get_coro()
    seen = 0
    while coro is not None and seen < 1000:
        seen += 1
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def verdict(root: asyncio.Task[Any], durable: Callable[[asyncio.Future[Any]], bool]) -> Verdict:
    """Walk the tasks under ``root``. ``durable(f)`` says whether future ``f`` is a branch's
    durable wait (a parked message wait or timer)."""
    busy: list[asyncio.Future[Any]] = []
    todo: list[Any] = [root]
    seen: set[int] = set()
    while todo:
        item = todo.pop()
        if id(item) in seen or not isinstance(item, asyncio.Future) or item.done():
            continue
        seen.add(id(item))
        if not isinstance(item, asyncio.Task):  # a plain future some branch waits on
            if durable(item):
                continue
            children = getattr(item, "_children", None)  # asyncio.gather's future
            if children is not None:
                todo.extend(children)
            else:
                busy.append(item)
            continue
        waiter: Any = getattr(item, "_fut_waiter", _MISSING)
        if waiter is _MISSING:
            return Verdict(UNKNOWN)
        if waiter is None:
            return Verdict(READY)
        if durable(waiter):
            continue
        # A combinator (task group, asyncio.wait, wait_for) waits for the awaitables in
        # its frame; anything else is the branch's own work.
        for frame in _frames(item):
            children = _combinator_children(frame)
            if children is not None:
                todo.extend(children)
                break
        else:
            todo.append(waiter)
    return Verdict(BUSY, busy) if busy else Verdict(IDLE)


def _code(obj: Any) -> Any:
    return getattr(obj, "__code__", None)


_TASKGROUP_EXIT = _code(asyncio.TaskGroup.__aexit__)
_WAIT_CODES = {c for c in (_code(asyncio.wait), _code(getattr(asyncio.tasks, "_wait", None))) if c}
_WAIT_FOR = _code(asyncio.wait_for)
