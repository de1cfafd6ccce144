"""The scheduler: every worker runs one. It looks at the schedules that are due, asks
:func:`toren.core.contract.schedule.decide` what to do, and hands the decision to the store, which
applies it only if no other worker decided first (see toren.store.schedules). Nothing is
kept in memory between looks: a worker killed at any moment leaves nothing half done.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from toren.core.agent_api.program import AgentResolver
from toren.core.contract.clock import Clock
from toren.core.contract.events import RunStarted, make_event
from toren.core.contract.records import NewRun
from toren.core.contract.schedule import (
    Decision,
    ScheduleDef,
    ScheduleState,
    ScheduleStore,
    backfill_times,
    decide,
    firing_key,
    jitter_of,
    nominal_text,
)
from toren.core.contract.values import TERMINAL_STATUSES
from toren.core.drivers.runs import flow_of, new_run_id
from toren.errors import InvalidInput, ScheduleNotFound, TorenError

log = logging.getLogger("toren.scheduler")

# How many due schedules one look takes, and about how many runs it starts at most (the
# rest are taken by the next look, at once). A look is one transaction of a few statements
# whatever its size (toren.store.firing): 1,000 schedules due at one second fire together.
BATCH = 1000
MAX_RUNS = 2000
# The longest a scheduler sleeps without looking at the table: a schedule created or
# resumed by another process is noticed within this.
POLL = 1.0
# The most runs one backfill may start (a larger range is refused: split it).
MAX_BACKFILL = 10_000


@dataclass
class SchedulerMetrics:
    fires: int = 0
    skips: Counter[str] = field(default_factory=Counter)  # by reason
    lost_races: int = 0  # decisions another worker made first
    lateness: list[float] = field(default_factory=list)  # seconds, the last LATENESS_KEPT

    def late(self, seconds: float) -> None:
        self.lateness.append(seconds)
        if len(self.lateness) > LATENESS_KEPT:
            del self.lateness[: len(self.lateness) - LATENESS_KEPT]


LATENESS_KEPT = 4096


@dataclass(frozen=True)
class _Firing:
    schedule: ScheduleState
    decision: Decision
    runs: Sequence[NewRun]


Flow = tuple[str | None, int | None, str]  # a run's concurrency key, limit, on_conflict
NO_FLOW: Flow = (None, None, "enqueue")


def scheduled_run(
    schedule: ScheduleState | ScheduleDef,
    nominal: float,
    now: float,
    *,
    key: str | None = None,
    flow: Flow = NO_FLOW,
) -> NewRun:
    """The run a firing starts: its key ``schedule:{id}:{nominal}`` (two workers that
    both fire it start one run), its origin in the row and in ``RunStarted``, and its
    agent's ``concurrency:`` (``flow``) as any start of the agent has it."""
    run_id = new_run_id(now)
    sid = schedule.id
    started = make_event(
        run_id,
        RunStarted(
            agent=schedule.agent,
            process=schedule.process,
            input=schedule.input,
            schedule={"id": sid, "nominal": nominal_text(nominal)},
        ),
        slot="run:start",
        created_at=now,
    )
    return NewRun(
        run_id,
        schedule.agent,
        schedule.process,
        schedule.input,
        key or firing_key(sid, nominal),
        now,
        started,
        schedule_id=sid,
        scheduled_for=nominal,
        concurrency_key=flow[0],
        concurrency_limit=flow[1],
        on_conflict=flow[2],
    )


