"""Following a run in the live view until it ends or parks, and the exit code and the
lines that say what to do next (a message to send, a retry, a blocked run to resume).
Shared by ``toren run``, ``toren runs resume``, ``retry`` and ``fork``, on the embedded
database and on a server (any :class:`~toren.cli.backend.Backend`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import signal
from typing import Any

from rich.markup import escape

from toren.cli._common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_WAITING,
    STATUS_EXIT,
    err,
    out,
)
from toren.cli.backend import Backend, parked
from toren.cli.view import RunView
from toren.client import Run
from toren.core.contract.values import RunStatus

__all__ = ["exit_code", "follow", "last_seq"]


async def follow(
    backend: Backend,
    run_id: str,
    *,
    resume_hint: bool = True,
    reach: str = "",
    replayed_upto: int | None = None,
) -> int:
    """Follow a run in the live view until it ends or parks; returns the exit code.
    ``reach`` is what the printed follow-up commands need to find the run
    (:func:`follow_up_options`). ``replayed_upto`` is the last seq recorded before the
    run went on (default: the log as it is now); a caller that set the run going before
    it follows (``toren runs retry``) reads it first, or steps that ran live in between
    would be marked replayed."""
    console = out()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    final: Run | None = None
    stalled: dict[str, Any] | None = None
    # The worker's log line for this run's block says what the error line below says:
    # one error line and one hint, nothing in between.
    quiet = _NotThisRunsBlock(run_id)
    tick_log = logging.getLogger("toren.tick")
    tick_log.addFilter(quiet)
    # The steps already in the log are replayed from it (free) when the run goes on here.
    upto = await last_seq(backend, run_id) if replayed_upto is None else replayed_upto
    try:
        with RunView(console, replayed_upto=upto) as view:
            items = backend.follow(run_id).__aiter__()
            while True:
                nxt = asyncio.ensure_future(items.__anext__())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({nxt, stopper}, return_when=asyncio.FIRST_COMPLETED)
                stopper.cancel()
                if stop.is_set():
                    nxt.cancel()
                    with contextlib.suppress(BaseException):
                        await nxt
                    break
                try:
                    kind, data = nxt.result()
                except StopAsyncIteration:
                    break
                view.handle(kind, data)
                if isinstance(data, Run):
                    if kind == "end":
                        final = data
                        break
                elif kind == "stalled":
                    stalled = data
                    break
            with contextlib.suppress(Exception):
                await items.aclose()  # type: ignore[attr-defined]
        if stalled is not None:
            return _stalled(run_id, stalled["error"], reach)
        if final is None:
            how = f"toren runs resume {run_id}{reach}"
            console.print(
                f"[yellow]interrupted[/]: run {escape(run_id)} is not finished; continue it "
                f"with [bold]{escape(how)}[/]"
                if resume_hint
                else f"[yellow]stopped following[/] run {escape(run_id)}; it goes on"
            )
            return EXIT_INTERRUPTED
        view.summary(final)
    finally:
        tick_log.removeFilter(quiet)
        for sig in installed:
            loop.remove_signal_handler(sig)
    return exit_code(final, reach)


class _NotThisRunsBlock(logging.Filter):
    """Drops the worker's "run X blocked" lines of the run followed in the foreground,
    which says the same thing itself (:func:`_stalled`)."""

    def __init__(self, run_id: str) -> None:
        super().__init__()
        self.run_id = run_id

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        blocked = str(record.msg).startswith(("run %s blocked", "run %s: blocked"))
        return not (blocked and args[:1] == (self.run_id,))


async def last_seq(backend: Backend, run_id: str) -> int:
    """The seq of the run's last recorded event (0 for none)."""
    recorded = await backend.events(run_id)
    return max((int(e.get("seq") or 0) for e in recorded), default=0)


def _stalled(run_id: str, error: dict[str, object], reach: str) -> int:
    """The run's tick failed for a reason outside the agent (no API key for its model,
    the database): a worker would retry it after its lease runs out, but in the
    foreground that is a silent wait. Say why, and how to go on once it is fixed."""
    how = f"toren runs resume {run_id}{reach}"
    console = err()
    console.print(f"[bold red]error:[/] {escape(str(error.get('message')))}", highlight=False)
    retry = ""
    if error.get("attempts"):
        # No clock time: the next try is due within seconds, long past when this is read.
        retry = (
            f" (blocked, attempt {error['attempts']}; a 'toren worker' or 'toren dev' on "
            "this database retries it by itself)"
        )
    console.print(
        f"[dim]hint:[/] run {escape(run_id)} is kept as it is{escape(retry)}; fix the problem "
        f"named above, then continue it with [bold]{escape(how)}[/]",
        highlight=False,
    )
    return EXIT_ERROR


def exit_code(run: Run, reach: str = "") -> int:
    if parked(run):
        names = run.waiting_for or ["<name>"]
        run_id = run.id
        out().print(
            f"run {escape(str(run_id))} is waiting for message {escape(repr(names[0]))}. "
            f"Send it with:\n  [bold]toren runs send {escape(str(run_id))} "
            f"{escape(shlex.quote(names[0]))} '\"your answer\"'{escape(reach)}[/]\nthen continue "
            f"with [bold]toren runs resume {escape(str(run_id))}{escape(reach)}[/] (a running "
            "'toren dev' or 'toren worker' continues it by itself)"
        )
        return EXIT_WAITING
    if run.status == RunStatus.FAILED:
        how = f"toren runs retry {run.id}{reach}"
        err().print(
            f"[dim]hint:[/] fix the cause, then continue the run from its log with "
            f"[bold]{escape(how)}[/] (recorded steps are not paid again)",
            highlight=False,
        )
    return STATUS_EXIT.get(run.status, EXIT_OK)
