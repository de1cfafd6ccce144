"""``toren schedules``: list, create, pause, resume, trigger, backfill and delete schedules,
on the embedded database (under --agents) or on a server (--url). docs/schedules.md."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypeVar

import click
from rich.markup import escape
from rich.table import Table

from toren.agents.config import ScheduleConfig
from toren.cli._common import database_url_for, examples, out, run_async, settings_from
from toren.cli.runs import backend_options
from toren.client import AsyncTorenClient
from toren.core.contract.clock import SystemClock
from toren.core.contract.schedule import ScheduleState, nominal_text, schedule_id
from toren.core.drivers.scheduler import Scheduler
from toren.errors import InvalidInput, ScheduleNotFound
from toren.runtime import Runtime, close_runtime, open_runtime

T = TypeVar("T")


class Schedules(Protocol):
    """One interface over the embedded database and a server."""

    async def all(self) -> list[dict[str, object]]: ...
    async def get(self, sid: str) -> dict[str, object]: ...
    async def create(self, agent: str, name: str, spec: dict[str, object]) -> dict[str, object]: ...
    async def pause(self, sid: str, note: str | None, paused: bool) -> dict[str, object]: ...
    async def trigger(self, sid: str) -> str: ...
    async def backfill(self, sid: str, start: datetime, end: datetime) -> dict[str, int]: ...
    async def delete(self, sid: str) -> None: ...
    def declared_elsewhere(self, listed: list[dict[str, object]]) -> list[str]: ...


class Remote:
    def __init__(self, client: AsyncTorenClient) -> None:
        self.client = client

    async def all(self) -> list[dict[str, object]]:
        return await self.client.schedules()

    async def get(self, sid: str) -> dict[str, object]:
        return await self.client.get_schedule(sid)

    async def create(self, agent: str, name: str, spec: dict[str, object]) -> dict[str, object]:
        return await self.client.create_schedule(agent, name, **spec)

    async def pause(self, sid: str, note: str | None, paused: bool) -> dict[str, object]:
        if paused:
            return await self.client.pause_schedule(sid, note)
        return await self.client.resume_schedule(sid, note)

    async def trigger(self, sid: str) -> str:
        return (await self.client.trigger_schedule(sid)).id

    async def backfill(self, sid: str, start: datetime, end: datetime) -> dict[str, int]:
        found = await self.client.backfill_schedule(sid, start.isoformat(), end.isoformat())
        return {
            "started": int(found["started"]),
            "already_ran": int(found["already_ran"]),
            "refused": int(found.get("refused", 0)),  # an older server: none refused
        }

    async def delete(self, sid: str) -> None:
        await self.client.delete_schedule(sid)

    def declared_elsewhere(self, listed: list[dict[str, object]]) -> list[str]:
        return []


class Embedded:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.store = runtime.store.schedules
        self.clock = SystemClock()

    async def _shown(self, found: ScheduleState, recent: bool = True) -> dict[str, object]:
        shown = found.to_dict()
        if recent:
            shown["recent_runs"] = [
                {"id": i, "status": s, "nominal": nominal_text(at) if at else None}
                for i, s, at in await self.store.runs_of(found.id, limit=10)
            ]
        return shown

    async def all(self) -> list[dict[str, object]]:
        return [await self._shown(s, recent=False) for s in await self.store.all()]

    async def get(self, sid: str) -> dict[str, object]:
        found = await self.store.get(sid)
        if found is None or found.removed:
            raise ScheduleNotFound(f"no schedule {sid!r}")
        return await self._shown(found)

    async def create(self, agent: str, name: str, spec: dict[str, object]) -> dict[str, object]:
        config = _config(name, spec)
        self.runtime.resolver.resolve(agent, config.process)
        made = await self.store.create(config.definition(agent), now=self.clock.now())
        return await self._shown(made)

    async def pause(self, sid: str, note: str | None, paused: bool) -> dict[str, object]:
        return await self._shown(
            await self.store.set_paused(sid, paused, note, now=self.clock.now())
        )

    async def trigger(self, sid: str) -> str:
        return (await self._scheduler().trigger(sid)).id

    async def backfill(self, sid: str, start: datetime, end: datetime) -> dict[str, int]:
        started, already, refused = await self._scheduler().backfill(
            sid, start.timestamp(), end.timestamp()
        )
        return {"started": started, "already_ran": already, "refused": refused}

    def _scheduler(self) -> Scheduler:
        return Scheduler(self.store, self.clock, self.runtime.resolver)

    async def delete(self, sid: str) -> None:
        await self.store.delete(sid, now=self.clock.now())

    def declared_elsewhere(self, listed: list[dict[str, object]]) -> list[str]:
        """agent.yaml schedules no worker has registered yet."""
        known = {s["id"] for s in listed}
        found = []
        for agent in self.runtime.resolver.names():
            try:
                program = self.runtime.resolver.resolve(agent, "main")
            except Exception:  # a broken agent: `toren runs`/`dev` say why
                continue
            found += [d.id for d in program.schedules if d.id not in known]
        return found


def _config(name: str, spec: dict[str, object]) -> ScheduleConfig:
    from pydantic import ValidationError

    try:
        return ScheduleConfig.model_validate({"name": name, **spec})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'schedule'}: "
            f"{e.get('ctx', {}).get('error', e['msg'])}"
            for e in exc.errors()
        )
        raise InvalidInput(f"schedule {name!r}: {problems}") from None


@contextlib.asynccontextmanager
async def _opened(
    url: str | None, token: str | None, agents_root: Path, database_url: str | None
) -> AsyncIterator[Schedules]:
    if url:
        async with AsyncTorenClient(url, token) as client:
            yield Remote(client)
        return
    root = agents_root.resolve()
    settings = settings_from(database_url=database_url)
    runtime = await open_runtime(root, database_url_for(root, database_url), settings)
    try:
        yield Embedded(runtime)
    finally:
        await close_runtime(runtime)


def _on(options: dict[str, Any], action: Callable[[Schedules], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _opened(
            options["url"], options["token"], options["agents_root"], options["database_url"]
        ) as backend:
            return await action(backend)

    return run_async(go)


def _sid(value: str) -> str:
    agent, slash, name = value.partition("/")
    if not slash or not agent or not name:
        raise click.BadParameter(f"expected AGENT/NAME (e.g. triage/nightly); got {value!r}")
    return schedule_id(agent, name)


def _when(moment: str | None) -> str:
    return moment.replace("T", " ").replace("Z", " UTC") if moment else "-"


def _print_one(found: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(found, indent=2, ensure_ascii=False))
        return
    when = (
        f"cron {found['cron']!r} in {found['zone']}"
        if found["cron"]
        else (f"every {found['every']:g} s")
    )
    state = escape(_state(found))
    lines = [
        f"schedule {escape(found['id'])}: {when}, {state}",
        f"  starts {found['agent']}:{found['process']}  overlap {found['overlap']}  "
        f"catch-up {found['catch_up']}  from {found['source']}",
        f"  next: {', '.join(_when(t) for t in found['upcoming'][:3]) or '-'}",
        f"  fired {found['fires']} times, skipped {found['skips']}",
    ]
    if found.get("last_skip"):
        skip = found["last_skip"]
        lines.append(f"  last skip: {_when(skip['nominal'])}: {escape(skip['reason'])}")
    for run in found.get("recent_runs", []):
        lines.append(f"  {run['id']}  {run['status']:<9}  for {_when(run['nominal'])}")
    out().print("\n".join(lines))


def _state(found: dict[str, Any], *, short: bool = False) -> str:
    """active, paused (with its note) or orphaned (its agent is not in the newest deploy)."""
    if found.get("orphaned"):  # an older server leaves it out
        return "orphaned" if short else f"orphaned ({found['orphaned']})"
    if found["paused"]:
        return "paused" + (f" ({found['note']})" if found["note"] and not short else "")
    return "active"


@click.group(
    help="Schedules: runs an agent starts on its own, on a cron expression or an interval, "
    "exactly once per time across all workers (docs/schedules.md). A schedule's id is "
    "AGENT/NAME. Every subcommand takes --url (a server) or works on the embedded database "
    "under --agents, and --json."
    + examples(
        "toren schedules list",
        "toren schedules pause triage/nightly --note 'migration tonight'",
        "toren schedules backfill digest/hourly 2026-12-01T00:00 2026-12-02T00:00",
    )
)
def schedules() -> None:
    pass


@schedules.command(
    "list",
    help="Every schedule: when it fires next, paused or not, its last run and skip."
    + examples("toren schedules list", "toren schedules list --json"),
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@backend_options
def list_schedules(as_json: bool, **options: object) -> None:
    async def act(backend: Schedules) -> tuple[list[dict[str, Any]], list[str]]:
        listed = await backend.all()
        return listed, backend.declared_elsewhere(listed)

    listed, pending = _on(options, act)
    if as_json:
        click.echo(json.dumps(listed, indent=2, ensure_ascii=False))
        return
    if not listed and not pending:
        out().print("no schedules (add `schedules:` to an agent.yaml, or toren schedules create)")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("ID", "WHEN", "STATE", "NEXT", "OVERLAP", "LAST RUN", "FIRES", "SKIPS"):
        table.add_column(column)
    for s in listed:
        when = f"{s['cron']} {s['zone']}" if s["cron"] else f"every {s['every']:g}s"
        last = f"{s['last_run_id']} {s['last_run_status']}" if s["last_run_id"] else "-"
        table.add_row(
            escape(s["id"]),
            escape(when),
            _state(s, short=True),
            _when(s["next_fire_at"]),
            s["overlap"],
            last,
            str(s["fires"]),
            str(s["skips"]),
        )
    out().print(table)
    for sid in pending:
        out().print(
            f"{escape(sid)}: declared in agent.yaml; a worker registers it when it starts "
            "(toren dev or toren worker)"
        )


@schedules.command(
    "show",
    help="One schedule, with its next times and recent runs."
    + examples("toren schedules show triage/nightly", "toren schedules show triage/nightly --json"),
)
@click.argument("schedule", callback=lambda ctx, param, value: _sid(value))
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
@backend_options
def show(schedule: str, as_json: bool, **options: object) -> None:
    _print_one(_on(options, lambda b: b.get(schedule)), as_json)


@schedules.command(
    help="Create a schedule at run time (the keys of an agent.yaml schedule)."
    + examples(
        "toren schedules create triage/nightly --cron '0 2 * * *' --zone Europe/Paris",
        'toren schedules create digest/hourly --every 1h --input \'{"since": "1h"}\'',
    ),
)
@click.argument("schedule", callback=lambda ctx, param, value: _sid(value))
@click.option("--cron", default=None, help="Five cron fields, matched in --zone.")
@click.option("--every", default=None, help="An interval: 10m, 1h, or seconds.")
@click.option("--zone", default="UTC", show_default=True, help="IANA time zone of --cron.")
@click.option("--input", "input_", default=None, help="The runs' input (JSON, else text).")
@click.option("--process", default="main", show_default=True)
@click.option(
    "--overlap",
    type=click.Choice(["skip", "buffer_one", "allow_all", "cancel_previous"]),
    default="skip",
    show_default=True,
)
@click.option(
    "--catch-up", type=click.Choice(["latest", "all"]), default="latest", show_default=True
)
@click.option("--catch-up-window", default="1d", show_default=True)
@click.option("--jitter", default="0", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")
@backend_options
def create(
    schedule: str,
    cron: str | None,
    every: str | None,
    zone: str,
    input_: str | None,
    process: str,
    overlap: str,
    catch_up: str,
    catch_up_window: str,
    jitter: str,
    as_json: bool,
    **options: object,
) -> None:
    agent, _, name = schedule.partition("/")
    spec: dict[str, object] = {
        "cron": cron,
        "every": every,
        "zone": zone,
        "process": process,
        "overlap": overlap,
        "catch_up": catch_up,
        "catch_up_window": catch_up_window,
        "jitter": jitter,
    }
    if input_ is not None:
        try:
            spec["input"] = json.loads(input_)
        except ValueError:
            spec["input"] = input_
    spec = {k: v for k, v in spec.items() if v is not None}
    _config(name, spec)  # a bad definition is said here, before anything is opened
    _print_one(_on(options, lambda b: b.create(agent, name, spec)), as_json)


def _pause_command(paused: bool) -> Callable[..., None]:
    def command(schedule: str, note: str | None, as_json: bool, **options: object) -> None:
        _print_one(_on(options, lambda b: b.pause(schedule, note, paused)), as_json)

    return command


for _name, _paused, _help in (
    ("pause", True, "Pause a schedule (no time fires; nothing is caught up on resume)."),
    ("resume", False, "Resume a schedule, from now on."),
):
    schedules.command(
        _name, help=_help + examples(f"toren schedules {_name} triage/nightly --note 'why'")
    )(
        click.argument("schedule", callback=lambda ctx, param, value: _sid(value))(
            click.option("--note", default=None, help="Why (shown in lists).")(
                click.option("--json", "as_json", is_flag=True, help="Print it as JSON.")(
                    backend_options(_pause_command(_paused))
                )
            )
        )
    )


@schedules.command(
    help="Start a run of the schedule now." + examples("toren schedules trigger triage/nightly")
)
@click.argument("schedule", callback=lambda ctx, param, value: _sid(value))
@backend_options
def trigger(schedule: str, **options: object) -> None:
    run_id = _on(options, lambda b: b.trigger(schedule))
    out().print(f"started run {run_id} of schedule {escape(schedule)}")


def _moment(value: str) -> datetime:
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"expected an ISO 8601 time such as 2026-12-01T00:00:00+01:00; got {value!r}"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


@schedules.command(
    help="Start the runs of a past range's times, [START, END), each at most once (a time "
    "that already ran is not run again; the same backfill twice starts nothing). A time "
    "without an offset is UTC."
    + examples("toren schedules backfill digest/hourly 2026-12-01T00:00 2026-12-02T00:00"),
)
@click.argument("schedule", callback=lambda ctx, param, value: _sid(value))
@click.argument("start")
@click.argument("end")
@click.option("--json", "as_json", is_flag=True, help="Print the counts as JSON.")
@backend_options
def backfill(schedule: str, start: str, end: str, as_json: bool, **options: object) -> None:
    first, last = _moment(start), _moment(end)
    done = _on(options, lambda b: b.backfill(schedule, first, last))
    if as_json:
        click.echo(json.dumps(done))
        return
    started, already, refused = done["started"], done["already_ran"], done["refused"]
    out().print(
        f"started {started} run{'s' * (started != 1)}; {already} time"
        f"{'s' * (already != 1)} of the range had already run"
        + (
            f"; {refused} refused by the agent's concurrency (on_conflict: reject)"
            if refused
            else ""
        )
    )


@schedules.command(
    help="Delete a schedule (its runs stay)." + examples("toren schedules delete digest/hourly")
)
@click.argument("schedule", callback=lambda ctx, param, value: _sid(value))
@backend_options
def delete(schedule: str, **options: object) -> None:
    _on(options, lambda b: b.delete(schedule))
    out().print(
        f"deleted schedule {escape(schedule)} (a schedule declared in agent.yaml comes back "
        "when a newer deploy declares it)"
    )
