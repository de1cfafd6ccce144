"""The schedules' SQL (both dialects; see toren.store.sql for the conventions).

Every firing is one write transaction: a compare-and-set on the schedule row's
``next_fire_at`` and ``buffered_at`` (the values the decision was made from), the new
runs with their ``RunStarted`` events (idempotency key ``schedule:{id}:{nominal}``, the
unique index as a second guard), and a cancel request for ``cancel_previous``. A worker
that loses the race, dies before its commit or loses its connection mid-way changes
nothing: the next look decides again from the row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from toren.core.contract.jsontext import dumps
from toren.core.contract.records import NewRun
from toren.core.contract.schedule import (
    Firing,
    ScheduleDef,
    ScheduleSpec,
    ScheduleState,
    Skip,
    next_after,
    schedule_id,
)
from toren.core.contract.values import TERMINAL_STATUSES
from toren.errors import ConcurrencyConflict, InvalidInput, ScheduleNotFound
from toren.store.firing import apply_firings

T = TypeVar("T")
Cursor = Any  # a DB-API cursor (toren.store.sql.Cursor; not imported: sql imports this)


class Host(Protocol):
    """What the statements need of the store they run in (toren.store.sql.SqlStore)."""

    dialect: str

    async def _run(self, fn: Callable[[Cursor], T], *, write: bool = True) -> T: ...
    def _x(self, cur: Cursor, sql: str, params: Sequence[object] = ()) -> Cursor: ...
    def _insert_new_run(self, cur: Cursor, run: NewRun) -> None: ...
    def _cancel_in(self, cur: Cursor, run_id: str, *, now: float) -> None: ...
    async def notify(self) -> None: ...


COLUMNS = (
    "s.id, s.agent, s.name, s.process, s.spec, s.input, s.source, s.code_version, "
    "s.declared_at, s.paused, s.note, s.removed, s.next_fire_at, s.buffered_at, "
    "s.last_fired_at, s.last_run_id, s.last_skip_at, s.last_skip_reason, s.fires, s.skips, "
    "s.lateness_total, s.created_at, s.updated_at, s.orphaned, r.status"
)
FROM = "schedules s LEFT JOIN runs r ON r.id = s.last_run_id"


def _state(row: Sequence[Any]) -> ScheduleState:
    return ScheduleState(
        id=row[0],
        agent=row[1],
        name=row[2],
        process=row[3],
        spec=ScheduleSpec.from_dict(json.loads(row[4])),
        input=json.loads(row[5]) if row[5] is not None else None,
        source=row[6],
        code_version=row[7],
        declared_at=row[8],
        paused=bool(row[9]),
        note=row[10],
        removed=bool(row[11]),
        next_fire_at=row[12],
        buffered_at=row[13],
        last_fired_at=row[14],
        last_run_id=row[15],
        last_skip_at=row[16],
        last_skip_reason=row[17],
        fires=row[18],
        skips=row[19],
        lateness_total=row[20],
        created_at=row[21],
        updated_at=row[22],
        orphaned=row[23],
        last_run_status=row[24],
    )


class SqlSchedules:
    """The ``ScheduleStore`` port over a :class:`~toren.store.sql.SqlStore`."""

    def __init__(self, store: Host) -> None:
        self._store = store

    def _x(self, cur: Cursor, sql: str, params: Sequence[object] = ()) -> Cursor:
        return self._store._x(cur, sql, params)

    def _get(self, cur: Cursor, sid: str) -> ScheduleState | None:
        row = self._x(cur, f"SELECT {COLUMNS} FROM {FROM} WHERE s.id = ?", (sid,)).fetchone()
        return _state(row) if row is not None else None

    def _taken(self, cur: Cursor, run: NewRun) -> str | None:
        """The run that already holds this key (a backfill or an earlier firing started
        it), if any."""
        row = self._x(
            cur, "SELECT id FROM runs WHERE idempotency_key = ?", (run.idempotency_key,)
        ).fetchone()
        return None if row is None else str(row[0])

    async def get(self, sid: str) -> ScheduleState | None:
        return await self._store._run(lambda cur: self._get(cur, sid), write=False)

    async def all(self, *, include_removed: bool = False) -> list[ScheduleState]:
        def tx(cur: Cursor) -> list[ScheduleState]:
            where = "" if include_removed else " WHERE s.removed = 0"
            rows = self._x(cur, f"SELECT {COLUMNS} FROM {FROM}{where} ORDER BY s.id").fetchall()
            return [_state(row) for row in rows]

        return await self._store._run(tx, write=False)

    async def due(self, *, now: float, limit: int) -> list[ScheduleState]:
        """Schedules with a time due (jitter is applied by the caller's decision) or a
        buffered time, neither paused nor removed, earliest first."""

        def tx(cur: Cursor) -> list[ScheduleState]:
            rows = self._x(
                cur,
                f"SELECT {COLUMNS} FROM {FROM} WHERE s.removed = 0 AND s.paused = 0 AND "
                "s.orphaned IS NULL AND (s.next_fire_at <= ? OR s.buffered_at IS NOT NULL) "
                "ORDER BY s.next_fire_at LIMIT ?",
                (now, limit),
            ).fetchall()
            return [_state(row) for row in rows]

        return await self._store._run(tx, write=False)

    async def next_due(self) -> float | None:
        """The earliest next nominal time of an active schedule (the scheduler's sleep)."""

        def tx(cur: Cursor) -> float | None:
            row = self._x(
                cur,
                "SELECT MIN(next_fire_at) FROM schedules WHERE removed = 0 AND paused = 0 "
                "AND orphaned IS NULL",
            ).fetchone()
            return row[0] if row and row[0] is not None else None

        return await self._store._run(tx, write=False)

    async def apply(self, firings: Sequence[Firing], *, now: float) -> list[list[Skip] | None]:
        """Apply decisions in one transaction of a few statements (toren.store.firing),
        each only if its row still holds what it was made from: per firing, None for one
        another worker decided first (nothing of it is written), else the times its
        agent's ``concurrency: on_conflict: reject`` refused (recorded as skips)."""
        if not firings:
            return []
        applied = await self._store._run(lambda cur: apply_firings(self._store, cur, firings, now))
        if any(a is not None and f.runs for a, f in zip(applied, firings, strict=True)):
            await self._store.notify()
        return applied

    async def start(
        self, sid: str, runs: Sequence[NewRun], *, refuse: bool = False
    ) -> tuple[list[NewRun], list[NewRun]]:
        """Start runs of a schedule outside its timeline (trigger, backfill): each
        idempotent by its key, each under its agent's concurrency as any start. (the
        ones that were new, the ones ``on_conflict: reject`` refused); a refusal raises
        ``ConcurrencyConflict`` unless ``refuse``."""

        def tx(cur: Cursor) -> tuple[list[NewRun], list[NewRun]]:
            if self._get(cur, sid) is None:
                raise ScheduleNotFound(f"no schedule {sid!r}")
            made, refused = [], []
            for run in runs:
                if self._taken(cur, run):
                    continue
                try:
                    self._store._insert_new_run(cur, run)
                except ConcurrencyConflict:
                    # Raised before any statement failed: the transaction goes on.
                    if not refuse:
                        raise
                    refused.append(run)
                    continue
                made.append(run)
            return made, refused

        made, refused = await self._store._run(tx)
        if made:
            await self._store.notify()
        return made, refused

    async def create(self, definition: ScheduleDef, *, now: float) -> ScheduleState:
        def tx(cur: Cursor) -> ScheduleState:
            old = self._get(cur, definition.id)
            if old is not None and old.removed:
                # A deleted schedule's name is free again (its runs keep their origin).
                self._x(cur, "DELETE FROM schedules WHERE id = ? AND removed = 1", (old.id,))
            elif old is not None:
                raise InvalidInput(
                    f"a schedule {definition.id!r} already exists; delete it first, or "
                    "choose another name"
                )
            self._insert(cur, definition, source="api", version=None, at=None, now=now)
            found = self._get(cur, definition.id)
            assert found is not None
            return found

        return await self._store._run(tx)

    def _insert(
        self,
        cur: Cursor,
        d: ScheduleDef,
        *,
        source: str,
        version: str | None,
        at: float | None,
        now: float,
    ) -> None:
        self._x(
            cur,
            "INSERT INTO schedules (id, agent, name, process, spec, input, source, "
            "code_version, declared_at, next_fire_at, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                d.id,
                d.agent,
                d.name,
                d.process,
                dumps(d.spec.to_dict()),
                dumps(d.input),
                source,
                version,
                at,
                next_after(d.spec, now),
                now,
                now,
            ),
        )

    async def declare(
        self,
        definitions: Sequence[ScheduleDef],
        *,
        agents: Sequence[str],
        code_version: str,
        started_at: float,
        now: float,
    ) -> None:
        """A worker's agent.yaml schedules for ``agents``: written unless a worker of a
        newer deploy (a later ``started_at``) declared them last, as in the
        invalidation-storm guard. A schedule of these agents that came from agent.yaml and
        is no longer declared is marked removed (its row and history stay). A schedule
        of an agent this code does not have at all (agent.yaml or API) is *orphaned*: it
        stops firing, with the reason shown, until a deploy that has the agent again
        declares (the times in between are not caught up)."""

        def tx(cur: Cursor) -> None:
            declared = {d.id for d in definitions}
            for d in definitions:
                old = self._get(cur, d.id)
                if old is None:
                    self._insert(
                        cur, d, source="agent.yaml", version=code_version, at=started_at, now=now
                    )
                    continue
                if old.source != "agent.yaml" or (old.declared_at or 0) > started_at:
                    continue  # made through the API, or a newer deploy's definition
                same = (old.spec, old.process, old.input, old.removed) == (
                    d.spec,
                    d.process,
                    json.loads(dumps(d.input)),
                    False,
                )
                if same and old.code_version == code_version:
                    continue
                # A changed timing starts from now: times the old spec would have fired
                # are not caught up under the new one.
                next_fire = (
                    old.next_fire_at
                    if old.spec == d.spec and not old.removed
                    else (next_after(d.spec, now))
                )
                self._x(
                    cur,
                    "UPDATE schedules SET process = ?, spec = ?, input = ?, code_version = ?, "
                    "declared_at = ?, removed = 0, next_fire_at = ?, updated_at = ? "
                    "WHERE id = ?",
                    (
                        d.process,
                        dumps(d.spec.to_dict()),
                        dumps(d.input),
                        code_version,
                        started_at,
                        next_fire,
                        now,
                        d.id,
                    ),
                )
            for agent in agents:
                rows = self._x(
                    cur,
                    "SELECT id, declared_at FROM schedules WHERE agent = ? AND "
                    "source = 'agent.yaml' AND removed = 0",
                    (agent,),
                ).fetchall()
                for sid, declared_at in rows:
                    if sid not in declared and (declared_at or 0) <= started_at:
                        self._x(
                            cur,
                            "UPDATE schedules SET removed = 1, code_version = ?, "
                            "declared_at = ?, buffered_at = NULL, updated_at = ? WHERE id = ?",
                            (code_version, started_at, now, sid),
                        )
            self._orphans(cur, set(agents), code_version, started_at, now)

        await self._store._run(tx)

    def _orphans(
        self, cur: Cursor, agents: set[str], code_version: str, started_at: float, now: float
    ) -> None:
        """Orphan the schedules of agents this code lacks, and bring back the orphans of
        agents it has, unless a newer deploy declared them last."""
        rows = self._x(
            cur,
            "SELECT id, agent, spec, declared_at, orphaned FROM schedules WHERE removed = 0",
        ).fetchall()
        for sid, agent, spec, declared_at, orphaned in rows:
            if (declared_at or 0) > started_at:
                continue  # a newer deploy's say
            if agent not in agents and orphaned is None:
                reason = (
                    f"agent {agent!r} is not in code version {code_version!r}, the newest "
                    "deploy: a deploy that has it again brings the schedule back"
                )
                self._x(
                    cur,
                    "UPDATE schedules SET orphaned = ?, code_version = ?, declared_at = ?, "
                    "buffered_at = NULL, updated_at = ? WHERE id = ?",
                    (reason, code_version, started_at, now, sid),
                )
            elif agent in agents and orphaned is not None:
                next_fire = next_after(ScheduleSpec.from_dict(json.loads(spec)), now)
                self._x(
                    cur,
                    "UPDATE schedules SET orphaned = NULL, code_version = ?, declared_at = ?, "
                    "next_fire_at = ?, updated_at = ? WHERE id = ?",
                    (code_version, started_at, next_fire, now, sid),
                )

    async def set_paused(
        self, sid: str, paused: bool, note: str | None, *, now: float
    ) -> ScheduleState:
        """Pause or resume. A resumed schedule starts from now: the times it was paused
        over are not caught up (a pause means "don't")."""

        def tx(cur: Cursor) -> ScheduleState:
            old = self._get(cur, sid)
            if old is None or old.removed:
                raise ScheduleNotFound(f"no schedule {sid!r}")
            next_fire = old.next_fire_at
            if old.paused and not paused:
                next_fire = next_after(old.spec, now)
            self._x(
                cur,
                "UPDATE schedules SET paused = ?, note = ?, next_fire_at = ?, updated_at = ? "
                "WHERE id = ?",
                (int(paused), note, next_fire, now, sid),
            )
            found = self._get(cur, sid)
            assert found is not None
            return found

        return await self._store._run(tx)

    async def delete(self, sid: str, *, now: float) -> None:
        """Remove a schedule (its row stays, marked removed, with its history; its runs are
        untouched). A schedule declared in agent.yaml comes back when a newer deploy
        declares it again."""

        def tx(cur: Cursor) -> None:
            old = self._get(cur, sid)
            if old is None or old.removed:
                raise ScheduleNotFound(f"no schedule {sid!r}")
            self._x(
                cur,
                "UPDATE schedules SET removed = 1, buffered_at = NULL, updated_at = ? WHERE id = ?",
                (now, sid),
            )

        await self._store._run(tx)

    async def runs_of(self, sid: str, *, limit: int) -> list[tuple[str, str, float | None]]:
        """The schedule's newest runs: (id, status, nominal time)."""

        def tx(cur: Cursor) -> list[tuple[str, str, float | None]]:
            rows = self._x(
                cur,
                "SELECT id, status, scheduled_for FROM runs WHERE schedule_id = ? "
                "ORDER BY id DESC LIMIT ?",
                (sid, limit),
            ).fetchall()
            return [(r[0], r[1], r[2]) for r in rows]

        return await self._store._run(tx, write=False)


def is_running(status: str | None) -> bool:
    return status is not None and status not in TERMINAL_STATUSES


__all__ = ["SqlSchedules", "is_running", "schedule_id"]
