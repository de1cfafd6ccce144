"""Whether this Python's asyncio still has what ``toren.core.agent_api.branches``' fallback reads.

One check per private read (``Task._fut_waiter``, a gather's ``_children``, the frame
locals of ``TaskGroup.__aexit__``, ``asyncio.wait`` and ``asyncio.wait_for``,
``loop._ready``), each returning the problem in words that name the attribute; the
walk over every combinator the fallback sees through; and the semantics of
``ctx.task_group`` (which wraps ``asyncio.TaskGroup``) and ``ctx.gather``. ``tests/core/test_branches.py``
runs each check as a test; run alone it needs nothing but the standard library, so it
checks a Python Toren's dependencies are not installed for::

    ~/.pyenv/versions/3.13.0/bin/python tests/core/asyncio_probe.py

(exit status 1 and one line per problem when something changed).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType
from typing import Any


def _load(alone: bool) -> tuple[ModuleType, ModuleType]:
    """``toren.core.agent_api.branches`` and ``toren.core.agent_api.combinators``: imported as usual under
    pytest; alone, from this tree's ``src`` without running ``toren/__init__`` (whose
    dependencies another Python may not have), through bare package modules."""
    if alone:
        src = Path(__file__).parents[2] / "src"
        for name in ("toren", "toren.core"):
            package = ModuleType(name)
            package.__path__ = [str(src.joinpath(*name.split(".")))]
            sys.modules[name] = package
    from toren.core.agent_api import branches, combinators

    return branches, combinators


branches, combinators = _load(__name__ == "__main__")
PY = f"{sys.implementation.name} {sys.version.split()[0]}"
_ABSENT = object()


def changed(what: str) -> str:
    return (
        f"asyncio on {PY} no longer has {what}, which toren.core.agent_api.branches' fallback reads "
        "to see through bare asyncio combinators: there they now park by the UNKNOWN path. "
        "Update core/agent_api/branches.py and the verified versions in docs/agent-code.md."
    )


class Waits:
    """Durable waits as the tick makes them: futures it knows, resolved only by parking."""

    def __init__(self) -> None:
        self.futures: set[asyncio.Future[Any]] = set()

    async def wait(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self.futures.add(fut)
        await fut

    def verdict(self, task: asyncio.Task[Any]) -> str:
        state: str = branches.verdict(task, self.futures.__contains__).state
        return state


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def _verdict_of(make: Callable[[Waits], Awaitable[Any]]) -> str:
    waits = Waits()
    before = asyncio.all_tasks()
    task = asyncio.ensure_future(make(waits))
    await settle()
    try:
        return waits.verdict(task)
    finally:
        await _cancel_new(before)


async def _cancel_new(before: set[asyncio.Task[Any]]) -> None:
    """Cancel the tasks a check made (asyncio.wait does not cancel what it waited for)."""
    made = asyncio.all_tasks() - before - {asyncio.current_task()}
    for task in made:
        task.cancel()
    await asyncio.gather(*made, return_exceptions=True)


async def _await(aw: Awaitable[Any]) -> Any:
    return await aw


# -- one check per private read ------------------------------------------------------------


async def task_fut_waiter() -> str | None:
    fut = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(_await(fut))
    if getattr(task, branches._WAITER, _ABSENT) is not None:
        return changed("Task._fut_waiter (None while a task is ready to run)")
    await settle()
    if getattr(task, branches._WAITER, _ABSENT) is not fut:
        return changed("Task._fut_waiter (the future a blocked task awaits)")
    fut.set_result(None)
    await task
    return None


async def gather_children() -> str | None:
    loop = asyncio.get_running_loop()
    children = [loop.create_future(), loop.create_future()]
    outer = asyncio.gather(*children)
    found = list(getattr(outer, branches._CHILDREN, ()))
    for child in children:
        child.set_result(None)
    await outer
    return None if found == children else changed("the _children of asyncio.gather's future")


async def _frame_children(make: Callable[[Waits], Awaitable[Any]], code: Any, what: str) -> Any:
    if code is None:
        return changed(what)
    waits = Waits()
    before = asyncio.all_tasks()
    task = asyncio.ensure_future(make(waits))
    await settle()
    try:
        frames = [f for f in branches._frames(task) if f.f_code is code]
        if not frames:
            return changed(f"{what} on the await chain of a task blocked in it")
        children = branches._combinator_children(frames[0])
        if not children or not all(isinstance(c, asyncio.Future) for c in children):
            return changed(f"the branches in the frame locals of {what}")
        return None
    finally:
        await _cancel_new(before)


async def task_group_aexit_frame() -> str | None:
    async def grouped(w: Waits) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(w.wait())

    what = "TaskGroup.__aexit__ with local 'self' holding self._tasks"
    problem: str | None = await _frame_children(grouped, branches._TASKGROUP_EXIT, what)
    return problem


async def wait_frame() -> str | None:
    async def first_of(w: Waits) -> Any:
        return await asyncio.wait({asyncio.ensure_future(w.wait())})

    code = next(iter(branches._WAIT_CODES), None)
    problem: str | None = await _frame_children(
        first_of, code, "asyncio.wait's frame with local 'fs'"
    )
    return problem


async def wait_for_code() -> str | None:
    """wait_for's ``fut`` is a task on 3.11; where it awaits a coroutine in place (no
    branch of its own) the walk goes on through the frames below, so only the code
    object is required; the walk itself is checked in :func:`walks`."""
    if branches._WAIT_FOR is None:
        return changed("asyncio.wait_for as a Python function (its __code__)")
    return None


async def loop_ready_queue() -> str | None:
    loop = asyncio.get_running_loop()
    ready = getattr(loop, "_ready", _ABSENT)
    if ready is _ABSENT or not hasattr(ready, "__len__"):
        return (
            f"the asyncio loop on {PY} ({type(loop).__name__}) has no _ready queue, which "
            "toren.store.sql.loop_is_idle reads: writes will never go inline"
        )
    return None


async def walks() -> str | None:
    """The fallback's verdict through every combinator it sees through."""

    async def gathered(w: Waits) -> Any:
        return await asyncio.gather(w.wait(), w.wait())

    async def grouped(w: Waits) -> Any:
        async with asyncio.TaskGroup() as group:
            group.create_task(w.wait())
            group.create_task(w.wait())

    async def first_of(w: Waits) -> Any:
        tasks = {asyncio.ensure_future(w.wait()), asyncio.ensure_future(w.wait())}
        return await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

    async def bounded(w: Waits) -> Any:
        return await asyncio.wait_for(w.wait(), timeout=3600)

    async def awaited_task(w: Waits) -> Any:
        return await asyncio.ensure_future(gathered(w))

    async def sleeping(w: Waits) -> Any:
        return await asyncio.gather(w.wait(), asyncio.sleep(3600))

    async def grouped_busy(w: Waits) -> Any:
        async with asyncio.TaskGroup() as group:
            group.create_task(w.wait())
            group.create_task(asyncio.Event().wait())

    async def first_of_busy(w: Waits) -> Any:
        tasks = {asyncio.ensure_future(w.wait()), asyncio.ensure_future(asyncio.sleep(3600))}
        return await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)

    async def bounded_busy(w: Waits) -> Any:
        return await asyncio.wait_for(asyncio.sleep(3600), timeout=3600)

    async def threaded(w: Waits) -> Any:
        blocker = asyncio.Event()
        return await asyncio.gather(w.wait(), asyncio.to_thread(lambda: None), blocker.wait())

    expected = {
        **dict.fromkeys((gathered, grouped, first_of, bounded, awaited_task), branches.IDLE),
        **dict.fromkeys(
            (sleeping, grouped_busy, first_of_busy, bounded_busy, threaded), branches.BUSY
        ),
    }
    wrong = []
    for make, state in expected.items():
        found = await _verdict_of(make)
        if found != state:
            wrong.append(f"{make.__name__}: {found}, expected {state}")
    if wrong:
        return f"the fallback's walk on {PY} went wrong: " + "; ".join(wrong)
    return None


