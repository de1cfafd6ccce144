"""Fixing forward: retrying a failed run under the code now deployed, and forking a run
from one of its steps. Host API entry points (the HTTP API, the CLI and the console call
these); both only append to logs, never edit or delete an event.

**Retry** (:func:`retry_run`) appends ``RunRetried`` to a failed run's log and queues it.
A worker then resumes it like any run: every recorded step replays for free, except the
recorded failures that ended the run (``RunFailed.failed_seqs``: the tool that raised, the
model call that failed after its retries, a failed child and the child's failed step),
which the fold takes out of their streams so that they run again live. A run that ended
in agent code or on a limit has no such step: its code simply runs again. A retry may
raise ``max_steps`` and ``max_cost_usd`` for the run (never lower them). Only a failed run
can be retried: a cancelled run is final (a decision, not a failure), and a completed one
has nothing to retry; fork those instead.

**Fork** (:func:`fork_run`) creates a new run whose log starts with a copy of the source
run's steps before ``STREAM:POSITION`` (their events, re-keyed to the new run at
generation 0; message bodies are content-addressed and shared, not copied), then
``RunForked`` naming the source. Those copied steps replay whatever the current code
asks for at their positions (they are the history the fork starts from: a fork with an
edited prompt keeps the conversation so far), and the new run runs live from the fork
point under the deployed code. The source run is not touched. Resetting a run "in place"
is a fork too: Toren never rewinds a run's log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal

from toren.core.agent_api.program import AgentResolver
from toren.core.contract.clock import Clock, SystemClock
from toren.core.contract.events import (
    ROOT,
    ChildCompleted,
    ChildStarted,
    Event,
    RunFailed,
    RunForked,
    RunRetried,
    RunStarted,
    ToolCallRecorded,
    make_event,
)
from toren.core.contract.inputs import json_data
from toren.core.contract.ports import RunStore
from toren.core.contract.records import NewRun, RunRecord
from toren.core.contract.replay import RunLog, Step, step_slot
from toren.core.contract.values import RunStatus, usd_to_nano, whole
from toren.core.drivers.runs import new_run_id
from toren.errors import ForkPointNotFound, InvalidInput, RunNotFound, RunNotRetryable

_UNSET: object = object()
RETRY_LIMITS = ("max_steps", "max_cost_usd")


async def retry_run(
    store: RunStore,
    agents: AgentResolver,
    run_id: str,
    *,
    max_steps: int | None = None,
    max_cost_usd: Decimal | float | str | None = None,
    clock: Clock | None = None,
) -> RunRecord:
    """Queue the failed run ``run_id`` again under the code now deployed (see the module
    docstring). ``max_steps`` / ``max_cost_usd`` raise the run's limits (never lower them).
    Raises :class:`RunNotFound`, :class:`RunNotRetryable` (not failed: cancelled,
    completed or still going) and :class:`InvalidInput` (a bad limit)."""
    run = await _get(store, run_id)
    if run.status != RunStatus.FAILED:
        raise RunNotRetryable(_not_retryable(run), run_id=run_id, status=run.status)
    program = agents.resolve(run.agent, run.process)  # AgentNotFound names the known ones
    raises = _limits(max_steps=max_steps, max_cost_usd=max_cost_usd)
    log = RunLog.fold(run_id, await store.load_events(run_id))
    terminal = log.terminal
    failure = terminal.payload if terminal is not None else None
    retried = RunRetried(
        attempt=log.retries + 1,
        failed_seq=terminal.seq if terminal is not None else None,
        error=failure.error if isinstance(failure, RunFailed) else run.error,
        retried_seqs=retried_failures(log, failure),
        raise_limits=raises,
        code_version=program.code_version,
    )
    now = (clock or SystemClock()).now()
    event = make_event(
        run_id,
        retried,
        slot=f"run:retry:{retried.attempt}",
        code_version=program.code_version,
        created_at=now,
    )
    return await store.retry_run(run_id, event, now=now)


def retried_failures(log: RunLog, failure: object) -> list[int]:
    """The recorded failures a retry takes out of the views: those ``RunFailed`` names,
    and for a failed child whose own failure it does not name (a run that failed while
    replaying the child's recorded failure), the child stream's latest failure."""
    seqs = list(failure.failed_seqs) if isinstance(failure, RunFailed) else []
    steps = {s.first.seq: s for v in log.streams.values() for s in v.steps.values()}
    steps.update({s.done.seq: s for v in log.streams.values() for s in v.steps.values() if s.done})
    todo = list(seqs)
    while todo:
        step = steps.get(todo.pop())
        if step is None or not isinstance(step.first.payload, ChildStarted):
            continue
        child = log.streams.get(step.first.payload.child_stream)
        if child is None or any(s.first.seq in seqs for s in child.steps.values()):
            continue
        failed = [s for s in child.steps.values() if _failure_seq(s) is not None]
        if failed:
            last = _failure_seq(max(failed, key=lambda s: _failure_seq(s) or 0))
            assert last is not None
            seqs.append(last)
            todo.append(last)
    return sorted(set(seqs))


def _failure_seq(step: Step) -> int | None:
    """The seq of the event recording this step's failure, if it failed."""
    error = getattr(step.first.payload, "error", None)
    if error is not None:
        return step.first.seq
    if step.done is not None and isinstance(step.done.payload, ChildCompleted):
        return step.done.seq if step.done.payload.error is not None else None
    return None


def _limits(*, max_steps: object, max_cost_usd: object) -> dict[str, int]:
    """The raised limits as the log records them: integers (``max_steps``, and the cost as
    ``max_cost_nanousd``, integer nano-USD, read as the decimal ``max_cost_usd`` spells),
    so no float reaches the log. A bad one is :class:`InvalidInput` naming it."""
    out: dict[str, int] = {}
    if max_steps is not None:
        steps = whole(max_steps)
        if steps is None or steps <= 0:
            raise InvalidInput(
                f"max_steps must be a positive whole number, got {max_steps!r}", field="max_steps"
            )
        out["max_steps"] = steps
    if max_cost_usd is not None:
        nano = usd_to_nano(max_cost_usd)
        if nano is None or nano <= 0:
            raise InvalidInput(
                f"max_cost_usd must be a positive number of USD, got {max_cost_usd!r}",
                field="max_cost_usd",
            )
        out["max_cost_nanousd"] = nano
    return out


def _not_retryable(run: RunRecord) -> str:
    if run.status == RunStatus.CANCELLED:
        return (
            f"run {run.id!r} was cancelled; a cancelled run is final and cannot be retried. "
            f"To continue from its log, fork it: toren runs fork {run.id} --at {run.process}:N"
        )
    if run.status == RunStatus.COMPLETED:
        return (
            f"run {run.id!r} completed; there is nothing to retry. To run it again from one "
            f"of its steps under the current code, fork it: "
            f"toren runs fork {run.id} --at {run.process}:N"
        )
    return f"run {run.id!r} is {run.status}, not failed; only a failed run can be retried"


async def _get(store: RunStore, run_id: str) -> RunRecord:
    run = await store.get_run(run_id)
    if run is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return run


# -- fork ---------------------------------------------------------------------------------


def parse_at(at: str) -> tuple[str, int]:
    """``STREAM:POSITION`` (``main:5``, ``main/3:0``) as (stream, position)."""
    stream, sep, pos = at.rpartition(":") if isinstance(at, str) else ("", "", "")
    if not sep or not stream or not (pos.isascii() and pos.isdigit()) or len(pos) > 9:
        raise InvalidInput(
            f"fork point {at!r} is not STREAM:POSITION; expected e.g. 'main:5' (the step at "
            "position 5 of stream main runs live; the steps before it replay)",
            field="at",
        )
    return stream, int(pos)


async def fork_run(
    store: RunStore,
    agents: AgentResolver,
    run_id: str,
    *,
    at: str,
    input: object = _UNSET,
    clock: Clock | None = None,
) -> RunRecord:
    """A new run (queued) forked from ``run_id`` at ``at`` (``STREAM:POSITION``): the
    source's steps before that point replay in it without being paid again; the rest runs
    live under the deployed code. ``input`` replaces the run's input (default: the
    source's). The source run is left exactly as it is."""
    source = await _get(store, run_id)
    stream, position = parse_at(at)
    program = agents.resolve(source.agent, source.process)
    events = await store.load_events(run_id)
    log = RunLog.fold(run_id, events)
    _check_point(log, source, stream, position)
    new_input = source.input if input is _UNSET else json_data(input, "run input", "input")
    now = (clock or SystemClock()).now()
    new_id = new_run_id(now)
    steps, pins = _prefix(log, stream, position)
    copies = [_copy(e, new_id) for e in sorted(steps, key=lambda e: e.seq)]
    forked = RunForked(
        source_run=run_id,
        stream=stream,
        position=position,
        source_seq=log.last_seq,
        pins=pins,
        input_changed=new_input != source.input,
    )
    started = make_event(
        new_id,
        RunStarted(agent=source.agent, process=source.process, input=new_input),
        slot="run:start",
        created_at=now,
    )
    marker = make_event(
        new_id, forked, slot="run:fork", code_version=program.code_version, created_at=now
    )
    run, _ = await store.create_run(
        NewRun(
            new_id,
            source.agent,
            source.process,
            new_input,
            None,
            now,
            started,
            events=(marker, *copies),
            forked_from=run_id,
            forked_at=f"{stream}:{position}",
        )
    )
    return run


def _check_point(log: RunLog, run: RunRecord, stream: str, position: int) -> None:
    view = log.streams.get(stream)
    if view is None and stream != run.process:
        known = sorted({run.process, *log.streams})
        raise ForkPointNotFound(
            f"run {run.id!r} has no stream {stream!r}; its streams are {known}", field="at"
        )
    length = view.length if view is not None else 0
    if position > length:
        steps = f"{length} steps (positions 0-{length - 1})" if length else "no steps yet"
        raise ForkPointNotFound(
            f"stream {stream!r} of run {run.id!r} has {steps}; fork at a position from 0 "
            f"to {length} (the step there runs live)",
            field="at",
        )
    parts = stream.split("/")
    if parts[0] != run.process:
        raise ForkPointNotFound(
            f"stream {stream!r} is not of run {run.id!r} (its root stream is {run.process!r})",
            field="at",
        )
    for depth in range(1, len(parts)):
        parent, spawn = "/".join(parts[:depth]), parts[depth]
        parent_view = log.streams.get(parent)
        step = parent_view.steps.get(int(spawn)) if parent_view and spawn.isdigit() else None
        if step is None or not isinstance(step.first.payload, ChildStarted):
            raise ForkPointNotFound(
                f"stream {stream!r} of run {run.id!r} is not a child stream of its current "
                "view (a stream superseded by an invalidation cannot be forked from)",
                field="at",
            )


def _prefix(log: RunLog, stream: str, position: int) -> tuple[list[Event], dict[str, int]]:
    """The events to copy for a fork at ``stream``:``position`` and the pins: the stream's
    steps before ``position``; in each ancestor, the steps up to and including the spawn
    that leads to it (its completion left out: the child goes on); every child stream
    started by a copied step, whole."""
    events: list[Event] = []
    pins: dict[str, int] = {}
    parts = stream.split("/")
    chain = [("/".join(parts[:d]), int(parts[d])) for d in range(1, len(parts))]
    path = {s for s, _ in chain} | {stream}
    children: list[str] = []
    for name, end, open_spawn in [*((s, p + 1, p) for s, p in chain), (stream, position, None)]:
        view = log.streams.get(name)
        if view is None:
            continue
        pins[name] = end
        for pos, step in sorted(view.steps.items()):
            if pos >= end:
                continue
            events.append(step.first)
            if step.done is not None and pos != open_spawn:
                events.append(step.done)
            payload = step.first.payload
            if isinstance(payload, ChildStarted) and payload.child_stream not in path:
                children.append(payload.child_stream)
    while children:
        name = children.pop(0)
        view = log.streams.get(name)
        if view is None or name in pins:
            continue
        pins[name] = view.length
        for _, step in sorted(view.steps.items()):
            events.extend(e for e in (step.first, step.done) if e is not None)
            if isinstance(step.first.payload, ChildStarted):
                children.append(step.first.payload.child_stream)
    return events, pins


def _copy(event: Event, run_id: str) -> Event:
    """``event`` re-keyed into the fork: generation 0, its slot there, no seq yet. A reuse
    pointer (a seq of the source's log) means nothing in the fork and is dropped."""
    payload = event.payload
    if isinstance(payload, ToolCallRecorded) and payload.reused_from_seq is not None:
        payload = replace(payload, reused_from_seq=None)
    assert event.position is not None and event.stream != ROOT
    done = (event.slot or "").split("~")[0].endswith(":done")
    return replace(
        event,
        run_id=run_id,
        payload=payload,
        generation=0,
        slot=step_slot(event.stream, 0, event.position, done),
        seq=0,
    )


__all__: Sequence[str] = ("fork_run", "parse_at", "retried_failures", "retry_run")
