"""Durable combinators: ``ctx.gather`` and ``ctx.task_group``, branches the engine knows.

A run parks only when every branch of its agent code waits on a durable wait (see
:mod:`toren.core.agent_api.branches`). Branches started here are recorded with the tick: the task
that joins them while it waits for them, and a task group's branches from the moment it is
opened (its body may wait on a message while they work). For code that uses them, "every
branch waits durably" is a fact the engine holds, not something it infers from asyncio's
private state.

Positions: a branch takes its steps' positions in its first slice, before its first
await, and tasks first run in the order they were created. Both combinators create their
tasks exactly as ``asyncio.gather`` and ``asyncio.TaskGroup`` do (one task per
awaitable, in argument or ``create_task`` order, at the same moment), so replacing one by
the other gives every step the position it had: recorded runs replay unchanged.

A branch may await anything, not only ``ctx`` steps (an HTTP call, a thread, a bare
``asyncio.gather``). The engine was not told about such a wait; it falls back to reading
asyncio's bookkeeping for that branch alone, and waits while the branch is busy outside
``ctx`` (up to ``park_grace``, as anywhere else). Where that bookkeeping cannot be read,
the branch is waited for as busy all the same: it is known to exist and not to be parked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Generator, Sequence
from contextvars import Context as _VarsContext
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, overload

from toren.core.agent_api.branches import Branches

__all__ = ["Gathering", "TaskGroup", "gather"]

T = TypeVar("T")


class Gathering(Generic[T]):
    """What ``ctx.gather(...)`` returns: its branches already started, their results once
    awaited (once, like a coroutine)."""

    __slots__ = ("_branches", "_return_exceptions", "_started", "_tasks")

    def __init__(
        self,
        tasks: list[asyncio.Future[Any]],
        branches: Branches | None,
        return_exceptions: bool,
    ) -> None:
        self._tasks = tasks
        self._branches = branches if branches is not None else Branches()
        self._return_exceptions = return_exceptions
        self._started = False

    def __await__(self) -> Generator[Any, None, list[T]]:
        if self._started:
            raise RuntimeError("a ctx.gather(...) can be awaited once; keep its result")
        self._started = True
        return self._join().__await__()

    async def _join(self) -> list[Any]:
        tasks = self._tasks
        if not tasks:
            return []
        cancelled: asyncio.CancelledError | None = None
        stopped_by: set[asyncio.Future[Any]] = set()
        try:
            stopped_by = await self._until_stopped()
        except asyncio.CancelledError as exc:  # the engine parks, drains or stops the run
            cancelled = exc
        error = _first_error(tasks, stopped_by, self._return_exceptions)
        if cancelled is None and error is None:
            return [_outcome(t) if self._return_exceptions else t.result() for t in tasks]
        cancelled = await self._cancel_and_wait() or cancelled
        error = _first_error(tasks, stopped_by, self._return_exceptions)
        # An abort wins over a cancellation; an ordinary error does not: an ``except
        # Exception`` in agent code must never swallow the cancellation of its task.
        if error is not None and (cancelled is None or not isinstance(error, Exception)):
            raise error
        assert cancelled is not None
        raise cancelled

    async def _until_stopped(self) -> set[asyncio.Future[Any]]:
        """Wait until every branch is done or one stops the others; the branches that did
        (they finished in the wait that ended with an error)."""
        pending: Sequence[asyncio.Future[Any]] = self._tasks
        while pending:
            with self._branches.joining(pending, first_exception=True):
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            if _first_error(list(done), (), self._return_exceptions) is not None:
                return done
            pending = [t for t in pending if not t.done()]
        return set()

    async def _cancel_and_wait(self) -> asyncio.CancelledError | None:
        """Cancel the branches and wait until every one has finished unwinding, even if
        this task is cancelled meanwhile (that cancellation is returned): none may
        outlive the gather."""
        for task in self._tasks:
            task.cancel()
        interrupted = None
        while unfinished := [task for task in self._tasks if not task.done()]:
            try:
                with self._branches.joining(unfinished, first_exception=False):
                    await asyncio.wait(unfinished)
            except asyncio.CancelledError as exc:
                interrupted = exc
        return interrupted


@overload
def gather(
    *aws: Awaitable[T], return_exceptions: Literal[False] = False, branches: Branches | None = None
) -> Gathering[T]: ...


@overload
def gather(
    *aws: Awaitable[T], return_exceptions: bool, branches: Branches | None = None
) -> Gathering[T | BaseException]: ...


def gather(
    *aws: Awaitable[Any], return_exceptions: bool = False, branches: Branches | None = None
) -> Gathering[Any]:
    """Start ``aws`` as branches now, in order (as ``asyncio.gather`` does); await the
    result for their results in that order.

    As soon as one raises, the others are cancelled and awaited, then that error is raised
    as itself (not in an exception group): no sibling outlives the gather to go on
    working (sending an email) after the run failed or parked. ``return_exceptions=True``
    returns ordinary errors (``Exception``) in place instead; an abort (a
    ``BaseException`` that is not an ``Exception``: the engine stopping the run,
    ``RunCancelledSignal``) is never returned as a value. A branch cancelled on its own is
    not an error that stops the others; the gather raises ``CancelledError`` once all are
    done (or returns it in place with ``return_exceptions``)."""
    futures: dict[int, asyncio.Future[Any]] = {}
    tasks: list[asyncio.Future[Any]] = []
    for aw in aws:
        # The same awaitable twice is one branch, as in asyncio.gather.
        fut = futures.get(id(aw))
        if fut is None:
            fut = futures[id(aw)] = asyncio.ensure_future(aw)
        tasks.append(fut)
    return Gathering(tasks, branches, return_exceptions)


class TaskGroup:
    """``async with ctx.task_group() as tg: tg.create_task(...)``: an ``asyncio.TaskGroup``
    (same creation order, same cancellation of the body and the siblings on a failure,
    same ``ExceptionGroup``) whose branches the engine knows. One difference: an abort (a
    ``BaseException`` that is not an ``Exception``, such as the engine stopping the run or
    ``RunCancelledSignal``) is raised as itself, as asyncio does for ``SystemExit`` and
    ``KeyboardInterrupt``, never inside a group an ``except*`` could take apart."""

    __slots__ = ("_branches", "_group", "_owner", "_tasks")

    def __init__(self, branches: Branches | None = None) -> None:
        self._branches = branches if branches is not None else Branches()
        self._group = asyncio.TaskGroup()
        self._tasks: list[asyncio.Task[Any]] = []
        self._owner: asyncio.Task[Any] | None = None

    async def __aenter__(self) -> TaskGroup:
        await self._group.__aenter__()
        # While open, the group's branches are the body's task's branches, whatever the
        # body awaits meanwhile (a message, say: the branches may still be at work).
        self._owner = asyncio.current_task()
        if self._owner is not None:
            self._branches.open_group(self._owner, self._tasks)
        return self

    def create_task(
        self,
        coro: Coroutine[Any, Any, T],
        *,
        name: str | None = None,
        context: _VarsContext | None = None,
    ) -> asyncio.Task[T]:
        task = self._group.create_task(coro, name=name, context=context)
        self._tasks.append(task)
        return task

    async def __aexit__(
        self,
        et: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if et is None:
            try:
                await self._until_stopped()
            except asyncio.CancelledError as cancelled:
                # asyncio.TaskGroup cancels its parent when a branch fails (or the run
                # is stopped): hand that on, as if the body had been cancelled.
                et, exc, tb = type(cancelled), cancelled, cancelled.__traceback__
        try:
            with self._branches.joining(self._tasks, first_exception=False):
                await self._group.__aexit__(et, exc, tb)
        except BaseExceptionGroup as group:
            abort = next((e for e in group.exceptions if not isinstance(e, Exception)), None)
            if abort is None:
                raise
            raise abort from None
        finally:
            if self._owner is not None:
                self._branches.close_group(self._owner, self._tasks)

    async def _until_stopped(self) -> None:
        """The body is over: wait, as the engine can see, until every branch (branches
        may start branches) is done or one failed."""
        while pending := [t for t in self._tasks if not t.done()]:
            with self._branches.joining(pending, first_exception=True):
                await asyncio.wait(pending, return_when=asyncio.FIRST_EXCEPTION)
            if any(t.done() and not t.cancelled() and t.exception() for t in self._tasks):
                return


def _outcome(task: asyncio.Future[Any]) -> Any:
    """A branch's result, or its error in place (``return_exceptions``)."""
    if task.cancelled():
        return asyncio.CancelledError()
    return task.exception() or task.result()


def _first_error(
    tasks: Sequence[asyncio.Future[Any]],
    stopped_by: Sequence[asyncio.Future[Any]] | set[asyncio.Future[Any]],
    return_exceptions: bool,
) -> BaseException | None:
    """The error that stops a gather: an abort (a BaseException that is not an Exception)
    before an ordinary error (none with ``return_exceptions``); among those, one of the
    branches that stopped it (``stopped_by``) before one raised while unwinding; then the
    order of the branches. Cancellations are not errors here."""
    first = set(stopped_by)
    errors = [
        exc
        for task in sorted(tasks, key=lambda task: task not in first)  # stable: call order
        if task.done() and not task.cancelled() and (exc := task.exception()) is not None
    ]
    aborts = [exc for exc in errors if not isinstance(exc, Exception)]
    if return_exceptions:
        return aborts[0] if aborts else None
    return (aborts or errors)[0] if errors else None