# -- ctx.task_group wraps asyncio.TaskGroup: its semantics on this Python ------------------


class _Abort(BaseException):
    """Stands for the engine's aborts (``toren.core.drivers.aborts.Abort``)."""


async def _marks(progress: list[str], name: str) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        progress.append(name)
        raise


async def _fail(exc: BaseException) -> None:
    await asyncio.sleep(0)
    raise exc


async def task_group_semantics() -> str | None:
    """A failing branch cancels the body and its sibling and comes out in an
    ExceptionGroup; an abort comes out as itself; the parent is left uncancelled."""
    wrong = []
    progress: list[str] = []
    try:
        async with combinators.TaskGroup() as tg:
            tg.create_task(_marks(progress, "sibling"))
            tg.create_task(_fail(ValueError("x")))
            await _marks(progress, "body")
    except ExceptionGroup as group:
        if [type(e) for e in group.exceptions] != [ValueError]:
            wrong.append(f"group of {group.exceptions!r}")
    else:
        wrong.append("no ExceptionGroup")
    if sorted(progress) != ["body", "sibling"]:
        wrong.append(f"cancelled {sorted(progress)}, expected body and sibling")
    progress.clear()
    try:
        async with combinators.TaskGroup() as tg:
            tg.create_task(_marks(progress, "sibling"))
            tg.create_task(_fail(_Abort()))
    except _Abort:
        pass
    except BaseException as other:
        wrong.append(f"an abort came out as {type(other).__name__}")
    if progress != ["sibling"]:
        wrong.append(f"abort: cancelled {progress}")
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        wrong.append(f"the parent task is left with cancelling() == {task.cancelling()}")
    if wrong:
        return f"ctx.task_group on {PY} is not asyncio.TaskGroup's: " + "; ".join(wrong)
    return None


async def gather_semantics() -> str | None:
    progress: list[str] = []
    wrong = []
    try:
        await combinators.gather(_marks(progress, "sibling"), _fail(ValueError("x")))
    except ValueError:
        pass
    else:
        wrong.append("the error did not come out as itself")
    if progress != ["sibling"]:
        wrong.append(f"cancelled {progress}")
    if wrong:
        return f"ctx.gather on {PY}: " + "; ".join(wrong)
    return None


CHECKS = [
    task_fut_waiter,
    gather_children,
    task_group_aexit_frame,
    wait_frame,
    wait_for_code,
    loop_ready_queue,
    walks,
    task_group_semantics,
    gather_semantics,
]


async def problems() -> list[str]:
    found = [await check() for check in CHECKS]
    return [p for p in found if p is not None]


def main() -> int:
    found = asyncio.run(problems())
    for problem in found:
        print(problem)
    if not found:
        print(f"{PY}: every asyncio internal toren.core.agent_api.branches reads is there")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
