"""Whether agent code is idle: every branch waits on a durable wait, none on other work.

A run parks (its tick ends, status ``waiting``) when the agent code can make no progress
without a message or a timer. Parking cancels the agent task, and with it every branch:
fine for a branch parked on a durable wait (the next tick replays it), not for a branch
in the middle of work the log does not cover (an HTTP call made without ``ctx``, a
computation in a thread). So before parking, the tick walks the agent's tasks, from the
root down, asking of each what it waits for.

Two sources answer, in this order:

1. **What the engine was told** (:class:`Branches`). A step that parks records its task
   as parked; ``ctx.gather`` and ``ctx.task_group`` (:mod:`toren.core.agent_api.combinators`)
   record the task that joins them and the branches it waits for. Code written with
   them, the built-in loop included, is answered from these facts alone, with public
   asyncio API (``Future.done()``, ``exception()``) and nothing else.
2. **The fallback**, for a task nobody told the engine about (bare ``asyncio.gather``,
   ``asyncio.wait``, ``asyncio.wait_for``, ``asyncio.TaskGroup``, a task awaited
   directly): it reads asyncio's own bookkeeping (``Task._fut_waiter``, a gather's
   ``_children``, the locals of the combinator frames: ``self`` in
   ``TaskGroup.__aexit__``, ``fs`` in ``asyncio.wait``, ``fut`` in ``asyncio.wait_for``).
   None of it is public API: every read is guarded, and an interpreter that lays it out
   differently gives :data:`UNKNOWN`, on which the tick parks as it would with no way to
   tell (after letting ready branches run). A branch of a Toren combinator that the
   fallback cannot read is not guessed about: it is waited for as busy (until it ends or
   reaches a durable wait, up to ``park_grace``), so its work is never cut off.
   ``tests/core/asyncio_probe.py`` (also run by ``tests/core/test_branches.py``) fails,
   naming the attribute, on a Python whose asyncio no longer has what this reads.
   Verified on CPython 3.11.7, 3.12.1 and 3.13.0 (docs/agent-code.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final

from toren.core.contract.values import VerdictState

# The states of a verdict (``toren.core.contract.values.VerdictState``; mypy holds these to it).
IDLE: Final[VerdictState] = "idle"  # every branch waits on a durable wait: park now
READY: Final[VerdictState] = "ready"  # some branch can run at once: let it
BUSY: Final[VerdictState] = "busy"  # some branch awaits other work: wait for Verdict.futures
UNKNOWN: Final[VerdictState] = "unknown"  # this interpreter's asyncio is laid out otherwise


@dataclass
class Verdict:
    state: VerdictState
    futures: list[asyncio.Future[object]] = field(default_factory=list)  # what BUSY waits on
    inferred: bool = False  # the fallback read asyncio's internals for some task


@dataclass(frozen=True)
class _Join:
    """A task waiting in a Toren combinator for ``tasks``: it wakes when all are done or,
    with ``first_exception``, when one raised (``asyncio.wait``'s own contract)."""

    tasks: Sequence[asyncio.Future[object]]
    first_exception: bool

    def wakes(self) -> bool:
        if all(t.done() for t in self.tasks):
            return True
        return self.first_exception and any(
            t.done() and not t.cancelled() and t.exception() is not None for t in self.tasks
        )


class Branches:
    """What the tick knows of the agent's tasks because it was told, not because it looked:
    which task is parked on a durable wait (and on which future), which waits in a Toren
    combinator (and for which branches). Entries live exactly as long as the wait."""

    __slots__ = ("_groups", "_joins", "_parked")

    def __init__(self) -> None:
        self._parked: dict[asyncio.Task[object], asyncio.Future[object]] = {}
        self._joins: dict[asyncio.Task[object], _Join] = {}
        # The branches of the task groups a task has open, whatever the task itself
        # awaits meanwhile (its body may wait on a message while they work).
        self._groups: dict[asyncio.Task[object], list[Sequence[asyncio.Future[object]]]] = {}

    @contextmanager
    def parked(self, future: asyncio.Future[Any]) -> Iterator[None]:
        """Around the current task's ``await future``, a durable wait (a parked step)."""
        task = asyncio.current_task()
        if task is None:  # not in a task: nothing to walk to
            yield
            return
        self._parked[task] = future
        try:
            yield
        finally:
            self._parked.pop(task, None)

    @contextmanager
    def joining(
        self, tasks: Sequence[asyncio.Future[object]], *, first_exception: bool
    ) -> Iterator[None]:
        """Around the current task's wait for ``tasks`` (all of them or, with
        ``first_exception``, until one raises) in a Toren combinator."""
        task = asyncio.current_task()
        if task is None:
            yield
            return
        outer = self._joins.get(task)
        self._joins[task] = _Join(tasks, first_exception)
        try:
            yield
        finally:
            if outer is None:
                self._joins.pop(task, None)
            else:
                self._joins[task] = outer

    def open_group(
        self, owner: asyncio.Task[object], tasks: Sequence[asyncio.Future[object]]
    ) -> None:
        """``owner`` entered a task group whose branches are (and will be) ``tasks``."""
        self._groups.setdefault(owner, []).append(tasks)

    def close_group(
        self, owner: asyncio.Task[object], tasks: Sequence[asyncio.Future[object]]
    ) -> None:
        groups = self._groups.get(owner, [])
        if any(g is tasks for g in groups):
            groups[:] = [g for g in groups if g is not tasks]
        if not groups:
            self._groups.pop(owner, None)

    def owned(self, task: asyncio.Task[object]) -> list[asyncio.Future[object]]:
        """The unfinished branches of the task groups ``task`` has open."""
        return [t for group in self._groups.get(task, ()) for t in group if not t.done()]

    def held(self) -> int:
        """How many tasks the engine holds facts about (0 once every branch unwound)."""
        return len(self._parked) + len(self._joins) + len(self._groups)

    def tasks(self) -> set[asyncio.Future[object]]:
        """Every task the facts name: parked, joining, the branches joined, the owners of
        open task groups and their branches."""
        found: set[asyncio.Future[object]] = {*self._parked, *self._joins, *self._groups}
        for join in self._joins.values():
            found.update(join.tasks)
        for groups in self._groups.values():
            for group in groups:
                found.update(group)
        return found

    def fact(self, task: asyncio.Task[object]) -> tuple[bool, list[asyncio.Future[object]]] | None:
        """``(ready, branches to look at)`` for a task the engine was told about, or None.
        A parked task whose future is done (cancelled: the run stops) is ready; so is a
        joining task whose wait is over. Otherwise a parked task is idle, and a joining
        one is as idle as its unfinished branches."""
        future = self._parked.get(task)
        if future is not None:
            return future.done(), []
        join = self._joins.get(task)
        if join is not None:
            return join.wakes(), [t for t in join.tasks if not t.done()]
        return None


_MISSING = object()
_WAITER = "_fut_waiter"  # the future a CPython task is blocked on (None: ready to run)
_CHILDREN = "_children"  # the futures an asyncio.gather future waits for


def _combinator_children(frame: FrameType) -> list[object] | None:
    """The futures an asyncio combinator frame is waiting for, or None (not a combinator,
    or not laid out as expected: the walk then goes on down the await chain)."""
    code = frame.f_code
    if code is _TASKGROUP_EXIT:
        tasks = getattr(frame.f_locals.get("self"), "_tasks", None)
        found = list(tasks) if tasks is not None else None
    elif code in _WAIT_CODES:
        fs = frame.f_locals.get("fs")
        found = list(fs) if fs is not None else None
    elif code is _WAIT_FOR:
        fut = frame.f_locals.get("fut")
        found = [fut] if fut is not None else None
    else:
        return None
    # Futures only: a coroutine here (wait_for awaiting one in place, as later Pythons
    # do) is not a branch of its own; its frames follow on the same chain.
    if found is None or not all(isinstance(f, asyncio.Future) for f in found):
        return None
    return found


def _frames(task: asyncio.Task[object]) -> Iterator[FrameType]:
    """The frames of a task's await chain, outermost first."""
    coro: object = task.get_coro()
    seen = 0
    while coro is not None and seen < 1000:
        seen += 1
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)


