"""Starting runs and waiting for them: the host API's entry points."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from toren.core.agent_api.program import AgentResolver
from toren.core.contract.clock import Clock, SystemClock
from toren.core.contract.events import RunStarted, make_event
from toren.core.contract.flow import MAX_KEY, Concurrency
from toren.core.contract.inputs import check_message_name, json_data
from toren.core.contract.ports import RunStore
from toren.core.contract.records import NewRun, RunRecord
from toren.core.contract.values import RunStatus
from toren.errors import InvalidInput, RunNotFound

MAX_IDEMPOTENCY_KEY = 255
# The most runs one listing returns: a page of ``GET /v1/runs`` and ``toren runs list
# --limit`` alike, so a limit that works on the embedded database works against a server.
MAX_RUNS_PAGE = 200


def new_run_id(now: float) -> str:
    """Time-ordered ids (``run_`` + 12 hex ms + 10 hex random): listing by id is listing by
    creation, which makes cursor pagination a plain ``id < cursor``."""
    return f"run_{int(now * 1000):012x}{os.urandom(5).hex()}"


@dataclass(frozen=True)
class Started:
    """A started run, and whether this call created it (False: the idempotency key named a
    run that already existed, which is returned as it is now)."""

    run: RunRecord
    created: bool


class StartOptions(TypedDict, total=False):
    """The keywords :func:`start_run` passes on to :func:`start`."""

    process: str
    idempotency_key: str | None
    clock: Clock | None


async def start_run(
    store: RunStore,
    agents: AgentResolver,
    agent: str,
    input: object = None,
    **options: Unpack[StartOptions],
) -> RunRecord:
    """Create a run (queued) and wake the workers; the run. The options (``process``,
    ``idempotency_key``, ``clock``) and the errors are :func:`start`'s."""
    return (await start(store, agents, agent, input, **options)).run


async def start(
    store: RunStore,
    agents: AgentResolver,
    agent: str,
    input: Any = None,
    *,
    process: str = "main",
    idempotency_key: str | None = None,
    clock: Clock | None = None,
    concurrency_key: str | None = None,
    concurrency_limit: int | None = None,
    priority: int = 0,
) -> Started:
    """Create a run (queued) and wake the workers. The same ``idempotency_key`` returns the
    same run; reusing it with another agent, process or input is an error. An input that
    is not JSON data, or nests objects and arrays more than
    :data:`~toren.core.contract.inputs.MAX_JSON_DEPTH` levels deep, is an :class:`InvalidInput`
    and nothing is stored."""
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY
    ):
        raise InvalidInput(
            f"idempotency key must be a non-empty string of at most {MAX_IDEMPOTENCY_KEY} "
            f"characters, got {idempotency_key!r}"
        )
    program = agents.resolve(agent, process)  # raises AgentNotFound with the known names
    input = json_data(input, "run input", "input")
    key, limit, on_conflict = _flow(
        program.concurrency, agent, process, input, concurrency_key, concurrency_limit
    )
    now = (clock or SystemClock()).now()
    run_id = new_run_id(now)
    started = make_event(
        run_id,
        RunStarted(agent=agent, process=process, input=input),
        slot="run:start",
        created_at=now,
    )
    run, created = await store.create_run(
        NewRun(
            run_id,
            agent,
            process,
            input,
            idempotency_key,
            now,
            started,
            concurrency_key=key,
            concurrency_limit=limit,
            priority=priority,
            on_conflict=on_conflict,
        )
    )
    return Started(run, created)


def flow_of(
    configured: Concurrency | None, agent: str, process: str, input: object
) -> tuple[str | None, int | None, str]:
    """A run's concurrency key, limit and conflict policy from its agent's
    ``concurrency:`` alone (a scheduled run: no caller gives a key)."""
    return _flow(configured, agent, process, input, None, None)


def _flow(
    configured: Concurrency | None,
    agent: str,
    process: str,
    input: object,
    key: str | None,
    limit: int | None,
) -> tuple[str | None, int | None, str]:
    """The run's concurrency key, limit and conflict policy: the caller's key and limit
    win over the agent's ``concurrency:``; a caller's key needs a limit from one of them."""
    if key is not None and not 0 < len(key) <= MAX_KEY:
        raise InvalidInput(f"a concurrency key is 1 to {MAX_KEY} characters; got {len(key)}")
    if limit is not None and not 1 <= limit <= 1_000_000:
        raise InvalidInput(f"a concurrency limit is 1 to 1000000; got {limit!r}")
    if configured is None:
        if key is None and limit is None:
            return None, None, "enqueue"
        if key is None or limit is None:
            raise InvalidInput(
                f"agent {agent!r} process {process!r} declares no 'concurrency:'; a start "
                "that sets a concurrency key must give its limit too (and a limit, a key)"
            )
        return key, limit, "enqueue"
    return (
        key if key is not None else configured.key_for(agent, process, input),
        limit if limit is not None else configured.limit,
        configured.on_conflict,
    )


async def send_message(
    store: RunStore, run_id: str, name: str, payload: object = None, *, clock: Clock | None = None
) -> int:
    """Send the message ``name`` to run ``run_id`` (a run waiting in
    ``ctx.wait_for_message(name)`` continues); the id of the stored message. The checks of
    the HTTP API and the CLI: a name that is not 1 to 255 characters without control
    characters, a payload that is not JSON data, or nests objects and arrays
    more than :data:`~toren.core.contract.inputs.MAX_JSON_DEPTH` levels deep, is an
    :class:`InvalidInput` and nothing is stored; an unknown or finished run is a
    :class:`RunNotFound`. (``RunStore.send_message`` is the storage call beneath, unchecked.)"""
    check_message_name(name)
    payload = json_data(payload, "message payload", "payload")
    return await store.send_message(run_id, name, payload, now=(clock or SystemClock()).now())


def unexpected_message(run_id: str, name: str, waiting_for: list[str] | None) -> str | None:
    """The warning for a message ``name`` sent to a run that waits for other names (None
    when it waits for this one, or does not wait). Such a message is kept, not refused: a
    later ``ctx.wait_for_message(name)`` takes it (a run may be sent a message before it
    asks); but it does not wake the run, which is the usual sign of a typo."""
    if not waiting_for or name in waiting_for:
        return None
    names = ", ".join(repr(n) for n in waiting_for)
    return (
        f"run {run_id!r} is waiting for {names}, not {name!r}: the message is kept for a "
        f"later wait_for_message({name!r}) but does not wake the run; send it under "
        f"{waiting_for[0]!r} to continue the run"
    )


async def wait_for_run(
    store: RunStore, run_id: str, *, timeout: float = 60.0, until: tuple[RunStatus, ...] = ()
) -> RunRecord:
    """Poll until the run is terminal (or in one of ``until``); TimeoutError otherwise."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        run = await store.get_run(run_id)
        if run is None:
            raise RunNotFound(f"no run with id {run_id!r}")
        if run.terminal or run.status in until:
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id!r} is still {run.status} after {timeout}s")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)
