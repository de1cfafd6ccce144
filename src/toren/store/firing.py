"""Applying one look's firings (toren.store.schedules): one transaction of a few
statements, however many firings it holds.

1. The schedule rows are read (on PostgreSQL locked ``FOR UPDATE``, in id order, so two
   workers applying overlapping batches wait for each other instead of deadlocking) and
   each firing is kept only if its row still holds the ``next_fire_at`` and
   ``buffered_at`` it was decided from: the compare-and-set. A firing another worker
   applied first writes nothing.
2. One query finds the runs already holding the firings' idempotency keys
   (``schedule:{id}:{nominal}``: a backfill, or an earlier firing, took them); those are
   not started again (the unique index on the key is the second guard).
3. A run whose agent refuses a second start of a busy concurrency key
   (``on_conflict: reject``) is not started: its time is recorded as a skip. One that
   cancels the previous runs (``cancel_previous``) asks them to cancel.
4. One statement updates the schedule rows, one inserts the runs, one their
   ``RunStarted`` events: on PostgreSQL each is a single statement over ``unnest`` of
   arrays (parametrised, the columns named); on SQLite, where a statement is a function
   call, ``executemany``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from toren.core.contract.audit import chain
from toren.core.contract.jsontext import dumps
from toren.core.contract.records import NewRun
from toren.core.contract.schedule import Firing, Skip
from toren.store.flow import unfinished_of
from toren.store.rows import event_params

Cursor = Any  # a DB-API cursor (toren.store.sql.Cursor; not imported: sql imports this)

# SQLite's ``IN (...)`` lists are cut into pieces of this many values.
CHUNK = 500

RUN_INSERT_COLUMNS = (
    "id, agent, process, status, input, idempotency_key, created_at, updated_at, "
    "schedule_id, scheduled_for, concurrency_key, concurrency_limit, priority"
)
EVENT_INSERT_COLUMNS = (
    "run_id, stream, position, generation, slot, type, digest, code_version, worker_id, "
    "created_at, format_version, payload, chain"
)
SQLITE_UPDATE = (
    "UPDATE schedules SET next_fire_at = ?, buffered_at = ?, "
    "last_fired_at = COALESCE(?, last_fired_at), last_run_id = COALESCE(?, last_run_id), "
    "last_skip_at = COALESCE(?, last_skip_at), "
    "last_skip_reason = COALESCE(?, last_skip_reason), fires = fires + ?, "
    "skips = skips + ?, lateness_total = lateness_total + ?, updated_at = ? WHERE id = ?"
)
PG_UPDATE = (
    "UPDATE schedules AS s SET next_fire_at = v.next_fire_at, buffered_at = v.buffered_at, "
    "last_fired_at = COALESCE(v.last_fired_at, s.last_fired_at), "
    "last_run_id = COALESCE(v.last_run_id, s.last_run_id), "
    "last_skip_at = COALESCE(v.last_skip_at, s.last_skip_at), "
    "last_skip_reason = COALESCE(v.last_skip_reason, s.last_skip_reason), "
    "fires = s.fires + v.fires, skips = s.skips + v.skips, "
    "lateness_total = s.lateness_total + v.lateness, updated_at = v.updated_at "
    "FROM unnest(?::float8[], ?::float8[], ?::float8[], ?::text[], ?::float8[], ?::text[], "
    "?::int8[], ?::int8[], ?::float8[], ?::float8[], ?::text[]) AS v (next_fire_at, "
    "buffered_at, last_fired_at, last_run_id, last_skip_at, last_skip_reason, fires, skips, "
    "lateness, updated_at, id) WHERE s.id = v.id"
)
SQLITE_RUNS = (
    f"INSERT INTO runs ({RUN_INSERT_COLUMNS}) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
PG_RUNS = (
    f"INSERT INTO runs ({RUN_INSERT_COLUMNS}) "
    "SELECT v.id, v.agent, v.process, 'queued', v.input, v.idempotency_key, v.created_at, "
    "v.updated_at, v.schedule_id, v.scheduled_for, v.concurrency_key, v.concurrency_limit, "
    "v.priority FROM unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::text[], "
    "?::float8[], ?::float8[], ?::text[], ?::float8[], ?::text[], ?::int8[], ?::int8[]) "
    "AS v (id, agent, process, input, idempotency_key, created_at, updated_at, "
    "schedule_id, scheduled_for, concurrency_key, concurrency_limit, priority)"
)
SQLITE_EVENTS = (
    f"INSERT INTO events ({EVENT_INSERT_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
PG_EVENTS = (
    f"INSERT INTO events ({EVENT_INSERT_COLUMNS}) "
    "SELECT v.run_id, v.stream, v.position, v.generation, v.slot, v.type, v.digest, "
    "v.code_version, v.worker_id, v.created_at, v.format_version, v.payload, v.chain "
    "FROM unnest(?::text[], ?::text[], ?::int8[], ?::int8[], ?::text[], ?::text[], "
    "?::text[], ?::text[], ?::text[], ?::float8[], ?::int8[], ?::text[], ?::text[]) "
    "AS v (run_id, stream, position, generation, slot, type, digest, code_version, "
    "worker_id, created_at, format_version, payload, chain)"
)


class Host(Protocol):
    dialect: str

    def _x(self, cur: Cursor, sql: str, params: Sequence[object] = ()) -> Cursor: ...
    def _cancel_in(self, cur: Cursor, run_id: str, *, now: float) -> None: ...


def conflict_skip(key: str, holder: str) -> str:
    return (
        f"run {holder} of concurrency key {key!r} is not finished (concurrency.on_conflict: reject)"
    )


@dataclass
class _Outcome:
    """What one applied firing did."""

    firing: Firing
    fired: list[float] = field(default_factory=list)
    holders: list[str] = field(default_factory=list)
    rejected: list[Skip] = field(default_factory=list)


def apply_firings(
    host: Host, cur: Cursor, firings: Sequence[Firing], now: float
) -> list[list[Skip] | None]:
    """Apply ``firings`` in the open transaction: per firing, None if another worker
    decided it first (nothing of it is written), else the times its agent's concurrency
    refused (``on_conflict: reject``), recorded as skips."""
    pg = host.dialect == "postgres"
    ids = sorted({f.schedule.id for f in firings})
    rows = _select_in(
        host,
        cur,
        "SELECT id, next_fire_at, buffered_at FROM schedules WHERE removed = 0 AND "
        "paused = 0 AND orphaned IS NULL AND {in} ORDER BY id" + (" FOR UPDATE" if pg else ""),
        "id",
        ids,
    )
    current = {row[0]: (row[1], row[2]) for row in rows}
    results: list[list[Skip] | None] = [None] * len(firings)
    won: list[tuple[int, Firing]] = []
    for i, f in enumerate(firings):
        s = f.schedule
        if current.pop(s.id, None) == (s.next_fire_at, s.buffered_at):
            won.append((i, f))
    if not won:
        return results
    keys = [run.idempotency_key for _, f in won for run in f.runs if run.idempotency_key]
    taken = {
        row[0]: row[1]
        for row in _select_in(
            host, cur, "SELECT idempotency_key, id FROM runs WHERE {in}", "idempotency_key", keys
        )
    }
    new_runs: list[NewRun] = []
    cancels: list[str] = []
    busy: dict[str, str] = {}  # concurrency key -> a run of it started in this batch
    outcomes = []
    for i, f in won:
        out = _Outcome(f)
        for t, run in zip(f.decision.fire, f.runs, strict=True):
            holder = taken.get(run.idempotency_key or "")
            if holder is None:
                refused = _flow(host, cur, run, busy, cancels, pg)
                if refused is not None:
                    out.rejected.append(Skip(t, refused))
                    continue
                new_runs.append(run)
                holder = run.id
            out.fired.append(t)
            out.holders.append(holder)
        if f.decision.cancel is not None:
            cancels.append(f.decision.cancel)
        outcomes.append(out)
        results[i] = out.rejected
    _update_rows(host, cur, outcomes, now, pg)
    _insert_runs(host, cur, new_runs, pg)
    for run_id in cancels:
        host._cancel_in(cur, run_id, now=now)
    return results


def _flow(
    host: Host,
    cur: Cursor,
    run: NewRun,
    busy: dict[str, str],
    cancels: list[str],
    pg: bool,
) -> str | None:
    """A run's concurrency conflict policy at its start, as ``SqlStore._insert_new_run``
    applies it: the reason it is refused (``reject`` with unfinished runs of its key), or
    None (started; ``cancel_previous`` asks the unfinished ones to cancel)."""
    key = run.concurrency_key
    if key is None:
        return None
    unfinished: list[str] = []
    if run.on_conflict != "enqueue":
        if pg:
            host._x(cur, "SELECT pg_advisory_xact_lock(hashtextextended(?, 7031))", (key,))
        unfinished = unfinished_of(host, cur, key)
        if key in busy:
            unfinished.append(busy[key])
    if unfinished and run.on_conflict == "reject":
        return conflict_skip(key, unfinished[0])
    if run.on_conflict == "cancel_previous":
        cancels.extend(unfinished)
    busy[key] = run.id
    return None


def _select_in(host: Host, cur: Cursor, sql: str, column: str, values: Sequence[str]) -> list[Any]:
    """``sql`` with ``{in}`` standing for ``column`` in ``values``: one ``= ANY(array)``
    on PostgreSQL, ``IN (?, ...)`` lists of at most :data:`CHUNK` on SQLite."""
    if not values:
        return []
    if host.dialect == "postgres":
        return list(
            host._x(cur, sql.format(**{"in": f"{column} = ANY(?::text[])"}), (list(values),))
        )
    found: list[Any] = []
    for start in range(0, len(values), CHUNK):
        part = values[start : start + CHUNK]
        marks = ", ".join("?" for _ in part)
        found += host._x(cur, sql.format(**{"in": f"{column} IN ({marks})"}), part).fetchall()
    return found


def _update_rows(
    host: Host, cur: Cursor, outcomes: Sequence[_Outcome], now: float, pg: bool
) -> None:
    rows = []
    for out in outcomes:
        d, s = out.firing.decision, out.firing.schedule
        skips = [*d.skips, *out.rejected]
        last_skip = max(skips, key=lambda k: k.nominal) if skips else None
        rows.append(
            (
                _real(d.next_fire_at),
                _real(d.buffered),
                _real(out.fired[-1] if out.fired else None),
                out.holders[-1] if out.holders else None,
                _real(last_skip.nominal if last_skip else None),
                last_skip.reason if last_skip else None,
                len(out.fired),
                len(skips),
                float(sum(max(0.0, now - t) for t in out.fired)),
                _real(now),
                s.id,
            )
        )
    if pg:
        host._x(cur, PG_UPDATE, [list(c) for c in zip(*rows, strict=True)])
    else:
        _many(cur, SQLITE_UPDATE, rows)


def _insert_runs(host: Host, cur: Cursor, runs: Sequence[NewRun], pg: bool) -> None:
    if not runs:
        return
    run_rows = []
    event_rows = []
    for run in runs:
        assert not run.events, "a scheduled run starts with its RunStarted alone"
        chain(None, [run.started_event])  # a run's first link (digest.md §7)
        run_rows.append(
            (
                run.id,
                run.agent,
                run.process,
                _json(run.input),
                run.idempotency_key,
                _real(run.created_at),
                _real(run.created_at),
                run.schedule_id,
                _real(run.scheduled_for),
                run.concurrency_key,
                run.concurrency_limit,
                run.priority,
            )
        )
        params = list(event_params(run.started_event))
        params[9] = _real(params[9])  # created_at
        event_rows.append(params)
    if pg:
        host._x(cur, PG_RUNS, [list(c) for c in zip(*run_rows, strict=True)])
        host._x(cur, PG_EVENTS, [list(c) for c in zip(*event_rows, strict=True)])
    else:
        _many(cur, SQLITE_RUNS, run_rows)
        _many(cur, SQLITE_EVENTS, event_rows)


def _real(value: Any) -> float | None:
    """A time as a float: an array parameter must hold one type (a nominal time of an
    ``every`` given as an int is an int), and PostgreSQL's columns are double."""
    return None if value is None else float(value)


def _json(value: object) -> str:
    return dumps(value)


def _many(cur: Cursor, sql: str, rows: Sequence[Sequence[object]]) -> None:
    if rows:
        cur.executemany(sql, rows)
