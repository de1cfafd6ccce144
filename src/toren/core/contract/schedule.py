"""Schedules: when a schedule fires, and what a firing does. Pure: no clock, no store.

A schedule names an agent process, an input and a spec (a cron expression in a time zone,
or a fixed interval). Each time the spec yields is a *nominal time*; firing it starts one
run whose idempotency key is ``schedule:{id}:{nominal}``, so two workers that both notice
a due time start one run (DESIGN.md, "A schedule firing is a start with a natural key").

What happens at a due time is decided here, from the schedule's row and its last run,
never from a worker's memory (:func:`decide`): the store applies the decision in one
transaction guarded by the row's ``next_fire_at`` (compare-and-set), so exactly one
worker's decision lands per nominal time. The policies follow Temporal's names:

- **overlap** (the last run is still going when a time is due): ``skip`` (the default:
  an agent that is still working on the last hour's triage should not start a second
  one), ``buffer_one`` (start it once the last run ends; one at most waits),
  ``allow_all``, ``cancel_previous`` (ask the running one to cancel, start the new one).
- **catch-up** (several times came due at once: no worker ran, or the database was
  down): ``latest`` (the default: fire the most recent missed time once, not a burst)
  or ``all`` (fire each, subject to the overlap policy). A time older than the
  catch-up window (default one day) is never fired late.
- **jitter**: each nominal time fires up to ``jitter`` seconds late, by an offset
  derived from the schedule and the time (every worker computes the same one).

Time zones and DST (cron only; an interval counts real seconds from the Unix epoch and
is unaffected): cron fields are matched against the wall clock of ``zone``, with
Debian cron's rules as the ``cronsim`` library implements them. For an expression at a
fixed minute and hour (``30 2 * * *``): a local time that does not exist (spring
forward) fires at the first minute that does exist after it (02:30 -> 03:00); a local
time that happens twice (fall back) fires once, at its first occurrence. An expression
with a wildcard minute or hour (``0 * * * *``) fires at each real occurrence of a
matching wall-clock time: the skipped hour has none (23 hourly fires that day), the
repeated hour fires twice (25), so an hourly schedule keeps firing every real hour.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, get_args
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from toren.core.contract.records import NewRun

Overlap = Literal["skip", "buffer_one", "allow_all", "cancel_previous"]
CatchUp = Literal["latest", "all"]
OVERLAPS: tuple[str, ...] = get_args(Overlap)
CATCH_UPS: tuple[str, ...] = get_args(CatchUp)

DEFAULT_CATCH_UP_WINDOW = 86_400.0
# The most nominal times one decision looks at: a schedule every second left off for a
# week is caught up in bounded steps, never by listing 600,000 times at once.
MAX_DUE = 1_000
MIN_INTERVAL = 1.0
MAX_NAME = 64


class ScheduleError(ValueError):
    """A schedule definition that cannot fire: the message names the field and what is
    expected (agent.yaml turns it into an AgentConfigError, the API into a 422)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class ScheduleSpec:
    """When and how a schedule fires (the stored definition; see the module docstring)."""

    cron: str | None = None
    every: float | None = None
    zone: str = "UTC"
    jitter: float = 0.0
    overlap: str = "skip"
    catch_up: str = "latest"
    catch_up_window: float = DEFAULT_CATCH_UP_WINDOW

    def __post_init__(self) -> None:
        check_spec(self)

    def to_dict(self) -> dict[str, object]:
        return {
            "cron": self.cron,
            "every": self.every,
            "zone": self.zone,
            "jitter": self.jitter,
            "overlap": self.overlap,
            "catch_up": self.catch_up,
            "catch_up_window": self.catch_up_window,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScheduleSpec:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)


@dataclass(frozen=True)
class ScheduleDef:
    """A schedule: its identity (``agent/name``), what it starts and when."""

    agent: str
    name: str
    spec: ScheduleSpec
    process: str = "main"
    input: Any = None

    @property
    def id(self) -> str:
        return schedule_id(self.agent, self.name)


def schedule_id(agent: str, name: str) -> str:
    return f"{agent}/{name}"