class Scheduler:
    """Fires due schedules (:meth:`look`), triggers and backfills. With ``agents`` (the
    code this process runs), each run gets its agent's ``concurrency:`` as a start from
    the API would: a keyed limit queues it, ``on_conflict: reject`` turns a firing of a
    busy key into a recorded skip (toren.store.firing). An agent this process does not
    have is started without a key: the run is the workers' that have it."""

    def __init__(
        self, store: ScheduleStore, clock: Clock, agents: AgentResolver | None = None
    ) -> None:
        self.store = store
        self.clock = clock
        self.agents = agents
        self.metrics = SchedulerMetrics()
        self._held: float | None = None  # the earliest jittered moment the last look saw

    async def look(self) -> int:
        """Decide every due schedule once (a batch of :data:`BATCH`, applied in one
        transaction); the number of runs this worker started."""
        now = self.clock.now()
        firings: list[_Firing] = []
        planned = 0
        self._held = None
        for schedule in await self.store.due(now=now, limit=BATCH):
            decision = decide(
                schedule.spec,
                schedule.id,
                next_fire_at=schedule.next_fire_at,
                now=now,
                last_run=schedule.last_run_id,
                last_running=_running(schedule.last_run_status),
                buffered=schedule.buffered_at,
            )
            if decision is None:
                self._hold(schedule, now)
                continue
            flow = self._flow(schedule)
            runs = [scheduled_run(schedule, t, now, flow=flow) for t in decision.fire]
            firings.append(_Firing(schedule, decision, runs))
            planned += len(runs)
            if planned >= MAX_RUNS:
                break  # a catch-up of many times: the rest are the next look's
        if not firings:
            return 0
        started = 0
        for firing, refused in zip(firings, await self.store.apply(firings, now=now), strict=True):
            if refused is None:
                self.metrics.lost_races += 1
                continue
            not_fired = {skip.nominal for skip in refused}
            fired = [t for t in firing.decision.fire if t not in not_fired]
            started += len(fired)
            self.metrics.fires += len(fired)
            for t in fired:
                self.metrics.late(max(0.0, now - t))
            for skip in [*firing.decision.skips, *refused]:
                self.metrics.skips[skip.reason] += 1
                log.info(
                    "schedule %s skipped %s: %s",
                    firing.schedule.id,
                    nominal_text(skip.nominal),
                    skip.reason,
                )
        return started

    def _hold(self, schedule: ScheduleState, now: float) -> None:
        """A due schedule that decided nothing: its time waits for its jitter (or a
        buffered time for the last run to end, which a later look sees)."""
        jittered = schedule.next_fire_at + jitter_of(
            schedule.id, schedule.next_fire_at, schedule.spec.jitter
        )
        if jittered > now and (self._held is None or jittered < self._held):
            self._held = jittered

    async def sleep_for(self) -> float:
        """How long until the next look: the next nominal time (or, for a time already
        due but jittered, its moment), at most :data:`POLL`."""
        now = self.clock.now()
        next_due = await self.store.next_due()
        if next_due is None:
            return POLL
        if next_due <= now:
            # Due but not fired by the last look: jittered (wait for its moment), or
            # decided by another worker meanwhile (look again now).
            return max(0.0, min(POLL, (self._held or now) - now))
        return max(0.0, min(POLL, next_due - now))

    async def trigger(self, sid: str) -> NewRun:
        """Start a run of the schedule now, whatever its timeline and overlap policy (a
        person asked for it); its nominal time is now, its key marks it as triggered."""
        schedule = await self._get(sid)
        now = self.clock.now()
        nominal = float(int(now))
        run = scheduled_run(
            schedule,
            nominal,
            now,
            key=f"schedule:{sid}:trigger:{nominal_text(now)}:{now!r}",
            flow=self._flow(schedule),
        )
        await self.store.start(sid, [run])  # ConcurrencyConflict: the agent refuses it
        return run

    async def backfill(self, sid: str, start: float, end: float) -> tuple[int, int, int]:
        """Start a run for every nominal time in ``[start, end)``, each under the key
        its timely firing would have had: a time that already ran is not run again, and
        the same backfill twice starts nothing the second time. Each run gets its agent's
        concurrency: a keyed limit queues them, ``on_conflict: reject`` refuses the ones
        its key is busy for. (started, already ran, refused)."""
        schedule = await self._get(sid)
        now = self.clock.now()
        if end > now:
            raise InvalidInput(
                f"a backfill needs its end after its start and not in the future (now "
                f"{nominal_text(now)}); found the end {nominal_text(end)}: times still to "
                "come fire on the schedule's timeline"
            )
        if not end > start:
            raise InvalidInput(
                f"a backfill needs its end after its start; found {nominal_text(start)} .. "
                f"{nominal_text(end)}"
            )
        wanted = []
        flow = self._flow(schedule)
        for t in backfill_times(schedule.spec, start, end):
            wanted.append(scheduled_run(schedule, t, now, flow=flow))
            if len(wanted) > MAX_BACKFILL:
                raise InvalidInput(f"a backfill of more than {MAX_BACKFILL} times; split the range")
        made, refused = await self.store.start(sid, wanted, refuse=True)
        return len(made), len(wanted) - len(made) - len(refused), len(refused)

    def _flow(self, schedule: ScheduleState) -> Flow:
        """The agent's concurrency for this schedule's runs, from the code this process
        runs (none known: no key)."""
        if self.agents is None:
            return NO_FLOW
        try:
            program = self.agents.resolve(schedule.agent, schedule.process)
        except TorenError:
            return NO_FLOW
        return flow_of(program.concurrency, schedule.agent, schedule.process, schedule.input)

    async def _get(self, sid: str) -> ScheduleState:
        schedule = await self.store.get(sid)
        if schedule is None or schedule.removed:
            raise ScheduleNotFound(f"no schedule {sid!r}")
        if schedule.orphaned:
            raise InvalidInput(f"schedule {sid!r} does not fire: {schedule.orphaned}")
        return schedule


def _running(status: str | None) -> bool:
    return status is not None and status not in TERMINAL_STATUSES
