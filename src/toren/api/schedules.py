"""``/v1/schedules``: list, create, pause, resume, trigger, backfill and delete schedules
(docs/http-api.md, docs/schedules.md). A schedule's id is ``agent/name``; its routes are
``/v1/schedules/{agent}/{name}``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, cast

from fastapi import Body, Path, Response
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from toren.agents.config import NAME_PATTERN, ScheduleConfig
from toren.api.state import ApiState, State, error_responses
from toren.core.contract.clock import SystemClock
from toren.core.contract.schedule import ScheduleState, nominal_text, schedule_id
from toren.core.drivers.scheduler import Scheduler
from toren.errors import ScheduleNotFound

RECENT_RUNS = 10

Name = Annotated[str, Path(pattern=NAME_PATTERN)]


class CreateSchedule(ScheduleConfig):
    """A schedule made at run time: ``agent`` plus the keys of an agent.yaml schedule."""

    agent: str = Field(pattern=NAME_PATTERN, description="The agent whose process it starts.")


class Note(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: str | None = Field(default=None, max_length=1000, description="Why (shown in lists).")


class Backfill(BaseModel):
    model_config = ConfigDict(extra="forbid")
    start: AwareDatetime = Field(description="The first time of the range (with its offset).")
    end: AwareDatetime = Field(description="The end of the range, excluded.")


class BackfillDone(BaseModel):
    started: int = Field(description="Runs started for times of the range that had none.")
    already_ran: int = Field(description="Times of the range that already had their run.")
    refused: int = Field(
        0,
        description="Times the agent's concurrency refused (on_conflict: reject, its key "
        "busy): not started.",
    )


class ScheduledRun(BaseModel):
    id: str
    status: str
    nominal: str | None


class Schedule(BaseModel):
    """A schedule as ``GET /v1/schedules`` shows it (docs/schedules.md)."""

    id: str
    agent: str
    name: str
    process: str
    cron: str | None
    every: float | None
    zone: str
    jitter: float
    overlap: str
    catch_up: str
    catch_up_window: float
    input: object = None
    source: str = Field(description="`agent.yaml` (deployed with the agent) or `api`.")
    code_version: str | None
    paused: bool
    note: str | None
    orphaned: str | None = Field(
        None,
        description="Why it does not fire: its agent is not in the newest deploy's code "
        "(null: it fires).",
    )
    next_fire_at: str | None
    upcoming: list[str]
    buffered: str | None
    last_fired_for: str | None
    last_run_id: str | None
    last_run_status: str | None
    last_skip: dict[str, str] | None
    fires: int
    skips: int
    mean_lateness_seconds: float | None
    recent_runs: list[ScheduledRun] = Field(default_factory=list)


class ScheduleList(BaseModel):
    schedules: list[Schedule]


Route = tuple[str, Callable[..., object], dict[str, object]]


async def _shown(state: ApiState, schedule: ScheduleState, recent: bool) -> dict[str, object]:
    shown = schedule.to_dict()
    if recent:
        runs = await state.store.schedules.runs_of(schedule.id, limit=RECENT_RUNS)
        shown["recent_runs"] = [
            {"id": i, "status": s, "nominal": nominal_text(at) if at else None} for i, s, at in runs
        ]
    return cast(dict[str, object], state.redact(shown))


async def _one(state: ApiState, agent: str, name: str) -> ScheduleState:
    found = await state.store.schedules.get(schedule_id(agent, name))
    if found is None or found.removed:
        raise ScheduleNotFound(f"no schedule {schedule_id(agent, name)!r}")
    return found


def _scheduler(state: ApiState) -> Scheduler:
    return Scheduler(state.store.schedules, SystemClock(), state.agents)


async def list_schedules(state: State) -> dict[str, object]:
    found = await state.store.schedules.all()
    return {"schedules": [await _shown(state, s, False) for s in found]}


async def create_schedule(body: CreateSchedule, state: State) -> dict[str, object]:
    state.agents.resolve(body.agent, body.process)  # AgentNotFound names the known ones
    made = await state.store.schedules.create(body.definition(body.agent), now=SystemClock().now())
    return await _shown(state, made, True)


async def get_schedule(agent: Name, name: Name, state: State) -> dict[str, object]:
    return await _shown(state, await _one(state, agent, name), True)


async def _set_paused(
    state: ApiState, agent: str, name: str, paused: bool, body: Note | None
) -> dict[str, object]:
    changed = await state.store.schedules.set_paused(
        schedule_id(agent, name), paused, body.note if body else None, now=SystemClock().now()
    )
    return await _shown(state, changed, True)


async def pause_schedule(
    agent: Name, name: Name, state: State, body: Annotated[Note | None, Body()] = None
) -> dict[str, object]:
    return await _set_paused(state, agent, name, True, body)


async def resume_schedule(
    agent: Name, name: Name, state: State, body: Annotated[Note | None, Body()] = None
) -> dict[str, object]:
    return await _set_paused(state, agent, name, False, body)


async def trigger_schedule(agent: Name, name: Name, state: State) -> dict[str, object]:
    run = await _scheduler(state).trigger(schedule_id(agent, name))
    found = await state.store.get_run(run.id)
    assert found is not None
    return cast(dict[str, object], state.redact(found.to_dict()))


async def backfill_schedule(
    agent: Name, name: Name, body: Backfill, state: State
) -> dict[str, int]:
    started, already, refused = await _scheduler(state).backfill(
        schedule_id(agent, name), _seconds(body.start), _seconds(body.end)
    )
    return {"started": started, "already_ran": already, "refused": refused}


async def delete_schedule(agent: Name, name: Name, state: State) -> Response:
    await state.store.schedules.delete(schedule_id(agent, name), now=SystemClock().now())
    return Response(status_code=204)


ONE = "/v1/schedules/{agent}/{name}"
TAGS = ["schedules"]
ROUTES: list[Route] = [
    (
        "/v1/schedules",
        list_schedules,
        {
            "methods": ["GET"],
            "response_model": ScheduleList,
            "tags": TAGS,
            "summary": "List schedules",
            "responses": error_responses(),
        },
    ),
    (
        "/v1/schedules",
        create_schedule,
        {
            "methods": ["POST"],
            "status_code": 201,
            "response_model": Schedule,
            "tags": TAGS,
            "summary": "Create a schedule",
            "responses": error_responses(404, 415, 422),
        },
    ),
    (
        ONE,
        get_schedule,
        {
            "methods": ["GET"],
            "response_model": Schedule,
            "tags": TAGS,
            "summary": "A schedule, with its recent runs",
            "responses": error_responses(404, 422),
        },
    ),
    (
        ONE + "/pause",
        pause_schedule,
        {
            "methods": ["POST"],
            "response_model": Schedule,
            "tags": TAGS,
            "summary": "Pause a schedule",
            "responses": error_responses(404, 415, 422),
        },
    ),
    (
        ONE + "/resume",
        resume_schedule,
        {
            "methods": ["POST"],
            "response_model": Schedule,
            "tags": TAGS,
            "summary": "Resume a schedule (from now: paused times are not caught up)",
            "responses": error_responses(404, 415, 422),
        },
    ),
    (
        ONE + "/trigger",
        trigger_schedule,
        {
            "methods": ["POST"],
            "status_code": 201,
            "tags": TAGS,
            "summary": "Start a run of the schedule now",
            "responses": error_responses(404, 422),
        },
    ),
    (
        ONE + "/backfill",
        backfill_schedule,
        {
            "methods": ["POST"],
            "response_model": BackfillDone,
            "tags": TAGS,
            "summary": "Start the runs of a past range's times (each at most once)",
            "responses": error_responses(404, 415, 422),
        },
    ),
    (
        ONE,
        delete_schedule,
        {
            "methods": ["DELETE"],
            "status_code": 204,
            "tags": TAGS,
            "summary": "Delete a schedule (its runs stay)",
            "responses": error_responses(404, 422),
        },
    ),
]


def _seconds(moment: datetime) -> float:
    return moment.timestamp()