def check_name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= MAX_NAME
        or not all(c.isalnum() or c in "._-" for c in name)
        or not name[0].isalnum()
    ):
        raise ScheduleError(
            "name",
            f"a name of letters, digits, '.', '_' or '-' starting with a letter or digit, "
            f"at most {MAX_NAME} characters; found {name!r}",
        )
    return name


def check_spec(spec: ScheduleSpec) -> None:
    """Refuse a definition that would never fire, or fire on nonsense."""
    if (spec.cron is None) == (spec.every is None):
        raise ScheduleError(
            "cron/every", "exactly one of 'cron' (e.g. '0 * * * *') or 'every' (e.g. '1h')"
        )
    _zone(spec.zone)
    if spec.cron is not None:
        check_cron(spec.cron)
    if spec.every is not None:
        check_every(spec.every)
    if spec.overlap not in OVERLAPS:
        raise ScheduleError("overlap", f"one of {', '.join(OVERLAPS)}; found {spec.overlap!r}")
    if spec.catch_up not in CATCH_UPS:
        raise ScheduleError("catch_up", f"one of {', '.join(CATCH_UPS)}; found {spec.catch_up!r}")
    check_seconds("jitter", spec.jitter)
    check_seconds("catch_up_window", spec.catch_up_window)
    if spec.every is not None and spec.jitter >= spec.every:
        # Each time would fire after the next one is due: with catch_up all they would
        # queue up behind one another, each later than the last.
        raise ScheduleError(
            "jitter",
            f"less than the interval ({spec.every:g} s): a jitter spreads each time's "
            f"start within its own interval; found {spec.jitter:g}",
        )


def check_cron(expr: object) -> str:
    if not isinstance(expr, str) or len(expr.split()) != 5:
        raise ScheduleError(
            "cron",
            "a cron expression of five fields 'minute hour day-of-month month "
            f"day-of-week', e.g. '0 9 * * 1-5'; found {expr!r}",
        )
    try:
        next(CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC)))
    except (CronSimError, StopIteration, ValueError) as exc:
        raise ScheduleError("cron", f"{expr!r} is not a valid cron expression ({exc})") from None
    return expr


def check_every(every: object) -> float:
    if (
        isinstance(every, bool)
        or not isinstance(every, int | float)
        or not math.isfinite(every)
        or every < MIN_INTERVAL
        or every != int(every)
    ):
        raise ScheduleError(
            "every",
            f"an interval of whole seconds, at least {MIN_INTERVAL:g} s (e.g. '10m' or "
            f"'1h'); found {every!r}",
        )
    return float(every)


def check_seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ScheduleError(name, f"a number of seconds >= 0; found {value!r}")
    if not math.isfinite(value):
        raise ScheduleError(name, f"a finite number of seconds; found {value!r}")
    return float(value)


def check_zone(name: object) -> str:
    _zone(name)
    assert isinstance(name, str)
    return name


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ScheduleError("zone", f"an IANA time zone such as 'Europe/Paris'; found {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            "zone", f"an IANA time zone such as 'Europe/Paris' or 'UTC'; found {name!r}"
        ) from None


# -- when -----------------------------------------------------------------------------


def next_after(spec: ScheduleSpec, t: float) -> float:
    """The first nominal time strictly after ``t`` (seconds since the epoch)."""
    if spec.every is not None:
        return float((math.floor(t / spec.every) + 1) * spec.every)
    assert spec.cron is not None
    zone = ZoneInfo(spec.zone)
    # cronsim counts whole seconds: start from the second t falls in.
    start = datetime.fromtimestamp(math.floor(t), tz=UTC).astimezone(zone)
    found: datetime = next(CronSim(spec.cron, start))
    return found.timestamp()


def times(spec: ScheduleSpec, first: float, upto: float, limit: int = MAX_DUE) -> list[float]:
    """The nominal times from ``first`` (itself one, or the first after it) up to and
    including ``upto``, at most ``limit``."""
    found: list[float] = []
    t = first if _is_nominal(spec, first) else next_after(spec, first)
    while t <= upto and len(found) < limit:
        found.append(t)
        t = next_after(spec, t)
    return found


def _is_nominal(spec: ScheduleSpec, t: float) -> bool:
    return next_after(spec, t - 1) == t if t == math.floor(t) else False