def verdict(
    root: asyncio.Task[object],
    durable: Callable[[asyncio.Future[Any]], bool],
    known: Branches | None = None,
) -> Verdict:
    """Walk the tasks under ``root``. ``known`` holds what the engine was told (parked
    steps, Toren combinators); for any other task the fallback reads asyncio's internals,
    where ``durable(f)`` says whether future ``f`` is a branch's durable wait."""
    busy: list[asyncio.Future[object]] = []
    todo: list[object] = [root]
    seen: set[int] = set()
    joined: set[int] = set()  # branches of a Toren combinator
    inferred = False
    while todo:
        item = todo.pop()
        if id(item) in seen or not isinstance(item, asyncio.Future) or item.done():
            continue
        seen.add(id(item))
        if known is not None and isinstance(item, asyncio.Task):
            owned = known.owned(item)  # its open groups' branches, whatever it awaits
            todo.extend(owned)
            joined.update(map(id, owned))
        fact = known.fact(item) if known is not None and isinstance(item, asyncio.Task) else None
        if fact is not None:
            ready, branches = fact
            if ready:
                return Verdict(READY, inferred=inferred)
            todo.extend(branches)
            joined.update(map(id, branches))
            continue
        inferred = True
        if not isinstance(item, asyncio.Task):  # a plain future some branch waits on
            if durable(item):
                continue
            children = getattr(item, _CHILDREN, None)  # asyncio.gather's future
            if children is not None:
                todo.extend(children)
            else:
                busy.append(item)
            continue
        waiter: Any = getattr(item, _WAITER, _MISSING)
        if waiter is _MISSING:
            if id(item) in joined:  # a branch the engine knows, at work it cannot see:
                busy.append(item)  # wait for it to end or reach a durable wait
                continue
            return Verdict(UNKNOWN, inferred=True)
        if waiter is None:
            return Verdict(READY, inferred=True)
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
    if busy:
        return Verdict(BUSY, busy, inferred=inferred)
    return Verdict(IDLE, inferred=inferred)


def _code(obj: object) -> object:
    return getattr(obj, "__code__", None)


_TASKGROUP_EXIT = _code(asyncio.TaskGroup.__aexit__)
_WAIT_CODES = {c for c in (_code(asyncio.wait), _code(getattr(asyncio.tasks, "_wait", None))) if c}
_WAIT_FOR = _code(asyncio.wait_for)
