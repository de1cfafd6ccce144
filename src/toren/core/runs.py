"""Starting runs and waiting for them: the host API's entry points."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Any, TypedDict, Unpack

from toren.core.clock import Clock, SystemClock
from toren.core.events import RunStarted, make_event
from toren.core.inputs import check_message_name, json_data
from toren.core.ports import RunStore
from toren.core.program import AgentResolver
from toren.core.records import NewRun, RunRecord
from toren.core.values import RunStatus
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
) -> Started:
    """Create a run (queued) and wake the workers. The same ``idempotency_key`` returns the
    same run; reusing it with another agent, process or input is an error. An input that
    is not JSON data, or nests objects and arrays more than
    :data:`~toren.core.inputs.MAX_JSON_DEPTH` levels deep, is an :class:`InvalidInput`
    and nothing is stored."""
    if idempotency_key is not None and (
        not isinstance(idempotency_key, str) or not 0 < len(idempotency_key) <= MAX_IDEMPOTENCY_KEY
    ):
        raise InvalidInput(
            f"idempotency key must be a non-empty string of at most {MAX_IDEMPOTENCY_KEY} "
            f"characters, got {idempotency_key!r}"
        )
    agents.resolve(agent, process)  # raises AgentNotFound with the known names
    input = json_data(input, "run input", "input")
    now = (clock or SystemClock()).now()
    run_id = new_run_id(now)
    started = make_event(
        run_id,
        RunStarted(agent=agent, process=process, input=input),
        slot="run:start",
        created_at=now,
    )
    run, created = await store.create_run(
        NewRun(run_id, agent, process, input, idempotency_key, now, started)
    )
    return Started(run, created)


async def send_message(
    store: RunStore, run_id: str, name: str, payload: object = None, *, clock: Clock | None = None
) -> int:
    """Send the message ``name`` to run ``run_id`` (a run waiting in
    ``ctx.wait_for_message(name)`` continues); the id of the stored message. The checks of
    the HTTP API and the CLI: a name that is not 1 to 255 characters without control
    characters, a payload that is not JSON data, or nests objects and arrays
    more than :data:`~toren.core.inputs.MAX_JSON_DEPTH` levels deep, is an
    :class:`InvalidInput` and nothing is stored; an unknown or finished run is a
    :class:`RunNotFound`. (``RunStore.send_message`` is the storage call beneath, unchecked.)"""
    check_message_name(name)
    payload = json_data(payload, "message payload", "payload")
    return await store.send_message(run_id, name, payload, now=(clock or SystemClock()).now())


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
