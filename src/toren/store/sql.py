"""SQL shared by both dialects. Statements use ``?`` placeholders (the PostgreSQL store
rewrites them to ``%s``) and name every column: an older release must be able to run
against a newer schema, and a newer one against an older row layout.

Parametrised SQL only: f-strings here splice constant column lists and ``?``
placeholder lists, never a value. The logic is written once, as synchronous functions
over a DB-API cursor, and each dialect runs them on its own threads (``SqlStore._run``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any, Protocol, TypeVar

from toren.config import RateLimit
from toren.core.contract.audit import chain
from toren.core.contract.events import Event, parse_payload
from toren.core.contract.flow import FlowView, Queued
from toren.core.contract.jsontext import dumps
from toren.core.contract.ratelimit import Grant
from toren.core.contract.values import TERMINAL_STATUSES, RunStatus
from toren.errors import (
    ConcurrencyConflict,
    CorruptEventLog,
    IdempotencyConflict,
    LeaseLost,
    MessageConsumed,
    RunNotFound,
    RunNotRetryable,
    StorageError,
)
from toren.store import ratelimits
from toren.store import search as search_query
from toren.store.base import (
    InboxMessage,
    Lease,
    NewRun,
    Release,
    RunDelta,
    RunRecord,
    SearchBacklog,
    SearchSource,
    ValueSummary,
    WorkerInfo,
    read_json,
)
from toren.store.flow import key_queues, queued_because, set_limits, unfinished_of
from toren.store.rows import event_params as event_params
from toren.store.schedules import SqlSchedules
from toren.store.schema import LIST_COLUMNS, byte_size, summary_expressions

T = TypeVar("T")


class Cursor(Protocol):
    """What the statements need of a DB-API cursor (sqlite3's and psycopg's both fit).
    Rows stay untyped: each statement names its columns, and its reader unpacks them."""

    @property
    def rowcount(self) -> int: ...
    def execute(self, sql: str, params: Sequence[object] = ..., /) -> Cursor: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


RUN_COLUMNS = (
    "id, agent, process, status, input, output, error, idempotency_key, created_at, "
    "updated_at, lease_owner, lease_epoch, lease_expires_at, not_before, cancel_requested, "
    "waiting_for, input_tokens, output_tokens, cost_nanousd, saved_nanousd, steps, "
    "code_version, lease_recoveries, invalidations, retries, forked_from, forked_at, "
    "blocked_error, blocked_attempts, blocked_since, schedule_id, scheduled_for, "
    "concurrency_key, concurrency_limit, priority, tool_errors, paced"
)
EVENT_COLUMNS = (
    "seq, run_id, stream, position, generation, slot, type, digest, code_version, "
    "worker_id, created_at, format_version, payload, chain"
)
INSERT_EVENT = (
    "INSERT INTO events (run_id, stream, position, generation, slot, type, digest, "
    "code_version, worker_id, created_at, format_version, payload, chain) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
# The same insert, guarded by the lease: it inserts nothing unless the lease still holds.
INSERT_EVENT_FENCED = (
    "INSERT INTO events (run_id, stream, position, generation, slot, type, digest, "
    "code_version, worker_id, created_at, format_version, payload, chain) "
    "SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM runs "
    "WHERE id = ? AND lease_owner = ? AND lease_epoch = ?{lock})"
)
# A body another run stored first is counted as shared (``shares``), never left as it is:
# prune deletes a pruned run's bodies that no other run stored (``shares = 0``), and this
# update (it waits for, or makes wait, the prune's delete of the same row) is what stops a
# step that stores a body at that very moment from losing it (docs/storage.md#retention).
INSERT_BLOBS = (
    "INSERT INTO blobs (hash, body, size, run_id) VALUES {rows} ON CONFLICT (hash) DO UPDATE "
    "SET shares = blobs.shares + 1 WHERE blobs.run_id IS NULL OR blobs.run_id <> excluded.run_id"
)


@functools.lru_cache(maxsize=64)
def insert_blobs_sql(count: int) -> str:
    """The insert of ``count`` message bodies (made once per count: a step stores two)."""
    return INSERT_BLOBS.format(rows=", ".join("(?, ?, ?, ?)" for _ in range(count)))


def blob_params(run_id: str, blobs: Mapping[str, str]) -> list[object]:
    """The parameters of :func:`insert_blobs_sql` for one run's bodies, in hash order (as
    every writer inserts them, so two statements cannot deadlock on them)."""
    return [v for key, body in sorted(blobs.items()) for v in (key, body, len(body), run_id)]


CLAIMABLE = (
    "((status IN ('queued', 'running') AND (not_before IS NULL OR not_before <= ?)) "
    "OR (status = 'waiting' AND not_before IS NOT NULL AND not_before <= ?)) "
    "AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at < ?)"
)

# The earliest wake-up time after ``now`` of a run with a timer (``not_before``): one probe
# of the ``runs_claim`` index (status, not_before) per unfinished status, so its cost does
# not depend on how many runs are parked. A worker sleeps until then (toren.core.drivers.worker).
# Runs whose search text is missing or older than the run (the indexer's work), found
# from the last change it saw on through ``runs_updated``.
_PHASE = "CASE WHEN r.status IN ('completed', 'failed', 'cancelled') THEN r.status ELSE 'open' END"
SEARCH_BACKLOG = (
    f"SELECT r.id, r.updated_at, {_PHASE}, r.agent, r.input, r.output, r.error FROM runs r "
    "LEFT JOIN run_search s ON s.run_id = r.id WHERE r.updated_at >= ? "
    f"AND (s.run_id IS NULL OR s.phase <> {_PHASE}{{stale}}) ORDER BY r.updated_at LIMIT ?"
)
# On PostgreSQL a row without its stored vector (written before ``run_search.vector``
# existed) is written again, vector included: the backfill, in the indexer's batches.
SEARCH_BACKLOG_SQLITE = SEARCH_BACKLOG.format(stale="")
SEARCH_BACKLOG_POSTGRES = SEARCH_BACKLOG.format(stale=" OR s.vector IS NULL")
PUT_SEARCH_TEXT = (
    "INSERT INTO run_search (run_id, body, phase) VALUES (?, ?, ?) "
    "ON CONFLICT (run_id) DO UPDATE SET body = excluded.body, phase = excluded.phase"
)
# PostgreSQL's planner prices a match against the stored vector (``vector @@ query``) as
# one cheap operator per row, and ``run_search``'s own pages are few (its texts and vectors
# live out of line, in TOAST): so it scans the table, or walks its primary key, reading
# every row's vector (~40 KB each; 2 s at 10,000 runs), rather than ask the GIN index
# (milliseconds). A search is therefore planned without sequential and plain index scans
# (``SET LOCAL``: this transaction only); the GIN index is read as a bitmap, and the runs
# it finds through their primary key, also as bitmaps.
# A PostgreSQL run_search row whose stored vector matches the query (one parameter).
_PG_SEARCH_MATCH = "vector @@ to_tsquery('simple', ?)"
SEARCH_PLAN = ("SET LOCAL enable_seqscan = off", "SET LOCAL enable_indexscan = off")
# PostgreSQL stores the vector with the text (SEARCH_VECTOR over the new body), computed
# by the database from the one copy of the body sent.
PUT_SEARCH_TEXT_POSTGRES = (
    "INSERT INTO run_search (run_id, body, phase, vector) SELECT t.run_id, t.body, t.phase, "
    "to_tsvector('simple', t.body) FROM (VALUES (?, ?, ?)) AS t (run_id, body, phase) "
    "ON CONFLICT (run_id) DO UPDATE SET body = excluded.body, phase = excluded.phase, "
    "vector = excluded.vector"
)
NEXT_DUE = (
    "SELECT MIN(t) FROM ("
    "SELECT (SELECT not_before FROM runs WHERE status = 'waiting' AND not_before > ? "
    "ORDER BY not_before LIMIT 1) AS t UNION ALL "
    "SELECT (SELECT not_before FROM runs WHERE status = 'queued' AND not_before > ? "
    "ORDER BY not_before LIMIT 1) AS t UNION ALL "
    "SELECT (SELECT not_before FROM runs WHERE status = 'running' AND not_before > ? "
    "ORDER BY not_before LIMIT 1) AS t"
    ") AS due"
)


def run_from_row(row: Sequence[Any]) -> RunRecord:
    run_id = row[0]
    return RunRecord(
        id=run_id,
        agent=row[1],
        process=row[2],
        status=row[3],
        input=read_json(row[4], "runs", "input", id=run_id),
        output=read_json(row[5], "runs", "output", id=run_id),
        error=read_json(row[6], "runs", "error", id=run_id),
        idempotency_key=row[7],
        created_at=row[8],
        updated_at=row[9],
        lease_owner=row[10],
        lease_epoch=row[11],
        lease_expires_at=row[12],
        not_before=row[13],
        cancel_requested=bool(row[14]),
        waiting_for=read_json(row[15], "runs", "waiting_for", id=run_id),
        input_tokens=row[16],
        output_tokens=row[17],
        cost_nanousd=row[18],
        saved_nanousd=row[19],
        steps=row[20],
        code_version=row[21],
        lease_recoveries=row[22],
        invalidations=row[23],
        retries=row[24],
        forked_from=row[25],
        forked_at=row[26],
        blocked_error=read_json(row[27], "runs", "blocked_error", id=run_id),
        blocked_attempts=row[28],
        blocked_since=row[29],
        schedule_id=row[30],
        scheduled_for=row[31],
        concurrency_key=row[32],
        concurrency_limit=row[33],
        priority=row[34],
        tool_errors=row[35],
        paced=row[36],
    )


# What a claim reads of each run it leases, after its lease columns (``Lease.record`` and
# ``Lease.last_seq``): the run's row as the claim left it, whether its input came whole,
# and the seq of its last event (one probe of ``events_run_seq``). An input larger than
# CLAIMED_INPUT stays in the database (a claim of a hundred runs of 1 MB inputs would read
# 100 MB in one statement on the event loop): that run's tick reads its row itself.
# ``runs`` names the claimed row's table or alias.
CLAIMED_INPUT = 65_536


def claimed_columns(runs: str, dialect: str) -> str:
    """What a claim reads of each run it claims: the row (``runs`` names its table or
    alias; an input over CLAIMED_INPUT left out), the seq of its last event, the
    oldest message of its inbox (the table ``claimed_message`` of
    :func:`claimed_message_join`; left out over the same size), and the number of
    unconsumed messages in its inbox, counted up to 2."""
    names = [c.strip() for c in RUN_COLUMNS.split(",")]
    small = f"({runs}.input IS NULL OR {byte_size(f'{runs}.input', dialect)} <= {CLAIMED_INPUT})"
    columns = [
        f"CASE WHEN {small} THEN {runs}.input END" if c == "input" else f"{runs}.{c}" for c in names
    ]
    fits = f"{byte_size('claimed_message.payload', dialect)} <= {CLAIMED_INPUT}"
    return ", ".join(
        [
            *columns,
            small,
            f"(SELECT MAX(e.seq) FROM events e WHERE e.run_id = {runs}.id)",
            f"CASE WHEN {fits} THEN claimed_message.id END",
            "claimed_message.name",
            f"CASE WHEN {fits} THEN claimed_message.payload END",
            "claimed_message.created_at",
            "(SELECT COUNT(*) FROM (SELECT 1 FROM inbox u WHERE u.run_id = "
            f"{runs}.id AND u.consumed_seq IS NULL LIMIT 2) unread)",
        ]
    )


def claimed_message_join(runs: str) -> str:
    """The join that gives :func:`claimed_columns` the oldest unconsumed message of the
    run ``runs`` names, of any name (the tick takes it only for a wait of its name)."""
    return (
        "LEFT JOIN inbox claimed_message ON claimed_message.id = (SELECT i.id FROM inbox i "
        f"WHERE i.run_id = {runs}.id AND i.consumed_seq IS NULL ORDER BY i.id LIMIT 1)"
    )


_CLAIMED_MESSAGE = 5  # the message's columns and the unread count, after the row, its
# size check and last seq


def claimed_unread(run_id: str, last_seq: int | None) -> tuple[object, ...]:
    """What :func:`claimed_lease` takes for a run whose row and message the claim could
    not read: its id, the seq of its last event, and nothing else (the input not whole,
    no message, the unread count not known). The tick reads them itself."""
    return (run_id, 0, last_seq, *(None,) * _CLAIMED_MESSAGE)


def claimed_lease(
    worker_id: str, epoch: int, old_owner: str | None, status: str, read: Sequence[Any]
) -> Lease:
    """A claim's lease of a run, with what the claim read of it (``read``: the columns of
    :func:`claimed_columns`). A row that cannot be read, or whose input the claim left in
    the database, is left out (the tick reads it again, and meets an error there, where it
    holds up that run only, not the claim); so is a message that cannot be read, or whose
    payload the claim left in the database (the wait reads it itself)."""
    record: RunRecord | None = None
    run_id = read[0]
    whole, last = read[-_CLAIMED_MESSAGE - 2], read[-_CLAIMED_MESSAGE - 1]
    if whole:  # the input came whole
        try:
            record = run_from_row(read)
        except StorageError:
            pass
    message: InboxMessage | None = None
    message_id, name, payload, created_at, unread = read[-_CLAIMED_MESSAGE:]
    if message_id is not None:
        try:
            body = read_json(payload, "inbox", "payload", id=message_id, run_id=run_id)
            message = InboxMessage(int(message_id), run_id, name, body, created_at)
        except StorageError:
            pass
    return Lease(
        run_id,
        worker_id,
        epoch,
        old_owner is not None,
        status,
        record,
        None if last is None else int(last),
        message,
        None if unread is None else int(unread),
    )


# What a list reads: the columns of the covering index runs_list, then the columns added
# since (read from the table: one lookup by rowid per listed row on SQLite).
LISTED_COLUMNS = f"{LIST_COLUMNS}, tool_errors, paced"
_LISTED_NAMES = tuple(c.strip() for c in LISTED_COLUMNS.split(","))  # RunRecord fields
_LISTED = len(_LISTED_NAMES)  # the summary expressions follow these columns
_RUN_DEFAULTS = {
    f.name: f.default for f in dataclasses.fields(RunRecord) if f.default is not dataclasses.MISSING
}
assert set(_LISTED_NAMES) <= set(_RUN_DEFAULTS) | {"id", "agent", "process", "status"}
_CANCEL, _WAITING, _BLOCKED = (
    _LISTED_NAMES.index(c) for c in ("cancel_requested", "waiting_for", "blocked_error")
)


def summary_from_row(row: Sequence[Any]) -> RunRecord:
    """A row of ``LIST_COLUMNS`` and ``summary_expressions`` (see ``list_runs``).

    Built without the frozen dataclass ``__init__`` (a page of runs is 50 of these per
    poll of every console): the fields straight from the row's columns, the defaults of
    any field a list does not read, then the parsed JSON columns."""
    run_id = row[0]
    record = object.__new__(RunRecord)
    values = record.__dict__
    values.update(_RUN_DEFAULTS)
    values.update(zip(_LISTED_NAMES, row, strict=False))
    values["cancel_requested"] = bool(row[_CANCEL])
    if row[_WAITING] is not None:
        values["waiting_for"] = read_json(row[_WAITING], "runs", "waiting_for", id=run_id)
    if row[_BLOCKED] is not None:
        values["blocked_error"] = read_json(row[_BLOCKED], "runs", "blocked_error", id=run_id)
    summaries: dict[str, ValueSummary] | None = None
    at = _LISTED
    for name in ("input", "output", "error"):
        inline, size, preview = row[at], row[at + 1], row[at + 2]
        at += 3
        if preview is not None:
            if summaries is None:
                summaries = {}
            summaries[name] = ValueSummary(int(size), str(preview))
            values[name] = None
        else:
            values[name] = None if inline is None else read_json(inline, "runs", name, id=run_id)
    values["summaries"] = summaries
    return record


class ListedRows:
    """The records of the rows lists returned lately, by the rows' values: consoles poll
    the same page every few seconds, and an unchanged row maps to the same (immutable)
    record, which :mod:`toren.api.render` then finds already rendered. Bounded: at most
    ``size`` rows (a list row is at most ~14 KB of values); used from one thread."""

    def __init__(self, size: int = 512) -> None:
        self.size = size
        self._found: dict[tuple[object, ...], RunRecord] = {}

    def records(self, rows: Sequence[Sequence[object]]) -> list[RunRecord]:
        found = self._found
        out: list[RunRecord] = []
        for row in rows:
            key = tuple(row)
            try:
                record = found.get(key)
            except TypeError:  # a value that cannot be hashed: not remembered
                out.append(summary_from_row(row))
                continue
            if record is None:
                record = summary_from_row(row)
                if len(found) >= self.size:
                    del found[next(iter(found))]  # the oldest first
                found[key] = record
            out.append(record)
        return out


def event_from_row(row: Sequence[Any]) -> Event:
    seq, run_id, type_ = row[0], row[1], row[6]
    if not isinstance(row[12], str):
        raise CorruptEventLog(
            f"event seq={seq} of run {run_id!r} has no payload; the log cannot be replayed",
            run_id=run_id,
            seq=seq,
        )
    # Built without the frozen dataclass __init__, the envelope straight from the row's
    # columns (EVENT_COLUMNS order): a tick reads every event of its run.
    event = object.__new__(Event)
    values = event.__dict__
    values.update(zip(_ENVELOPE_COLUMNS, row, strict=False))  # the payload column left out
    values["payload"] = parse_payload(type_, row[12], run_id=run_id, seq=seq)
    # A row of the 0.1 column list (no ``chain``) reads as an event written before 0.2.
    values["chain"] = row[13] if len(row) > 13 else None
    return event


# A run's log after a seq, and a short log read inline, whole (SqlStore._log_rows).
LOG_ROWS = f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? AND seq > ? ORDER BY seq"
INLINE_LOG = 64
# A log known to hold more events than this (load_events' ``at_least``) is read the way a
# dialect reads a long log (SqlStore._long_log), without trying a head inline first.
LONG_LOG = 200
LOG_HEAD = f"{LOG_ROWS} LIMIT {INLINE_LOG + 1}"

_ENVELOPE_COLUMNS = tuple(c.strip() for c in EVENT_COLUMNS.split(","))[:12]
assert _ENVELOPE_COLUMNS[-1] == "format_version"  # the payload comes last, parsed apart


class SqlStore:
    """The Store protocol over a DB-API connection. Subclasses provide ``_run`` (execute a
    function in one transaction), ``_is_conflict`` and the dialect-specific statements."""

    url: str
    dialect: str = "sql"

    # -- dialect hooks ----------------------------------------------------------------

    async def _run(self, fn: Callable[[Cursor], T], *, write: bool = True) -> T:
        raise NotImplementedError

    async def _lease_write(self, fn: Callable[[Cursor], T]) -> T:
        """A write of lease bookkeeping alone (a claim, a renewal): rows of ``runs`` that
        a recovery rebuilds, never an event, an output or a total. A dialect may commit
        it without waiting for the disk (SQLite: see its module); here, any write."""
        return await self._run(fn)

    async def _replayable_write(self, fn: Callable[[Cursor], T]) -> T:
        """A write that records no effect, which the run's replay writes again if it is
        undone: a message's receipt alone (its ``MessageReceived`` and the inbox row it
        consumes: the run takes the same message again) or a park (the run, found
        running with its holder's lease run out, is taken over, replayed and parks
        again). A dialect may commit it without waiting for the disk (SQLite: see its
        module); here, any write."""
        return await self._run(fn)

    async def _read_small(self, fn: Callable[[Cursor], T]) -> T:
        """A short read by key (a run's row, its next message): one statement that finds at
        most one row. A dialect may run it inline on the loop's thread when nothing else
        is ready (see :class:`InlineGate`)."""
        return await self._run(fn, write=False)

    def _is_conflict(self, exc: BaseException) -> bool:
        raise NotImplementedError

    def _claim(
        self, cur: Cursor, worker_id: str, limit: int, now: float, ttl: float, only: str | None
    ) -> list[Lease]:
        raise NotImplementedError

    def _x(self, cur: Cursor, sql: str, params: Sequence[object] = ()) -> Cursor:
        cur.execute(sql, params)
        return cur

    async def notify(self) -> None:
        return None

    # -- runs -------------------------------------------------------------------------

    async def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        def tx(cur: Cursor) -> tuple[RunRecord, bool]:
            if run.idempotency_key is not None:
                row = self._x(
                    cur,
                    f"SELECT {RUN_COLUMNS} FROM runs WHERE idempotency_key = ?",
                    (run.idempotency_key,),
                ).fetchone()
                if row is not None:
                    existing = run_from_row(row)
                    same = (existing.agent, existing.process, existing.input) == (
                        run.agent,
                        run.process,
                        json.loads(dumps(run.input)),
                    )
                    if not same:
                        raise IdempotencyConflict(
                            f"idempotency key {run.idempotency_key!r} was already used for "
                            f"run {existing.id!r} with a different agent, process or input; "
                            "use a new key for a different run"
                        )
                    return existing, False
            self._insert_new_run(cur, run)
            if run.events or run.forked_from is not None:
                self._insert_events(cur, run.events)
                self._x(
                    cur,
                    "UPDATE runs SET forked_from = ?, forked_at = ? WHERE id = ?",
                    (run.forked_from, run.forked_at, run.id),
                )
            row = self._x(cur, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run.id,))
            return run_from_row(row.fetchone()), True

        try:
            result = await self._run(tx)
        except Exception as exc:
            if run.idempotency_key is not None and self._is_conflict(exc):
                # Two creators raced on one key: the loser returns the winner's run.
                return await self.create_run(run)
            raise
        if result[1]:
            await self.notify()
        return result

    def _insert_new_run(self, cur: Cursor, run: NewRun) -> None:
        """A new run's row and its ``RunStarted`` (no idempotency check: the caller's)."""
        if run.concurrency_key is not None and run.on_conflict != "enqueue":
            if self.dialect == "postgres":
                # Two starts of one key at once check one after the other (the claim of
                # the key's runs takes the same lock; SQLite has one writer anyway).
                self._x(
                    cur,
                    "SELECT pg_advisory_xact_lock(hashtextextended(?, 7031))",
                    (run.concurrency_key,),
                )
            unfinished = unfinished_of(self, cur, run.concurrency_key)
            if unfinished and run.on_conflict == "reject":
                raise ConcurrencyConflict(
                    f"run {unfinished[0]!r} of concurrency key {run.concurrency_key!r} is "
                    "not finished, and this agent refuses a second start meanwhile "
                    "(concurrency.on_conflict: reject); wait for it, or cancel it",
                    runs=unfinished,
                )
            for other in unfinished:  # cancel_previous: their slots free as they end
                self._cancel_in(cur, other, now=run.created_at)
        self._x(
            cur,
            "INSERT INTO runs (id, agent, process, status, input, idempotency_key, "
            "created_at, updated_at, schedule_id, scheduled_for, concurrency_key, "
            "concurrency_limit, priority) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *new_run_values(run),
                run.schedule_id,
                run.scheduled_for,
                run.concurrency_key,
                run.concurrency_limit,
                run.priority,
            ),
        )
        chain(None, [run.started_event, *run.events])  # a run's first links (digest.md §7)
        self._x(cur, INSERT_EVENT, event_params(run.started_event))

    @functools.cached_property
    def schedules(self) -> SqlSchedules:
        """The schedules' statements (toren.store.schedules)."""
        return SqlSchedules(self)

    async def queued_because(self, run: RunRecord) -> Queued | None:
        """Why a queued run of a concurrency key waits (None for any other run)."""
        if run.status != RunStatus.QUEUED or run.concurrency_key is None:
            return None
        key, limit = run.concurrency_key, run.concurrency_limit or 1
        return await self._run(
            lambda cur: queued_because(self, cur, run.id, key, limit), write=False
        )

    async def set_concurrency_limits(self, limits: Sequence[tuple[str, str, int | None]]) -> int:
        """A deploy's concurrency limits, applied to the runs still queued (toren.store.flow)."""
        changed = await self._run(lambda cur: set_limits(self, cur, limits))
        if changed:
            await self.notify()
        return changed

    # -- provider rate limits (toren.store.ratelimits) ----------------------------------

    async def take_rate_slot(
        self, key: str, limit: RateLimit, *, owner: str, tokens: int, now: float
    ) -> Grant:
        """A slot for one model call of ``key`` (see toren.core.contract.ratelimit). Its
        time is read inside the transaction (``now`` at the earliest): a slot records when
        the call goes out, not when it was asked for behind other writes."""
        return await self._run(
            lambda cur: ratelimits.take(self, cur, key, limit, owner, tokens, max(now, time.time()))
        )

    async def settle_rate_slot(
        self, key: str, grant_id: int, *, tokens: int, ok: bool, now: float
    ) -> None:
        """The call of slot ``grant_id`` was answered: its real tokens (``ok``: served)."""
        woke = await self._run(
            lambda cur: ratelimits.settle(
                self, cur, key, grant_id, tokens, ok, max(now, time.time())
            )
        )
        if woke:
            await self.notify()

    async def throttle_rate(
        self, key: str, grant_id: int | None, *, retry_after: float | None, now: float
    ) -> float:
        """A 429 on ``key``: the fleet waits; the block's end."""
        return await self._run(
            lambda cur: ratelimits.throttle(
                self, cur, key, grant_id, retry_after, max(now, time.time())
            )
        )

    async def declare_rate_limits(
        self, agents: Sequence[str], limits: Mapping[str, RateLimit], *, now: float
    ) -> int:
        """A starting worker's limits for ``agents``: a changed one re-paces its parked
        runs, a removed one releases them (toren.store.ratelimits.declare)."""
        woke = await self._run(lambda cur: ratelimits.declare(self, cur, agents, limits, now))
        if woke:
            await self.notify()
        return woke

    async def flow_view(self, *, now: float) -> FlowView:
        """Concurrency keys with unfinished runs and the rate limits, as they stand."""

        def tx(cur: Cursor) -> FlowView:
            keys = key_queues(self, cur)
            return FlowView(tuple(keys), tuple(ratelimits.views(self, cur, now)))

        return await self._run(tx, write=False)

    async def rate_limit_stats(self) -> list[tuple[str, int, int, float, int, int]]:
        """Per key: calls, paced calls, seconds waited, 429s, runs parked on it now."""
        return await self._run(lambda cur: ratelimits.stats(self, cur), write=False)

    async def get_run(self, run_id: str) -> RunRecord | None:
        def tx(cur: Cursor) -> RunRecord | None:
            row = self._x(cur, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
            found = row.fetchone()
            return run_from_row(found) if found else None

        return await self._read_small(tx)

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str | None = None,
        process: str | None = None,
        limit: int = 50,
        before: str | None = None,
        search: str | None = None,
        summary: bool = False,
        updated_after: float | None = None,
    ) -> list[RunRecord]:
        """Runs newest first. ``summary``: inputs, outputs and errors larger than
        ``schema.SUMMARY_INLINE`` come as a :class:`ValueSummary` instead (what a list
        shows; the memory and time of a page no longer grow with what runs carry).
        ``updated_after``: only runs whose row changed after that time."""
        where: list[str] = []
        params: list[object] = []
        for column, value in (("status", status), ("agent", agent), ("process", process)):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if search is not None:
            terms = search_query.parse(search)
            if not terms:
                return []  # no letter or digit: nothing to find
            where.append(self._search_clause())
            params.append(self._search_param(terms))
        if before is not None:
            where.append("id < ?")
            params.append(before)
        if updated_after is not None:
            where.append("updated_at > ?")
            params.append(updated_after)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        if summary:
            columns = f"{LISTED_COLUMNS}, {', '.join(summary_expressions(self.dialect))}"
            source = "runs INDEXED BY runs_list" if self.dialect == "sqlite" else "runs"
        else:
            columns, source = RUN_COLUMNS, "runs"
        sql = f"SELECT {columns} FROM {source} {clause} ORDER BY id DESC LIMIT ?"
        # PostgreSQL: a search runs in a transaction of its own whose plan settings make
        # it read the text index (SEARCH_PLAN).
        settings = SEARCH_PLAN if search is not None and self.dialect != "sqlite" else ()
        if settings and summary:
            # The page's ids first, its columns after: PostgreSQL sorts a search's matches
            # (hundreds or thousands) and would compute each one's summary (a slice of
            # its input, out of line) before the sort; computed for the page's rows only.
            sql = (
                f"SELECT {columns} FROM runs WHERE id IN "
                f"(SELECT id FROM runs {clause} ORDER BY id DESC LIMIT ?) ORDER BY id DESC"
            )

        filters = (status, agent, process, updated_after)
        # A search and nothing else (but the cursor): the page's ids come from the text
        # index's own table, newest first, without joining every match to ``runs`` (a
        # prefix can match thousands; the join cost the most of such a search).
        alone = bool(settings) and summary and not any(f is not None for f in filters)
        cursor = "AND run_id < ? " if before is not None else ""
        page_ids = (
            f"SELECT run_id FROM run_search WHERE {_PG_SEARCH_MATCH} {cursor}"
            "ORDER BY run_id DESC LIMIT ?"
        )

        def fetch(cur: Cursor) -> list[Any]:
            for statement in settings:
                self._x(cur, statement)
            if alone:
                ids = [r[0] for r in self._x(cur, page_ids, (*params, limit)).fetchall()]
                rows = self._x(
                    cur, f"SELECT {columns} FROM runs WHERE id = ANY(?) ORDER BY id DESC", (ids,)
                ).fetchall()
                if len(rows) == len(ids):
                    return list(rows)
                # A search text whose run is gone (deleted by hand: a prune removes both
                # together) would shorten the page: the join, which skips it, decides.
            return list(self._x(cur, sql, (*params, limit)).fetchall())

        found = await self._run(fetch, write=bool(settings))
        if summary:
            # Mapped here, on the loop's thread, where the memo of listed rows lives.
            return self._listed.records(found)
        return [run_from_row(r) for r in found]

    def _search_clause(self) -> str:
        """Runs whose search text (``run_search``, filled by the indexer) matches: through
        the database's own text index, never a scan of what runs store."""
        if self.dialect == "sqlite":
            return (
                "id IN (SELECT s.run_id FROM run_search_fts f JOIN run_search s "
                "ON s.rowid = f.rowid WHERE run_search_fts MATCH ?)"
            )
        return f"id IN (SELECT run_id FROM run_search WHERE {_PG_SEARCH_MATCH})"

    def _search_param(self, terms: list[search_query.Term]) -> str:
        if self.dialect == "sqlite":
            return search_query.fts5_match(terms)
        return search_query.tsquery(terms)

    async def search_backlog(self, *, since: float, limit: int) -> SearchBacklog:
        """Runs changed at or after ``since`` whose search text is missing or was built
        in another phase of the run (``schema``: run_search), oldest change first (at
        most ``limit``), and the latest ``updated_at`` of any run (where the indexer may
        move ``since`` to)."""

        def tx(cur: Cursor) -> SearchBacklog:
            backlog = SEARCH_BACKLOG_SQLITE if self.dialect == "sqlite" else SEARCH_BACKLOG_POSTGRES
            rows = self._x(cur, backlog, (since, limit)).fetchall()
            high = self._x(cur, "SELECT MAX(updated_at) FROM runs").fetchone()[0]
            return SearchBacklog(
                [SearchSource(r[0], float(r[1]), r[2], r[3], r[4], r[5], r[6]) for r in rows],
                float(high) if high is not None else None,
            )

        return await self._run(tx, write=False)

    async def put_search_texts(self, texts: Sequence[tuple[str, str, str]]) -> None:
        """Store ``(run_id, phase, body)`` search texts, replacing older ones."""
        if not texts:
            return

        def tx(cur: Cursor) -> None:
            for run_id, phase, body in texts:
                self._put_search_text(cur, run_id, phase, body)

        await self._run(tx)

    def _put_search_text(self, cur: Cursor, run_id: str, phase: str, body: str) -> None:
        if self.dialect != "sqlite":
            self._x(cur, PUT_SEARCH_TEXT_POSTGRES, (run_id, body, phase))
            return
        # FTS5 over an external content table: the old text leaves the index by the
        # 'delete' command with exactly the values it was indexed with.
        old = self._x(
            cur, "SELECT rowid, body FROM run_search WHERE run_id = ?", (run_id,)
        ).fetchone()
        if old is not None:
            self._x(
                cur,
                "INSERT INTO run_search_fts (run_search_fts, rowid, body) VALUES ('delete', ?, ?)",
                (old[0], old[1]),
            )
        rowid = self._x(
            cur, f"{PUT_SEARCH_TEXT} RETURNING rowid", (run_id, body, phase)
        ).fetchone()[0]
        self._x(cur, "INSERT INTO run_search_fts (rowid, body) VALUES (?, ?)", (rowid, body))

    async def next_due(self, *, now: float) -> float | None:
        """The earliest ``not_before`` later than ``now`` (a parked timer, a backoff), or
        None: when an idle worker should look for work again at the latest."""

        def tx(cur: Cursor) -> float | None:
            row = self._x(cur, NEXT_DUE, (now, now, now)).fetchone()
            return None if row is None or row[0] is None else float(row[0])

        return await self._run(tx, write=False)

    @functools.cached_property
    def _listed(self) -> ListedRows:
        return ListedRows()

    async def queue_depth(self, *, now: float) -> int:
        """Runs runnable now that no live worker holds: what autoscaling scales on."""

        def tx(cur: Cursor) -> int:
            row = self._x(
                cur, f"SELECT COUNT(id) FROM runs WHERE {CLAIMABLE}", (now, now, now)
            ).fetchone()
            return int(row[0])

        return await self._run(tx, write=False)

    async def stats(self) -> dict[str, object]:
        def tx(cur: Cursor) -> dict[str, object]:
            by_status = dict(
                self._x(cur, "SELECT status, COUNT(id) FROM runs GROUP BY status").fetchall()
            )
            totals = self._x(
                cur,
                "SELECT COALESCE(SUM(steps), 0), COALESCE(SUM(input_tokens), 0), "
                "COALESCE(SUM(output_tokens), 0), COALESCE(SUM(cost_nanousd), 0), "
                "COALESCE(SUM(saved_nanousd), 0), COALESCE(SUM(lease_recoveries), 0), "
                "COALESCE(SUM(invalidations), 0) FROM runs",
            ).fetchone()
            keys = (
                "steps",
                "input_tokens",
                "output_tokens",
                "cost_nanousd",
                "saved_nanousd",
                "lease_recoveries",
                "invalidations",
            )
            sums = {k: int(v) for k, v in zip(keys, totals, strict=True)}
            limits = ratelimits.stats(self, cur)
            return {"runs_by_status": by_status, **sums, "rate_limits": limits}

        return await self._run(tx, write=False)

    # -- events -----------------------------------------------------------------------

    async def load_events(
        self, run_id: str, *, after_seq: int = 0, limit: int | None = None, at_least: int = 0
    ) -> list[Event]:
        """The run's events after ``after_seq`` (at most ``limit``), in seq order.
        ``at_least``: how many events the caller knows the log holds at least (a tick and
        a plan pass the run's recorded steps, each one event or more), which only picks
        how a long log is read, never what is read."""
        rows = await self._log_rows(run_id, after_seq, limit, at_least)
        # Parsing builds only acyclic objects: pausing the cycle collector for this loop
        # (synchronous, so nothing else runs meanwhile) saves it re-scanning a growing
        # heap many times over while a long log loads.
        paused = gc.isenabled()
        gc.disable()
        try:
            return [event_from_row(r) for r in rows]
        finally:
            if paused:
                gc.enable()

    async def payload_texts(self, run_id: str) -> dict[int, str]:
        """Each event's payload exactly as stored, by seq: what its chain hashes
        (``toren runs verify``; a tick reads parsed events only)."""
        rows = await self._event_rows(
            "SELECT seq, payload FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
        )
        return {int(seq): text for seq, text in rows if isinstance(text, str)}

    async def _log_rows(
        self, run_id: str, after_seq: int, limit: int | None, at_least: int = 0
    ) -> list[Any]:
        """The rows of ``load_events``, in seq order, from one snapshot. A log of at most
        ``INLINE_LOG`` events is read inline on the event loop's thread when the dialect
        can (:meth:`_log_head_inline`): a woken run's log is often that short, and going
        through the loop costs more than the read. A longer log is read again, whole,
        the loop's way (:meth:`_log_tail`), where a read of any size may take its time:
        its first rows and the rest from a second read would be two snapshots, and the
        run's retention (``delete_finished``) between them would leave the log cut short
        with nothing to say so. A log known to be long (``at_least`` past ``LONG_LOG``)
        goes straight to :meth:`_long_log`."""
        if limit is not None:
            return await self._event_rows(f"{LOG_ROWS} LIMIT ?", (run_id, after_seq, limit))
        if at_least > LONG_LOG:
            return await self._long_log(run_id, after_seq)
        head = self._log_head_inline(run_id, after_seq)
        if head is not None and len(head) <= INLINE_LOG:
            return head
        return await self._log_tail(run_id, after_seq)

    def _log_head_inline(self, run_id: str, after_seq: int) -> list[Any] | None:
        """At most ``INLINE_LOG + 1`` rows of the log (``LOG_HEAD``) read inline, or None
        when they cannot be read inline now (a dialect hook)."""
        return None

    async def _log_tail(self, run_id: str, after_seq: int) -> list[Any]:
        """The whole log after ``after_seq``, read the loop's way."""
        return await self._event_rows(LOG_ROWS, (run_id, after_seq))

    async def _long_log(self, run_id: str, after_seq: int) -> list[Any]:
        """The whole log after ``after_seq``, known to be long (a dialect hook): by
        default as any log, :meth:`_log_tail`."""
        return await self._log_tail(run_id, after_seq)

    async def _event_rows(self, sql: str, params: Sequence[object]) -> list[Any]:
        def tx(cur: Cursor) -> list[object]:
            return list(self._x(cur, sql, params).fetchall())

        return await self._run(tx, write=False)

    async def get_blobs(self, hashes: Sequence[str]) -> dict[str, object]:
        if not hashes:
            return {}
        marks = ", ".join("?" for _ in hashes)

        def tx(cur: Cursor) -> dict[str, object]:
            rows = self._x(
                cur,
                f"SELECT hash, body FROM blobs WHERE hash IN ({marks})",
                tuple(hashes),
            ).fetchall()
            # A message body belongs to the event log that references it.
            return {h: read_json(b, "blobs", "body", CorruptEventLog, hash=h) for h, b in rows}

        return await self._run(tx, write=False)

    # Appended to the lease check when no totals are written: PostgreSQL takes a row share
    # lock so a concurrent claim waits for this transaction (SQLite's BEGIN IMMEDIATE
    # already serialises writers).
    lease_check_lock = ""
    # Appended to send_message's look at the run: PostgreSQL locks the row, so a run being
    # parked at the same moment either sees the new message (its release waits for this
    # transaction) or is seen 'waiting' and woken. SQLite's writers are already serial.
    run_row_lock = ""

    def _fence(self, cur: Cursor, lease: Lease, now: float, delta: RunDelta | None) -> None:
        """Check (and with ``delta``, update) the run row under the lease's fencing token:
        a worker whose lease was taken over can never write again."""
        if delta is None:
            row = self._x(
                cur,
                f"SELECT lease_owner, lease_epoch FROM runs WHERE id = ?{self.lease_check_lock}",
                (lease.run_id,),
            ).fetchone()
            if row is None or row[0] != lease.worker_id or row[1] != lease.epoch:
                raise lease_lost(lease)
            return
        cur = self._x(
            cur,
            f"UPDATE runs SET {TOTALS} WHERE id = ? AND lease_owner = ? AND lease_epoch = ?",
            (*totals_values(delta, now), lease.run_id, lease.worker_id, lease.epoch),
        )
        if cur.rowcount != 1:
            raise lease_lost(lease)

    def _insert_events(
        self, cur: Cursor, events: Sequence[Event], fence: Lease | None = None
    ) -> list[Event]:
        """Insert ``events``. With ``fence``, the first insert is also the lease check (one
        statement fewer per step): it inserts nothing unless the lease still holds."""
        out = []
        for event in events:
            if fence is None:
                seq = self._insert_event(cur, INSERT_EVENT, event_params(event))
            else:
                params = (*event_params(event), fence.run_id, fence.worker_id, fence.epoch)
                seq = self._insert_event(cur, self._insert_event_fenced, params)
                if seq is None:
                    raise lease_lost(fence)
                fence = None
            assert seq is not None
            out.append(with_seq(event, seq))
        return out

    def _insert_event(self, cur: Cursor, sql: str, params: Sequence[object]) -> int | None:
        """Run one of the event inserts above: the new event's seq, or None if it inserted
        nothing (the lease no longer holds)."""
        row = self._x(cur, sql + " RETURNING seq", params).fetchone()
        return None if row is None else int(row[0])

    @functools.cached_property
    def _insert_event_fenced(self) -> str:
        return INSERT_EVENT_FENCED.format(lock=self.lease_check_lock)

    async def append(
        self,
        lease: Lease,
        events: Sequence[Event],
        *,
        blobs: Mapping[str, str] | None = None,
        delta: RunDelta | None = None,
        consume_inbox: int | None = None,
        now: float,
    ) -> list[Event]:
        """Raises ``LeaseLost`` when the lease fence fails (checked first, so a write whose
        lease moved says so even if its message is gone too), ``MessageConsumed`` when the
        lease holds but ``consume_inbox`` is no longer an unconsumed message of the run;
        either way nothing is written."""
        delta = with_tool_errors(events, delta)

        def tx(cur: Cursor) -> list[Event]:
            fenced = delta is None and bool(events)
            if not fenced:
                self._fence(cur, lease, now, delta)
            if blobs:
                self._x(cur, insert_blobs_sql(len(blobs)), blob_params(lease.run_id, blobs))
            stored = self._insert_events(cur, events, lease if fenced else None)
            if consume_inbox is not None:
                cur = self._x(
                    cur,
                    "UPDATE inbox SET consumed_seq = ? "
                    "WHERE id = ? AND run_id = ? AND consumed_seq IS NULL",
                    (stored[-1].seq, consume_inbox, lease.run_id),
                )
                if cur.rowcount != 1:
                    raise MessageConsumed(
                        f"message {consume_inbox} is not an unconsumed message of run "
                        f"{lease.run_id}: another writer consumed it, or it belongs to "
                        "another run",
                        message_id=consume_inbox,
                    )
            return stored

        receipt = consume_inbox is not None and all(e.type == "MessageReceived" for e in events)
        try:
            return await (self._replayable_write if receipt else self._run)(tx)
        except Exception as exc:
            if self._is_conflict(exc):
                raise step_conflict(lease) from None
            raise

    # -- leases -----------------------------------------------------------------------

    async def claim(
        self, worker_id: str, limit: int, *, now: float, ttl: float, only: str | None = None
    ) -> list[Lease]:
        """Lease up to ``limit`` runnable runs (or just run ``only``) to ``worker_id``."""
        if limit <= 0:
            return []
        return await self._lease_write(
            lambda cur: self._claim(cur, worker_id, limit, now, ttl, only)
        )

    async def renew(
        self, worker_id: str, run_ids: Sequence[str], *, expires_at: float
    ) -> tuple[set[str], set[str]]:
        """Extend this worker's leases. Returns (runs still held, runs asked to cancel).
        An expiry is never moved earlier: the renewal names runs by owner, not by lease,
        so one delayed past this worker's release and new claim of a run would otherwise
        cut the new lease short of the deadline its tick counts from the claim."""
        if not run_ids:
            return set(), set()
        marks = ", ".join("?" for _ in run_ids)

        def tx(cur: Cursor) -> tuple[set[str], set[str]]:
            self._x(
                cur,
                "UPDATE runs SET lease_expires_at = CASE WHEN lease_expires_at IS NULL "
                "OR lease_expires_at < ? THEN ? ELSE lease_expires_at END "
                f"WHERE lease_owner = ? AND id IN ({marks})",
                (expires_at, expires_at, worker_id, *run_ids),
            )
            rows = self._x(
                cur,
                f"SELECT id, cancel_requested FROM runs WHERE lease_owner = ? AND id IN ({marks})",
                (worker_id, *run_ids),
            ).fetchall()
            return {r[0] for r in rows}, {r[0] for r in rows if r[1]}

        return await self._lease_write(tx)

    async def renew_lease(self, lease: Lease, *, expires_at: float) -> bool:
        """Extend one lease if it is still this one: same owner, same epoch (a fencing
        token, so a worker that stalled and whose run was claimed, even by itself again,
        cannot renew the old claim). One statement; False when the lease is gone."""

        def tx(cur: Cursor) -> bool:
            cur = self._x(
                cur,
                "UPDATE runs SET lease_expires_at = ? "
                "WHERE id = ? AND lease_owner = ? AND lease_epoch = ?",
                (expires_at, lease.run_id, lease.worker_id, lease.epoch),
            )
            return int(cur.rowcount) == 1

        return await self._lease_write(tx)

    async def expire_leases(self, worker_id: str, *, now: float) -> int:
        """Make every lease held by ``worker_id`` claimable now. A worker restarting under
        a stable id calls this: its previous process is dead, so its runs need not wait
        for the lease to run out."""

        def tx(cur: Cursor) -> int:
            cur = self._x(
                cur,
                "UPDATE runs SET lease_expires_at = ? WHERE lease_owner = ?",
                (now - 1.0, worker_id),
            )
            return int(cur.rowcount)

        count = await self._run(tx)
        if count:
            await self.notify()
        return count

    async def release(self, lease: Lease, release: Release, *, now: float) -> list[Event]:
        def tx(cur: Cursor) -> list[Event]:
            return self._release(cur, lease, release, now)

        park = release.status == RunStatus.WAITING
        try:
            stored = await (self._replayable_write if park else self._run)(tx)
        except Exception as exc:
            if self._is_conflict(exc):
                raise finished_elsewhere(lease) from None
            raise
        if release.status not in TERMINAL_STATUSES:
            # A finished run is nobody's work: waking every idle worker for it would only
            # make each run a claim query that finds nothing.
            await self.notify()
        return stored

    def _release(self, cur: Cursor, lease: Lease, release: Release, now: float) -> list[Event]:
        """The release's statements: the lease's fence with the totals, the events, the
        row; then, for a run parking on its inbox, a second look at the inbox in a
        statement of its own (on PostgreSQL a statement's snapshot is older than its wait
        for the row: see ``PostgresStore._park_on_inbox``)."""
        self._fence(cur, lease, now, release.delta)
        stored = self._insert_events(cur, release.events)
        self._x(
            cur,
            f"UPDATE runs SET status = ?, {release_not_before('?')}, "
            "waiting_for = ?, output = ?, error = ?, paced = ?, lease_owner = NULL, "
            f"lease_expires_at = NULL, {UNBLOCK}, updated_at = ? WHERE id = ?",
            (*release_values(release, now), now, lease.run_id),
        )
        if release.status == RunStatus.WAITING and release.waiting_for:
            # A message that arrived while the run was still leased found it 'running'
            # and could not wake it; look once more now that it is parked.
            marks = ", ".join("?" for _ in release.waiting_for)
            self._x(
                cur,
                "UPDATE runs SET not_before = ? WHERE id = ? AND EXISTS (SELECT 1 FROM "
                "inbox WHERE inbox.run_id = ? AND inbox.consumed_seq IS NULL AND "
                f"inbox.name IN ({marks}))",
                (now, lease.run_id, lease.run_id, *release.waiting_for),
            )
        return stored

    async def block(
        self, lease: Lease, error: dict[str, object], *, status: str, retry_at: float, now: float
    ) -> int:
        """Give a run back whose tick failed on an infrastructure error: ``status`` kept
        unfinished, claimable again at ``retry_at`` (at once when a cancel is pending),
        the error recorded and the failed ticks in a row counted. Returns that count."""

        def tx(cur: Cursor) -> int:
            cur = self._x(
                cur,
                "UPDATE runs SET status = ?, "
                "not_before = CASE WHEN cancel_requested <> 0 THEN ? ELSE ? END, "
                "lease_owner = NULL, lease_expires_at = NULL, waiting_for = NULL, "
                "blocked_error = ?, blocked_attempts = blocked_attempts + 1, "
                "blocked_since = COALESCE(blocked_since, ?), updated_at = ? "
                "WHERE id = ? AND lease_owner = ? AND lease_epoch = ?",
                (
                    status,
                    now,
                    retry_at,
                    dumps(error),
                    now,
                    now,
                    lease.run_id,
                    lease.worker_id,
                    lease.epoch,
                ),
            )
            if cur.rowcount != 1:
                raise lease_lost(lease)
            row = self._x(
                cur, "SELECT blocked_attempts FROM runs WHERE id = ?", (lease.run_id,)
            ).fetchone()
            return int(row[0])

        attempts = await self._run(tx)
        await self.notify()
        return attempts

    async def clear_blocked(self, lease: Lease, *, now: float) -> None:
        """The run made progress again: it is no longer blocked."""

        def tx(cur: Cursor) -> None:
            cur = self._x(
                cur,
                f"UPDATE runs SET {UNBLOCK}, updated_at = ? "
                "WHERE id = ? AND lease_owner = ? AND lease_epoch = ?",
                (now, lease.run_id, lease.worker_id, lease.epoch),
            )
            if cur.rowcount != 1:
                raise lease_lost(lease)

        await self._run(tx)

    # -- inbox and cancellation --------------------------------------------------------

    async def send_message(self, run_id: str, name: str, payload: object, *, now: float) -> int:
        def tx(cur: Cursor) -> int:
            row = self._x(
                cur, f"SELECT status FROM runs WHERE id = ?{self.run_row_lock}", (run_id,)
            ).fetchone()
            if row is None:
                raise RunNotFound(f"no run with id {run_id!r}")
            if row[0] in TERMINAL_STATUSES:
                raise RunNotFound(f"run {run_id!r} is {row[0]} and takes no more messages")
            msg_id = self._x(
                cur,
                "INSERT INTO inbox (run_id, name, payload, created_at) VALUES (?, ?, ?, ?) "
                "RETURNING id",
                (run_id, name, dumps(payload), now),
            ).fetchone()[0]
            # Wake a run parked on its inbox: it becomes claimable now.
            self._x(
                cur,
                "UPDATE runs SET not_before = ? WHERE id = ? AND status = 'waiting'",
                (now, run_id),
            )
            return int(msg_id)

        msg_id = await self._run(tx)
        await self.notify()
        return msg_id

    async def next_message(self, run_id: str, names: Sequence[str]) -> InboxMessage | None:
        marks = ", ".join("?" for _ in names)
        sql = (
            "SELECT id, run_id, name, payload, created_at FROM inbox WHERE run_id = ? "
            f"AND consumed_seq IS NULL AND name IN ({marks}) ORDER BY id LIMIT 1"
        )

        def tx(cur: Cursor) -> InboxMessage | None:
            row = self._x(cur, sql, (run_id, *names)).fetchone()
            if row is None:
                return None
            payload = read_json(row[3], "inbox", "payload", id=row[0], run_id=run_id)
            return InboxMessage(row[0], row[1], row[2], payload, row[4])

        return await self._read_small(tx)

    def _cancel_in(self, cur: Cursor, run_id: str, *, now: float) -> None:
        self._x(
            cur,
            "UPDATE runs SET cancel_requested = 1, updated_at = ?, "
            "not_before = CASE WHEN lease_owner IS NULL THEN ? ELSE not_before END "
            "WHERE id = ? AND status NOT IN ('completed', 'failed', 'cancelled')",
            (now, now, run_id),
        )

    async def request_cancel(self, run_id: str, *, now: float) -> RunRecord:
        def tx(cur: Cursor) -> RunRecord:
            self._cancel_in(cur, run_id, now=now)
            row = self._x(cur, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
            found = row.fetchone()
            if found is None:
                raise RunNotFound(f"no run with id {run_id!r}")
            return run_from_row(found)

        run = await self._run(tx)
        await self.notify()
        return run

    async def retry_run(self, run_id: str, event: Event, *, now: float) -> RunRecord:
        """Queue the failed run ``run_id`` again, appending ``event`` (its RunRetried), in
        one transaction: only a failed run nobody holds is retried; anything else (a
        concurrent retry got there first, say) is a :class:`RunNotRetryable`."""

        def tx(cur: Cursor) -> RunRecord:
            cur = self._x(
                cur,
                "UPDATE runs SET status = 'queued', error = NULL, output = NULL, "
                "waiting_for = NULL, not_before = ?, cancel_requested = 0, "
                "retries = retries + 1, updated_at = ? "
                "WHERE id = ? AND status = 'failed' AND lease_owner IS NULL",
                (now, now, run_id),
            )
            if cur.rowcount != 1:
                row = self._x(cur, "SELECT status FROM runs WHERE id = ?", (run_id,)).fetchone()
                if row is None:
                    raise RunNotFound(f"no run with id {run_id!r}")
                raise RunNotRetryable(
                    f"run {run_id!r} is {row[0]}, not failed; only a failed run can be "
                    "retried (was it retried at the same moment?)",
                    run_id=run_id,
                    status=row[0],
                )
            # Nobody holds the run (checked above, under the row's lock): the log's last
            # event is the one this follows (docs/event-log.md#the-chain).
            last = self._x(
                cur,
                "SELECT chain FROM events WHERE run_id = ? ORDER BY seq DESC LIMIT 1",
                (run_id,),
            ).fetchone()
            chain(None if last is None else last[0], [event])
            self._insert_events(cur, [event])
            found = self._x(cur, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
            return run_from_row(found.fetchone())

        try:
            run = await self._run(tx)
        except Exception as exc:
            if self._is_conflict(exc):
                raise RunNotRetryable(
                    f"run {run_id!r} was retried by someone else at the same moment",
                    run_id=run_id,
                ) from None
            raise
        await self.notify()
        return run

    # -- workers ----------------------------------------------------------------------

    async def register_worker(self, info: WorkerInfo) -> None:
        def tx(cur: Cursor) -> None:
            self._x(
                cur,
                # A worker restarting under a stable id starts a new life: new version,
                # new start time (the storm guard compares start times).
                "INSERT INTO workers (id, code_version, started_at, heartbeat_at, draining, "
                "hostname, pid) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
                "code_version = excluded.code_version, started_at = excluded.started_at, "
                "heartbeat_at = excluded.heartbeat_at, draining = excluded.draining, "
                "hostname = excluded.hostname, pid = excluded.pid",
                (
                    info.id,
                    info.code_version,
                    info.started_at,
                    info.heartbeat_at,
                    int(info.draining),
                    info.hostname,
                    info.pid,
                ),
            )

        await self._run(tx)

    async def heartbeat_worker(self, worker_id: str, *, now: float, draining: bool) -> None:
        await self._run(
            lambda cur: self._x(
                cur,
                "UPDATE workers SET heartbeat_at = ?, draining = ? WHERE id = ?",
                (now, int(draining), worker_id),
            )
        )

    async def live_workers(self, *, now: float, ttl: float) -> list[WorkerInfo]:
        def tx(cur: Cursor) -> list[WorkerInfo]:
            rows = self._x(
                cur,
                "SELECT id, code_version, started_at, heartbeat_at, draining, hostname, pid "
                "FROM workers WHERE heartbeat_at >= ? ORDER BY started_at",
                (now - ttl,),
            ).fetchall()
            return [WorkerInfo(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6]) for r in rows]

        return await self._run(tx, write=False)

    async def lease_holders(self, *, now: float) -> list[WorkerInfo]:
        """The registered workers holding an unexpired lease on some run (what a worker
        looks at to take over the runs of one that is gone: toren.core.drivers.takeover)."""

        def tx(cur: Cursor) -> list[WorkerInfo]:
            rows = self._x(
                cur,
                "SELECT id, code_version, started_at, heartbeat_at, draining, hostname, pid "
                "FROM workers WHERE id IN (SELECT lease_owner FROM runs WHERE status IN "
                "('queued', 'running', 'waiting') AND lease_owner IS NOT NULL "
                "AND lease_expires_at >= ?)",
                (now,),
            ).fetchall()
            return [WorkerInfo(r[0], r[1], r[2], r[3], bool(r[4]), r[5], r[6]) for r in rows]

        return await self._run(tx, write=False)


UNBLOCK = "blocked_error = NULL, blocked_attempts = 0, blocked_since = NULL"

# The run row's totals, added to under the lease (``?`` placeholders; the values are
# :func:`totals_values`'s): the row is a cache of the log, updated at most once a second.
TOTALS = (
    "updated_at = ?, input_tokens = input_tokens + ?, output_tokens = output_tokens + ?, "
    "cost_nanousd = cost_nanousd + ?, saved_nanousd = saved_nanousd + ?, steps = steps + ?, "
    "invalidations = invalidations + ?, code_version = COALESCE(?, code_version), "
    "tool_errors = tool_errors + ?"
)


def totals_values(delta: RunDelta | None, now: float) -> tuple[object, ...]:
    """The values of :data:`TOTALS` (no delta: nothing added, the time updated)."""
    d = delta or RunDelta()
    return (
        now,
        d.input_tokens,
        d.output_tokens,
        d.cost_nanousd,
        d.saved_nanousd,
        d.steps,
        d.invalidations,
        d.code_version,
        d.tool_errors,
    )


def release_not_before(p: str, wake: str = "") -> str:
    """A release's ``not_before``, with ``p`` the placeholder: the time a cancel requested
    while the run was leased makes it claimable (it must not be parked away: the next tick
    cancels it), ``wake`` (``WHEN ... THEN ...`` branches) any other reason to wake it now,
    else the release's own wake time. Its values are :func:`release_values`' second and
    third, with ``wake``'s between them."""
    return f"not_before = CASE WHEN cancel_requested <> 0 THEN {p} {wake}ELSE {p} END"


def release_values(release: Release, now: float) -> tuple[object, ...]:
    """The run row's (status, not_before if a cancel is pending, not_before otherwise,
    waiting_for, output, error, paced) after a release."""
    terminal = release.status in TERMINAL_STATUSES
    return (
        release.status,
        None if terminal else now,
        None if terminal else release.not_before,
        None if release.waiting_for is None else dumps(release.waiting_for),
        dumps(release.output) if terminal else None,
        None if release.error is None else dumps(release.error),
        None if terminal else release.paced,
    )


def settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Hand a write's outcome to its caller, unless it already has one (or gave up)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def loop_is_idle(loop: asyncio.AbstractEventLoop) -> bool:
    """Nothing else is ready to run in this turn of the loop, so no other write could join
    a group: a lone write may go at once. Reads CPython's ``_ready`` queue, where a handle
    cancelled after it was queued stays until the loop's next turn skips it (it runs
    nothing, so it keeps nobody waiting); a loop without the queue (uvloop) is never idle
    here, so its writes always take the group path."""
    ready = getattr(loop, "_ready", None)
    if ready is None:
        return False
    if not ready:
        return True
    try:
        return all(handle.cancelled() for handle in ready)
    except RuntimeError:
        # "deque mutated during iteration": another thread's call_soon_threadsafe (the
        # SQLite thread settling a job) added a handle while this looked: not idle. (A
        # copy of the queue is no cure: the copy allocates, the collector it may start
        # runs finalizers, and the thread can take its turn then.)
        return False


async def woken(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` (True) or ``timeout`` seconds (False), then clear it: how both
    dialects' ``wait_for_work`` sleep until work is signalled or the poll is due."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        event.clear()
        return False
    event.clear()
    return True


INLINE_FOR = 0.005  # s: the longest a store works inline without the loop taking a turn


class InlineGate:
    """When a store may do a statement inline, blocking the event loop's thread for it
    instead of waiting for it through the loop: only when nothing else is ready to run
    (no other write could join a group, no other task is kept waiting) and the loop has
    taken a turn within the last ``INLINE_FOR`` seconds. So a busy run commits inline for
    a few milliseconds, then takes the loop's way once: timers, sockets and other runs
    are never starved. The store calls :meth:`turned` whenever its work did go through
    the loop."""

    __slots__ = ("turn_at",)

    def __init__(self) -> None:
        self.turn_at = 0.0

    def open(self, loop: asyncio.AbstractEventLoop) -> bool:
        return loop_is_idle(loop) and time.monotonic() - self.turn_at < INLINE_FOR

    def turned(self) -> None:
        self.turn_at = time.monotonic()


def new_run_values(run: NewRun) -> tuple[object, ...]:
    """A new run row's (id, agent, process, input, idempotency_key, created_at,
    updated_at)."""
    return (
        run.id,
        run.agent,
        run.process,
        dumps(run.input),
        run.idempotency_key,
        run.created_at,
        run.created_at,
    )


def finished_elsewhere(lease: Lease) -> LeaseLost:
    """The error for a release whose run another worker finished first (its end slot is
    taken)."""
    return LeaseLost(f"run {lease.run_id!r} was finished by another worker")


def step_conflict(lease: Lease) -> LeaseLost:
    """The error for a step another worker recorded first (its slot is taken)."""
    return LeaseLost(
        f"another worker already recorded this step of run {lease.run_id!r}; "
        "this worker's copy is discarded"
    )


def lease_lost(lease: Lease) -> LeaseLost:
    """The error of a write whose lease fence failed (both dialects raise it)."""
    return LeaseLost(
        f"worker {lease.worker_id!r} no longer holds the lease on run {lease.run_id!r} "
        f"(epoch {lease.epoch}); another worker took it over"
    )


# The stored copy of an event is built around the frozen __init__: dataclasses.replace
# costs 4 µs more per event, 6% of a whole step's instructions (callgrind, SQLite). The one
# field it sets is checked here, at import, instead of by a constructor.
_SEQ = "seq"
assert _SEQ in {f.name for f in fields(Event)}


def with_tool_errors(events: Sequence[Event], delta: RunDelta | None) -> RunDelta | None:
    """``delta`` plus the failed tool calls among ``events``: counted on the run row in
    the transaction that writes them (a step with a tool error then writes the totals
    with it; other steps are untouched)."""
    failed = 0
    for event in events:
        if event.type == "ToolCallRecorded" and event.payload.error is not None:  # type: ignore[attr-defined]
            failed += 1
    if not failed:
        return delta
    base = delta or RunDelta()
    return dataclasses.replace(base, tool_errors=base.tool_errors + failed)


def with_seq(event: Event, seq: int) -> Event:
    """``event`` as stored: a copy carrying the sequence the database gave it."""
    copy = object.__new__(Event)
    values = copy.__dict__
    values.update(event.__dict__)
    values.pop("_payload_text", None)  # written: a journal keeps stored events
    values[_SEQ] = int(seq)
    return copy