def jitter_of(schedule: str, nominal: float, jitter: float) -> float:
    """The offset (0 <= offset < jitter) at which ``nominal`` fires: the same on every
    worker, spread evenly across times and schedules."""
    if jitter <= 0:
        return 0.0
    digest = hashlib.sha256(f"{schedule}|{nominal!r}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 * jitter


def nominal_text(nominal: float) -> str:
    """A nominal time as the idempotency key and the API write it: UTC, ISO 8601,
    seconds precision (nominal times are whole seconds)."""
    return datetime.fromtimestamp(nominal, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def firing_key(schedule: str, nominal: float) -> str:
    return f"schedule:{schedule}:{nominal_text(nominal)}"


# -- what -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Skip:
    nominal: float
    reason: str


@dataclass
class Decision:
    """What one look at a due schedule does, applied by the store in one transaction:
    start a run for each of ``fire`` (in order), record ``skips``, ask ``cancel`` to stop,
    keep ``buffered`` for later, and move ``next_fire_at`` on."""

    next_fire_at: float
    fire: list[float] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    buffered: float | None = None
    cancel: str | None = None

    @property
    def changed(self) -> bool:
        return bool(self.fire or self.skips or self.cancel) or self.buffered is not None


def due(spec: ScheduleSpec, schedule: str, next_fire_at: float, now: float) -> list[float]:
    """The nominal times from ``next_fire_at`` whose (jittered) moment has come, in
    order: a time whose moment comes before an earlier time's (a jitter longer than the
    gap between them) waits for that earlier time, so no time is passed over."""
    found = []
    for t in times(spec, next_fire_at, now):
        if t + jitter_of(schedule, t, spec.jitter) > now:
            break
        found.append(t)
    return found


def decide(
    spec: ScheduleSpec,
    schedule: str,
    *,
    next_fire_at: float,
    now: float,
    last_run: str | None,
    last_running: bool,
    buffered: float | None,
) -> Decision | None:
    """What to do now; None when nothing is due (and no buffered time can start)."""
    ready = due(spec, schedule, next_fire_at, now)
    decision = Decision(
        next_fire_at=next_after(spec, ready[-1]) if ready else next_fire_at,
        buffered=buffered,
    )
    if buffered is not None and not last_running:
        decision.fire.append(buffered)  # its wait is over: the last run ended
        decision.buffered = None
        last_running = True  # what fires now is the run the next times meet
    window_start = now - spec.catch_up_window
    timely: list[float] = []
    for t in ready:
        if t < window_start:
            decision.skips.append(Skip(t, "older than the catch-up window"))
        else:
            timely.append(t)
    if len(ready) >= MAX_DUE and spec.catch_up == "latest":
        # More missed times than one look reads: the latest is further on. These are all
        # skipped; a later look (at once) reaches the latest and fires it alone.
        decision.skips += [Skip(t, "missed; catch-up fires only the latest") for t in timely]
        timely = []
    if len(timely) > 1 and spec.catch_up == "latest":
        for t in timely[:-1]:
            decision.skips.append(Skip(t, "missed; catch-up fires only the latest"))
        timely = timely[-1:]
    for t in timely:
        _overlap(spec, decision, t, last_run if not decision.fire else None, last_running)
        last_running = last_running or bool(decision.fire)
    if not ready and not decision.fire and decision.buffered == buffered:
        return None  # nothing due, and a buffered time still waits: nothing to write
    return decision


def _overlap(
    spec: ScheduleSpec, decision: Decision, t: float, last_run: str | None, running: bool
) -> None:
    if not running or spec.overlap == "allow_all":
        decision.fire.append(t)
    elif spec.overlap == "skip":
        decision.skips.append(Skip(t, "the previous run is still running (overlap: skip)"))
    elif spec.overlap == "buffer_one":
        if decision.buffered is None:
            decision.buffered = t
        else:
            decision.skips.append(
                Skip(
                    t,
                    "the previous run is still running and one time already waits "
                    "(overlap: buffer_one)",
                )
            )
    else:  # cancel_previous
        if last_run is not None:
            decision.cancel = last_run
        decision.fire.append(t)


def backfill_times(spec: ScheduleSpec, start: float, end: float) -> Iterator[float]:
    """The nominal times in ``[start, end)``."""
    t = start if _is_nominal(spec, start) else next_after(spec, start)
    while t < end:
        yield t
        t = next_after(spec, t)


@dataclass(frozen=True)
class ScheduleState:
    """A schedule's stored row, with its last run's status (None: no run yet)."""

    id: str
    agent: str
    name: str
    process: str
    spec: ScheduleSpec
    input: Any
    source: str  # "agent.yaml" or "api"
    code_version: str | None
    declared_at: float | None
    paused: bool
    note: str | None
    removed: bool
    next_fire_at: float
    buffered_at: float | None
    last_fired_at: float | None
    last_run_id: str | None
    last_skip_at: float | None
    last_skip_reason: str | None
    fires: int
    skips: int
    lateness_total: float
    created_at: float
    updated_at: float
    orphaned: str | None  # why it does not fire: its agent is not in the newest deploy
    last_run_status: str | None

    def upcoming(self, count: int) -> list[float]:
        """The next ``count`` nominal times (none while paused, orphaned or removed)."""
        if self.paused or self.removed or self.orphaned:
            return []
        found = [self.next_fire_at]
        while len(found) < count:
            found.append(next_after(self.spec, found[-1]))
        return found[:count]

    def to_dict(self, *, upcoming: int = 5) -> dict[str, object]:
        """The public JSON shape (HTTP API, ``toren schedules list --json``)."""
        return {
            "id": self.id,
            "agent": self.agent,
            "name": self.name,
            "process": self.process,
            **self.spec.to_dict(),
            "input": self.input,
            "source": self.source,
            "code_version": self.code_version,
            "paused": self.paused,
            "note": self.note,
            "orphaned": self.orphaned,
            "next_fire_at": (
                None if self.paused or self.orphaned else nominal_text(self.next_fire_at)
            ),
            "upcoming": [nominal_text(t) for t in self.upcoming(upcoming)],
            "buffered": nominal_text(self.buffered_at) if self.buffered_at else None,
            "last_fired_for": nominal_text(self.last_fired_at) if self.last_fired_at else None,
            "last_run_id": self.last_run_id,
            "last_run_status": self.last_run_status,
            "last_skip": (
                {"nominal": nominal_text(self.last_skip_at), "reason": self.last_skip_reason}
                if self.last_skip_at is not None
                else None
            ),
            "fires": self.fires,
            "skips": self.skips,
            "mean_lateness_seconds": (
                round(self.lateness_total / self.fires, 3) if self.fires else None
            ),
        }


class Firing(Protocol):
    """A decision to apply: the row it was made from, what it does, the runs it starts
    (one per time of ``decision.fire``, in order)."""

    @property
    def schedule(self) -> ScheduleState: ...
    @property
    def decision(self) -> Decision: ...
    @property
    def runs(self) -> Sequence[NewRun]: ...


class ScheduleStore(Protocol):
    """The schedules' port (toren.store.schedules implements it for both databases)."""

    async def get(self, sid: str) -> ScheduleState | None: ...
    async def all(self, *, include_removed: bool = False) -> list[ScheduleState]: ...
    async def due(self, *, now: float, limit: int) -> list[ScheduleState]: ...
    async def next_due(self) -> float | None: ...
    async def apply(self, firings: Sequence[Firing], *, now: float) -> list[list[Skip] | None]: ...
    async def start(
        self, sid: str, runs: Sequence[NewRun], *, refuse: bool = False
    ) -> tuple[list[NewRun], list[NewRun]]: ...
    async def create(self, definition: ScheduleDef, *, now: float) -> ScheduleState: ...
    async def declare(
        self,
        definitions: Sequence[ScheduleDef],
        *,
        agents: Sequence[str],
        code_version: str,
        started_at: float,
        now: float,
    ) -> None: ...
    async def set_paused(
        self, sid: str, paused: bool, note: str | None, *, now: float
    ) -> ScheduleState: ...
    async def delete(self, sid: str, *, now: float) -> None: ...
    async def runs_of(self, sid: str, *, limit: int) -> list[tuple[str, str, float | None]]: ...
