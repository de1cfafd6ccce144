"""PostgreSQL store (psycopg 3): the dialect's SQL and its semantics.

Every connection (the pools, the fast and inline lanes, LISTEN) and the group-commit
batcher live in :mod:`toren.store._pg_conn`; this module says what to run, not where. The
shared logic in :mod:`toren.store.sql` runs on a small thread pool over a pool of
autocommit connections; each unit of work is one explicit transaction. Claims use
``FOR UPDATE SKIP LOCKED`` so concurrent workers never block on each other's rows; the
schema is applied under an advisory lock so concurrent starts do not race; new runs and
messages ``NOTIFY toren_work`` so idle workers wake at once.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from toren.core.contract.audit import chain
from toren.core.contract.events import Event
from toren.core.contract.jsontext import dumps
from toren.core.contract.values import TERMINAL_STATUSES, RunStatus
from toren.errors import RunNotFound, SchemaError, StorageError
from toren.store._pg_conn import CHANNEL, Lanes, TurnBatcher
from toren.store.base import InboxMessage, Lease, NewRun, Release, RunDelta, RunRecord, read_json
from toren.store.flow import UNKEYED, claim_keyed
from toren.store.pruning import RetentionSql
from toren.store.schema import (
    SCHEMA,
    AddColumn,
    CreateTable,
    CreateVirtualTable,
    Migration,
    applies,
    render,
)
from toren.store.sql import (
    CLAIMABLE,
    EVENT_COLUMNS,
    LOG_ROWS,
    NEXT_DUE,
    RUN_COLUMNS,
    UNBLOCK,
    Cursor,
    claimed_columns,
    claimed_lease,
    claimed_message_join,
    event_params,
    finished_elsewhere,
    lease_lost,
    loop_is_idle,
    new_run_values,
    release_not_before,
    release_values,
    run_from_row,
    settle,
    step_conflict,
    totals_values,
    with_seq,
    with_tool_errors,
)

T = TypeVar("T")
log = logging.getLogger("toren.store")
_MIGRATION_LOCK = 0x746F72656E  # "toren": one advisory lock key for the schema list
_TOTALS = (
    "updated_at = %s::double precision, "
    "input_tokens = input_tokens + %s::bigint, output_tokens = output_tokens + %s::bigint, "
    "cost_nanousd = cost_nanousd + %s::bigint, saved_nanousd = saved_nanousd + %s::bigint, "
    "steps = steps + %s::bigint, invalidations = invalidations + %s::bigint, "
    "code_version = COALESCE(%s::text, code_version), "
    "tool_errors = tool_errors + %s::bigint "
)
_LEASED = "WHERE id = %s AND lease_owner = %s AND lease_epoch = %s"
# The ways a statement checks the lease: a share lock (a concurrent claim waits), the run
# row's totals update, the run row's release, or (a step that takes a message, with totals
# due) the run row locked as the totals update would lock it, the update itself waiting
# for the message (see _consume_sql).
FENCE_CHECK = f"SELECT id FROM runs {_LEASED} FOR SHARE"
FENCE_TOTALS = f"UPDATE runs SET {_TOTALS}{_LEASED} RETURNING id"
FENCE_LOCK = f"SELECT id FROM runs {_LEASED} FOR NO KEY UPDATE"
FENCE_RELEASE = (
    "UPDATE runs SET status = %s, "
    f"{release_not_before('%s::double precision')}, waiting_for = %s, "
    "output = %s, error = %s, paced = %s, lease_owner = NULL, lease_expires_at = NULL, "
    f"{UNBLOCK}, {_TOTALS}{_LEASED} RETURNING id"
)


# A message body another run stored first: counted as shared (see sql.INSERT_BLOBS).
SHARED = (
    "ON CONFLICT (hash) DO UPDATE SET shares = blobs.shares + 1 "
    "WHERE blobs.run_id IS NULL OR blobs.run_id <> excluded.run_id"
)


def _blobs_cte(n_blobs: int, gate: str) -> str:
    """``, b AS (INSERT INTO blobs ...)`` for ``n_blobs`` bodies, inserted only if the CTE
    named ``gate`` has a row (the fence, or the fenced message); empty without bodies."""
    if not n_blobs:
        return ""
    blob_rows = ", ".join("(%s, %s, %s::bigint, %s)" for _ in range(n_blobs))
    return (
        ", b AS (INSERT INTO blobs (hash, body, size, run_id) SELECT v.hash, v.body, v.size, "
        f"v.run_id FROM (VALUES {blob_rows}) AS v (hash, body, size, run_id) "
        f"WHERE EXISTS (SELECT 1 FROM {gate}) {SHARED})"
    )


def _insert_events(n_events: int, gate: str) -> str:
    """``INSERT INTO events ... RETURNING seq`` for ``n_events`` events, inserted only if
    the CTE named ``gate`` has a row."""
    event_rows = ", ".join(
        "(%s, %s, %s::bigint, %s::bigint, %s, %s, %s, %s, %s, %s::double precision, %s::bigint, "
        "%s, %s::text)"
        for _ in range(n_events)
    )
    return (
        "INSERT INTO events (run_id, stream, position, generation, slot, type, digest, "
        "code_version, worker_id, created_at, format_version, payload, chain) "
        "SELECT v.run_id, v.stream, v.position, v.generation, v.slot, v.type, v.digest, "
        "v.code_version, v.worker_id, v.created_at, v.format_version, v.payload, v.chain "
        f"FROM (VALUES {event_rows}) AS v (run_id, stream, position, generation, slot, "
        "type, digest, code_version, worker_id, created_at, format_version, payload, chain) "
        f"WHERE EXISTS (SELECT 1 FROM {gate}) RETURNING seq"
    )


@functools.lru_cache(maxsize=64)
def _append_sql(n_blobs: int, n_events: int, fence: str) -> str:
    """One statement: check the lease (``fence``), insert the blobs and the events only if
    it holds, return the new sequence numbers (in the order of the VALUES list, which is
    the order nextval assigns them), or with no events the fenced run's id."""
    blobs = _blobs_cte(n_blobs, "fence")
    if not n_events:
        return f"WITH fence AS ({fence}){blobs} SELECT id FROM fence"
    return f"WITH fence AS ({fence}){blobs} {_insert_events(n_events, 'fence')}"


@functools.lru_cache(maxsize=64)
def _consume_sql(n_blobs: int, n_events: int, totals: bool) -> str:
    """A step that takes a message from the inbox, in one statement: the lease check, the
    message row locked if it is still unconsumed, then (only if both hold) the run's
    totals when due, the blobs, the events and the message marked consumed by the last
    event. All or nothing: no rows back means nothing was written (the general path then
    says why).

    The totals are not the fence here, as in a plain append (FENCE_TOTALS): every part of
    a statement that writes runs to completion whether or not the others find rows, so an
    update in the fence would add a refused step's totals to the run row with no event in
    its log. Locks are taken in the order every writer takes them: the run row (FOR NO KEY
    UPDATE when the totals will update it, the lock that update takes, so it never has to
    upgrade a share lock), then the message row."""
    fence = FENCE_LOCK if totals else FENCE_CHECK
    update = (
        f", t AS (UPDATE runs SET {_TOTALS}WHERE id IN (SELECT id FROM fence) "
        "AND EXISTS (SELECT 1 FROM m) RETURNING id)"
        if totals
        else ""
    )
    return (
        f"WITH fence AS ({fence}), "
        "m AS (SELECT id FROM inbox WHERE id = %s::bigint AND run_id = %s "
        f"AND consumed_seq IS NULL AND EXISTS (SELECT 1 FROM fence) FOR UPDATE){update}"
        f"{_blobs_cte(n_blobs, 'm')}, "
        f"e AS ({_insert_events(n_events, 'm')}), "
        "u AS (UPDATE inbox SET consumed_seq = (SELECT max(seq) FROM e) "
        "WHERE id IN (SELECT id FROM m) RETURNING id) "
        "SELECT seq FROM e"
    )


def _present_schema(cur: Any) -> tuple[set[str], set[tuple[str, str]], set[str]]:
    """Tables, (table, column) pairs and indexes of the current schema (catalog reads)."""
    cur.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
    )
    tables = {r[0] for r in cur.fetchall()}
    cur.execute(
        "SELECT table_name, column_name FROM information_schema.columns "
        "WHERE table_schema = current_schema()"
    )
    columns = {(r[0], r[1]) for r in cur.fetchall()}
    cur.execute("SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()")
    indexes = {r[0] for r in cur.fetchall()}
    return tables, columns, indexes


def _is_present(
    migration: Migration, present: tuple[set[str], set[tuple[str, str]], set[str]]
) -> bool:
    tables, columns, indexes = present
    if isinstance(migration, CreateTable):
        return migration.table in tables
    if isinstance(migration, AddColumn):
        return (migration.table, migration.column.name) in columns
    if isinstance(migration, CreateVirtualTable):
        return migration.table in tables  # SQLite only: never applied here
    return migration.name in indexes


# Many runs' steps in one statement (group commit): one row per run in ``l`` (its lease,
# and its totals when due), then the blobs and events of every run whose lease holds.
# The run rows are locked in id order (``lk``), as ``renew`` locks them, and new blobs are
# inserted in hash order, as a single append inserts them: statements that take many locks
# in the same order cannot deadlock.
# Columns arrive as arrays, so the statement has one shape whatever the batch size (one
# server-side prepared statement), sent in binary (``%b``: text arrays of 2 KB payloads
# cost 7x more to escape); WITH ORDINALITY + ORDER BY keep each run's events in
# order, so its sequence numbers ascend as in a single-run append.
APPEND_MANY = (
    "WITH l AS (SELECT id, owner, epoch, totals, now, it, ot, cost, saved, steps, inv, cv, te "
    "FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::boolean[], "
    "%b::double precision[], %b::bigint[], %b::bigint[], %b::bigint[], %b::bigint[], "
    "%b::bigint[], %b::bigint[], %b::text[], %b::bigint[]) "
    "AS l (id, owner, epoch, totals, now, it, ot, cost, saved, steps, inv, cv, te)), "
    "lk AS (SELECT r.id FROM runs r JOIN l ON r.id = l.id AND r.lease_owner = l.owner "
    "AND r.lease_epoch = l.epoch ORDER BY r.id FOR NO KEY UPDATE OF r), "
    "upd AS (UPDATE runs r SET updated_at = l.now, input_tokens = r.input_tokens + l.it, "
    "output_tokens = r.output_tokens + l.ot, cost_nanousd = r.cost_nanousd + l.cost, "
    "saved_nanousd = r.saved_nanousd + l.saved, steps = r.steps + l.steps, "
    "invalidations = r.invalidations + l.inv, code_version = COALESCE(l.cv, r.code_version), "
    "tool_errors = r.tool_errors + l.te "
    "FROM l WHERE l.totals AND r.id = l.id AND r.id IN (SELECT id FROM lk)), "
    "fence AS (SELECT id FROM lk), "
    "b AS (INSERT INTO blobs (hash, body, size, run_id, shares) SELECT v.hash, min(v.body), "
    "min(v.size), min(v.run_id), count(DISTINCT v.run_id) - 1 "
    "FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[]) "
    "AS v (run_id, hash, body, size) WHERE v.run_id IN (SELECT id FROM fence) "
    "GROUP BY v.hash ORDER BY v.hash ON CONFLICT (hash) DO UPDATE SET shares = blobs.shares "
    "+ excluded.shares + CASE WHEN blobs.run_id IS NULL OR blobs.run_id <> excluded.run_id "
    "THEN 1 ELSE 0 END WHERE excluded.shares > 0 OR blobs.run_id IS NULL "
    "OR blobs.run_id <> excluded.run_id) "
    "INSERT INTO events (run_id, stream, position, generation, slot, type, digest, "
    "code_version, worker_id, created_at, format_version, payload, chain) "
    "SELECT v.run_id, v.stream, v.position, v.generation, v.slot, v.type, v.digest, "
    "v.code_version, v.worker_id, v.created_at, v.format_version, v.payload, v.chain "
    "FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::bigint[], %b::text[], %b::text[], "
    "%b::text[], %b::text[], %b::text[], %b::double precision[], %b::bigint[], %b::text[], "
    "%b::text[]) "
    "WITH ORDINALITY AS v (run_id, stream, position, generation, slot, type, digest, "
    "code_version, worker_id, created_at, format_version, payload, chain, ord) "
    "WHERE v.run_id IN (SELECT id FROM fence) ORDER BY v.ord RETURNING run_id, seq"
)


# A new run in one statement: the row, its RunStarted event and the wake-up signal for idle
# workers (delivered at commit). An existing id or idempotency key inserts nothing and
# returns no row: the general path then looks the existing run up.
CREATE_RUN = (
    "WITH r AS (INSERT INTO runs (id, agent, process, status, input, idempotency_key, "
    "created_at, updated_at) VALUES (%s, %s, %s, 'queued', %s, %s, %s::double precision, "
    f"%s::double precision) ON CONFLICT DO NOTHING RETURNING {RUN_COLUMNS}), "
    "e AS (INSERT INTO events (run_id, stream, position, generation, slot, type, digest, "
    "code_version, worker_id, created_at, format_version, payload, chain) "
    "SELECT %s, %s, %s::bigint, %s::bigint, %s, %s, %s, %s, %s, %s::double precision, "
    "%s::bigint, %s, %s WHERE EXISTS (SELECT 1 FROM r)) "
    f"SELECT {RUN_COLUMNS}, pg_notify('{CHANNEL}', '') FROM r"
)
RENEW = (
    "WITH lk AS (SELECT id FROM runs WHERE lease_owner = %s AND id = ANY(%b::text[]) "
    "ORDER BY id FOR NO KEY UPDATE) "
    "UPDATE runs r SET lease_expires_at = GREATEST(r.lease_expires_at, %s::double precision) "
    "FROM lk WHERE r.id = lk.id "
    "RETURNING r.id, r.cancel_requested"
)

RENEW_ONE = f"UPDATE runs SET lease_expires_at = %s::double precision {_LEASED} RETURNING id"

# Lease up to LIMIT runnable runs: one statement (autocommit is its transaction), so a
# claim is one round trip on the loop, with no thread hand-off: on the wake-up path of a
# parked run every hop counts. Concurrent claims skip each other's rows.
# Its commit waits for the WAL flush like every other: a claim lost in a database crash
# would let a second worker claim the run while the first, whose lease's local deadline
# still runs (core/drivers/fencing.py), starts a live step: a model call paid twice.
CLAIM = (
    "UPDATE runs SET lease_owner = ?, lease_epoch = runs.lease_epoch + 1, "
    "lease_expires_at = ?, "
    "status = 'running', "
    "lease_recoveries = runs.lease_recoveries + "
    "CASE WHEN c.lease_owner IS NULL THEN 0 ELSE 1 END "
    f"FROM (SELECT id, lease_owner, status FROM runs WHERE {CLAIMABLE} {UNKEYED}"
    "{only}ORDER BY COALESCE(not_before, created_at) LIMIT ? "
    f"FOR UPDATE SKIP LOCKED) c {claimed_message_join('c')} "
    "WHERE runs.id = c.id RETURNING runs.lease_epoch, c.lease_owner, c.status, "
    f"{claimed_columns('runs', 'postgres')}"
)
CLAIM_ANY = CLAIM.replace("{only}", "")
CLAIM_ONE = CLAIM.replace("{only}", "AND id = ? ")

# A message in one statement on the loop: lock the run row (a run being parked at this
# moment either sees the message in its release, which waits for this lock, or is seen
# 'waiting' here and woken), add the inbox row unless the run is finished, make a waiting
# run claimable now, and NOTIFY the workers with the run's id (delivered at commit; only
# when a run was woken). Returns the run's status (no row: no such run) and the message id.
SEND_MESSAGE = (
    "WITH r AS (SELECT id, status FROM runs WHERE id = %s FOR UPDATE), "
    "i AS (INSERT INTO inbox (run_id, name, payload, created_at) "
    "SELECT r.id, %s, %s, %s::double precision FROM r "
    "WHERE r.status NOT IN ('completed', 'failed', 'cancelled') RETURNING id), "
    "w AS (UPDATE runs SET not_before = %s::double precision FROM r "
    "WHERE runs.id = r.id AND r.status = 'waiting' AND EXISTS (SELECT 1 FROM i) "
    "RETURNING runs.id) "
    f"SELECT r.status, (SELECT id FROM i), (SELECT pg_notify('{CHANNEL}', w.id) FROM w) "
    "FROM r"
)


class _Append:
    """One run's step waiting to be committed with others (see ``PostgresStore.append``)."""

    __slots__ = ("blobs", "delta", "events", "future", "lease", "now")

    def __init__(
        self,
        lease: Lease,
        events: Sequence[Event],
        blobs: Mapping[str, str],
        delta: RunDelta | None,
        now: float,
        future: asyncio.Future[list[Event]],
    ) -> None:
        self.lease, self.events, self.blobs = lease, events, blobs
        self.delta, self.now, self.future = delta, now, future


class _LogRead:
    """One run's log waiting to be read with others (see ``PostgresStore._log_tail``)."""

    __slots__ = ("after_seq", "future", "run_id")

    def __init__(self, run_id: str, after_seq: int, future: asyncio.Future[list[Any]]) -> None:
        self.run_id, self.after_seq, self.future = run_id, after_seq, future


# The logs of many runs in one statement: each run's events after its own seq, in seq order
# per run (the caller splits the rows by run_id, the second column).
LOGS_MANY = (
    "SELECT {columns} FROM unnest(%s::text[], %s::bigint[]) AS r (run_id, after_seq) "
    "JOIN events e ON e.run_id = r.run_id AND e.seq > r.after_seq ORDER BY e.run_id, e.seq"
).format(columns=", ".join(f"e.{c.strip()}" for c in EVENT_COLUMNS.split(",")))


def _append_many_params(batch: Sequence[_Append]) -> list[object]:
    runs: list[list[object]] = [[] for _ in range(13)]
    blob_cols: list[list[object]] = [[], [], [], []]
    event_cols: list[list[object]] = [[] for _ in range(13)]
    for job in batch:
        lease, d = job.lease, job.delta
        totals = d or RunDelta()
        row: tuple[object, ...] = (
            lease.run_id,
            lease.worker_id,
            lease.epoch,
            d is not None,
            job.now,
            totals.input_tokens,
            totals.output_tokens,
            totals.cost_nanousd,
            totals.saved_nanousd,
            totals.steps,
            totals.invalidations,
            totals.code_version,
            totals.tool_errors,
        )
        for col, value in zip(runs, row, strict=True):
            col.append(value)
        # Every run's own copy: a blob two runs share must land if either's lease holds
        # (the statement keeps one per hash after the lease filter, its first writer the
        # lowest run id, and counts the others as shares).
        for key, body in job.blobs.items():
            blob: tuple[object, ...] = (lease.run_id, key, body, len(body))
            for col, value in zip(blob_cols, blob, strict=True):
                col.append(value)
        for event in job.events:
            for col, value in zip(event_cols, event_params(event), strict=True):
                col.append(value)
    return [*runs, *blob_cols, *event_cols]


def _append_statement(
    lease: Lease,
    events: Sequence[Event],
    blobs: Mapping[str, str],
    delta: RunDelta | None,
    now: float,
) -> tuple[str, list[object]]:
    """One step's statement (lease check, blobs, events) and its parameters."""
    fence = FENCE_CHECK if delta is None else FENCE_TOTALS
    sql = _append_sql(len(blobs), len(events), fence)
    params: list[object] = [] if delta is None else list(totals_values(delta, now))
    params += (lease.run_id, lease.worker_id, lease.epoch)
    for key, body in sorted(blobs.items()):  # hash order, as the batch inserts them
        params += (key, body, len(body), lease.run_id)
    for event in events:
        params += event_params(event)
    return sql, params


def _appended(lease: Lease, events: Sequence[Event], rows: list[Any]) -> list[Event]:
    """The events as stored, from the seqs the statement returned (none: the lease was
    gone, so nothing was written)."""
    if len(rows) != len(events):
        raise lease_lost(lease)
    seqs = sorted(int(r[0]) for r in rows)
    return [with_seq(e, seq) for e, seq in zip(events, seqs, strict=True)]


def _claim_statement(
    worker_id: str, limit: int, now: float, ttl: float, only: str | None
) -> tuple[str, tuple[object, ...]]:
    if only is None:
        return CLAIM_ANY, (worker_id, now + ttl, now, now, now, limit)
    return CLAIM_ONE, (worker_id, now + ttl, now, now, now, only, limit)


class PostgresStore(RetentionSql):
    dialect = "postgres"
    # Workers pruning at once split the work instead of queueing on each other's rows;
    # the delete re-checks the same bounds regardless.
    prune_lock = " FOR UPDATE SKIP LOCKED"
    lease_check_lock = " FOR SHARE"
    run_row_lock = " FOR UPDATE"

    def __init__(self, url: str, *, pool_size: int = 16) -> None:
        self.url = url
        self.lanes = Lanes(url, pool_size=pool_size)
        self._psycopg = self.lanes.psycopg
        self._sql_cache: dict[str, str] = {}
        self._batcher: TurnBatcher[_Append] = TurnBatcher(
            self.lanes, self._append_inline, self._append_batch
        )
        self.batched_steps = 0  # steps committed in a statement shared with other runs
        self._log_reads: TurnBatcher[_LogRead] = TurnBatcher(
            self.lanes, lambda job: False, self._read_logs
        )
        self.batched_logs = 0  # logs read in a statement shared with other runs
        # Long logs being read on threads of the sync pool (_long_log), and how many may
        # be at once: each holds a thread and a connection that claims and transactions
        # need too, for as long as the transfer takes.
        self._long_reads = 0
        self._long_reads_max = max(1, pool_size // 8)

    @property
    def inline_statements(self) -> int:
        """Statements run on the inline lane."""
        return self.lanes.inline_statements

    @property
    def inline_deferred(self) -> collections.Counter[str]:
        """Statements that gave up a wait on the inline lane and took the loop, by reason."""
        return self.lanes.inline_deferred

    @property
    def notifications(self) -> int:
        """NOTIFYs received on the work channel (wait_for_work)."""
        return self.lanes.notifications

    @property
    def listening(self) -> bool:
        """The work channel's LISTEN is in place."""
        return self.lanes.listening

    def _q(self, sql: str) -> str:
        out = self._sql_cache.get(sql)
        if out is None:
            out = self._sql_cache[sql] = sql.replace("?", "%s")
        return out

    def _x(self, cur: Any, sql: str, params: object = ()) -> Any:
        cur.execute(self._q(sql), params)
        return cur

    async def _run(self, fn: Callable[[Any], T], *, write: bool = True) -> T:
        return await self.lanes.run(fn, write=write)

    async def _fetch_async(
        self, sql: str, params: Sequence[object], *, rows: bool = True, inline: bool = True
    ) -> list[Any]:
        return await self.lanes.fetch(self._q(sql), params, rows=rows, inline_ok=inline)

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
        """A step in one statement, hence one round trip and one autocommit transaction:
        the lease check (with the run's totals when due), the new blobs and the events,
        all or nothing. Consuming a message takes the generic path
        (:meth:`_append_in_transaction`).

        Group commit: the steps of many runs requested in the same turn of the event loop
        go to the database as one statement (one round trip, one WAL flush); a lone step,
        with nothing else ready to run, goes at once."""
        if consume_inbox is not None and events:
            stored = await self._consume_one(lease, events, blobs or {}, delta, consume_inbox, now)
            if stored is not None:
                return stored
        if consume_inbox is not None or not events:
            return await self._append_in_transaction(
                lease, events, blobs=blobs, delta=delta, consume_inbox=consume_inbox, now=now
            )
        # Counted here, not above: the generic path (SqlStore.append) counts its own.
        delta = with_tool_errors(events, delta)
        blobs = blobs or {}
        loop = asyncio.get_running_loop()
        if self._batcher.empty and loop_is_idle(loop):
            return await self._append_one(lease, events, blobs, delta, now)
        future: asyncio.Future[list[Event]] = loop.create_future()
        self._batcher.add(_Append(lease, events, blobs, delta, now, future))
        return await future

    async def _append_batch(self, batch: list[_Append]) -> None:
        """Commit a batch in one statement. If that statement fails (one run's step
        conflicts with another worker's copy, say), nothing of it was written: each step
        then goes alone, so each learns its own outcome. Every caller is answered, even if
        this task is cancelled."""
        try:
            if len(batch) > 1 and len({job.lease.run_id for job in batch}) == len(batch):
                try:
                    rows = await self._fetch_async(APPEND_MANY, _append_many_params(batch))
                except Exception as exc:
                    rows = None
                    if not self._is_conflict(exc):  # a conflict is expected; this is not
                        log.warning(
                            "batched append of %d steps failed (%s); each goes alone",
                            len(batch),
                            exc,
                        )
                if rows is not None:
                    self.batched_steps += len(batch)
                    seqs: dict[str, list[int]] = {}
                    for run_id, seq in rows:
                        seqs.setdefault(run_id, []).append(int(seq))
                    for job in batch:
                        got = sorted(seqs.get(job.lease.run_id, ()))
                        if len(got) != len(job.events):
                            settle(job.future, None, lease_lost(job.lease))
                        else:
                            stored = [with_seq(e, q) for e, q in zip(job.events, got, strict=True)]
                            settle(job.future, stored, None)
                    return
            # Alone: runs side by side, each run's steps one after another (in call order).
            by_run: dict[str, list[_Append]] = {}
            for job in batch:
                by_run.setdefault(job.lease.run_id, []).append(job)
            if len(by_run) == 1:  # no gather: it would leave a callback on the loop
                await self._append_in_order(batch)
            else:
                await asyncio.gather(*(self._append_in_order(jobs) for jobs in by_run.values()))
        finally:
            for job in batch:
                settle(job.future, None, StorageError("the batched append was interrupted"))

    async def _append_in_order(self, jobs: list[_Append]) -> None:
        for job in jobs:
            await self._append_alone(job)

    async def _append_alone(self, job: _Append) -> None:
        try:
            stored = await self._append_one(job.lease, job.events, job.blobs, job.delta, job.now)
        except Exception as exc:
            settle(job.future, None, exc)
        else:
            settle(job.future, stored, None)

    async def _append_one(
        self,
        lease: Lease,
        events: Sequence[Event],
        blobs: Mapping[str, str],
        delta: RunDelta | None,
        now: float,
    ) -> list[Event]:
        sql, params = _append_statement(lease, events, blobs, delta, now)
        try:
            rows = await self._fetch_async(sql, params)
        except Exception as exc:
            if self._is_conflict(exc):
                raise step_conflict(lease) from None
            raise
        return _appended(lease, events, rows)

    async def _consume_one(
        self,
        lease: Lease,
        events: Sequence[Event],
        blobs: Mapping[str, str],
        delta: RunDelta | None,
        message_id: int,
        now: float,
    ) -> list[Event] | None:
        """A step that takes a message, in one statement on the loop (see _consume_sql):
        the stored events, or None when it wrote nothing (the lease or the message is
        gone: the general path then raises the precise error, ``LeaseLost`` if the lease
        fence fails, checked first, else ``MessageConsumed``)."""
        sql = _consume_sql(len(blobs), len(events), delta is not None)
        params: list[object] = [
            lease.run_id,
            lease.worker_id,
            lease.epoch,
            message_id,
            lease.run_id,
        ]
        if delta is not None:
            params += totals_values(delta, now)
        for key, body in sorted(blobs.items()):  # hash order, as every writer inserts them
            params += (key, body, len(body), lease.run_id)
        for event in events:
            params += event_params(event)
        try:
            rows = await self._fetch_async(sql, params)
        except Exception as exc:
            if self._is_conflict(exc):
                raise step_conflict(lease) from None
            raise
        if len(rows) != len(events):
            return None
        seqs = sorted(int(r[0]) for r in rows)
        return [with_seq(e, seq) for e, seq in zip(events, seqs, strict=True)]

    def _append_inline(self, job: _Append) -> bool:
        """A lone step of a turn of the loop committed right here, on the inline lane, if
        the gate is open; False if it must go the loop's way. Answering it here, not from
        a task, leaves nothing behind on the loop, so the run's next step finds the loop
        idle and commits inline too."""
        try:
            sql, params = _append_statement(job.lease, job.events, job.blobs, job.delta, job.now)
            rows = self.lanes.try_inline(self._q(sql), params, turn=True)
            if rows is None:
                return False
            settle(job.future, _appended(job.lease, job.events, rows), None)
        except Exception as exc:  # answered as _append_one would raise it
            error: Exception = exc
            if self._is_conflict(exc):
                error = step_conflict(job.lease)
            elif isinstance(exc, self._psycopg.Error):
                error = StorageError(f"PostgreSQL error: {exc}")
                error.__cause__ = exc
            settle(job.future, None, error)
        except BaseException:  # interrupted: the caller must not wait forever
            settle(job.future, None, StorageError("the append was interrupted"))
            raise
        return True

    async def _append_in_transaction(
        self,
        lease: Lease,
        events: Sequence[Event],
        *,
        blobs: Mapping[str, str] | None,
        delta: RunDelta | None,
        consume_inbox: int | None,
        now: float,
    ) -> list[Event]:
        """Fallback to the generic path (``SqlStore.append``, one transaction of several
        statements) for the appends the one-statement CTE does not express: consuming an
        inbox message (its row must be taken in the same transaction, or the step fails)
        and an append without events."""
        return await super().append(
            lease, events, blobs=blobs, delta=delta, consume_inbox=consume_inbox, now=now
        )

    async def create_run(self, run: NewRun) -> tuple[RunRecord, bool]:
        """One round trip on the loop for a new run (row, RunStarted, NOTIFY); a fork, or
        a run that already exists (its id or idempotency key was used), takes the generic
        path (:meth:`_create_run_in_transaction`), and so does a run with a concurrency key
        or a schedule (their columns, and a start's conflict policy)."""
        if (
            run.events
            or run.forked_from is not None
            or run.concurrency_key is not None
            or run.schedule_id is not None
        ):
            return await self._create_run_in_transaction(run)
        chain(None, [run.started_event])
        params = (*new_run_values(run), *event_params(run.started_event))
        rows = await self._fetch_async(CREATE_RUN, params)
        if rows:
            return run_from_row(rows[0][:-1]), True
        return await self._create_run_in_transaction(run)

    async def _create_run_in_transaction(self, run: NewRun) -> tuple[RunRecord, bool]:
        """Fallback to the generic path (``SqlStore.create_run``) for what the one-statement
        CTE does not express: a fork (its copied events and lineage), a run of a concurrency
        key or a schedule, and a run whose id or idempotency key exists (returned as it
        is, or named as a conflict)."""
        return await super().create_run(run)

    async def renew(
        self, worker_id: str, run_ids: Sequence[str], *, expires_at: float
    ) -> tuple[set[str], set[str]]:
        """Extend this worker's leases in one statement on the loop, locking the rows in
        id order (as a batch of appends does, so the two cannot deadlock). A deadlock with
        a statement of another kind is retried: the heartbeat must not be lost."""
        if not run_ids:
            return set(), set()
        for attempt in range(3):
            try:
                rows = await self._fetch_async(RENEW, (worker_id, list(run_ids), expires_at))
                break
            except StorageError as exc:
                if attempt == 2 or not isinstance(
                    exc.__cause__, self._psycopg.errors.DeadlockDetected
                ):
                    raise
        return {r[0] for r in rows}, {r[0] for r in rows if r[1]}

    async def renew_lease(self, lease: Lease, *, expires_at: float) -> bool:
        """One lease, fenced by its epoch, in one statement on the loop (see
        ``SqlStore.renew_lease``)."""
        rows = await self._fetch_async(
            RENEW_ONE, (expires_at, lease.run_id, lease.worker_id, lease.epoch)
        )
        return bool(rows)

    async def release(self, lease: Lease, release: Release, *, now: float) -> list[Event]:
        """Give the run back in one statement (the common case). A run parking on its
        inbox needs a second one (:meth:`_park_on_inbox`)."""
        parks_on_inbox = release.status == RunStatus.WAITING and bool(release.waiting_for)
        sql, params = self._release_statement(lease, release, now)
        claimable = release.status not in TERMINAL_STATUSES  # a finished run is nobody's work
        if parks_on_inbox:
            rows, claimable = await self._park_on_inbox(lease, release, (sql, params), now)
        else:
            try:
                rows = await self._fetch_async(sql, params)
            except Exception as exc:
                if self._is_conflict(exc):
                    raise finished_elsewhere(lease) from None
                raise
        if len(rows) != max(1, len(release.events)):
            raise lease_lost(lease)
        if claimable:
            await self.notify()
        if not release.events:
            return []
        seqs = sorted(int(r[0]) for r in rows)
        return [with_seq(e, seq) for e, seq in zip(release.events, seqs, strict=True)]

    def _release_statement(
        self, lease: Lease, release: Release, now: float
    ) -> tuple[str, list[object]]:
        """The release as one statement: the row under the lease's fence, its totals and
        the events; a row per event (one if none), none if the fence failed."""
        params: list[object] = [
            *release_values(release, now),
            *totals_values(release.delta, now),
            lease.run_id,
            lease.worker_id,
            lease.epoch,
        ]
        for event in release.events:
            params += event_params(event)
        return _append_sql(0, len(release.events), FENCE_RELEASE), params

    async def _park_on_inbox(
        self,
        lease: Lease,
        release: Release,
        statement: tuple[str, list[object]],
        now: float,
    ) -> tuple[list[Any], bool]:
        """A run parking on its inbox must look at the inbox again after its row is
        locked: a message sent meanwhile found the run ``running`` and could not wake it
        (``send_message`` locks the row, then wakes only a ``waiting`` run). One
        statement cannot: its snapshot is taken before it waits for the row, so it misses
        a message whose sender held the row then. So the release is followed, in the same
        transaction, by a second statement with a snapshot of its own, taken once the
        first holds the row: it wakes the run if a message it waits for is there, and only
        if the row is still this release's (its epoch: a worker whose lease moved, whose
        release wrote nothing, must not move another holder's wake time either). Both go
        in one round trip: on the inline lane (:meth:`Lanes.try_inline_transaction`) when it is
        free, else the loop's way (:meth:`Lanes.transaction`), as one pipeline either way.
        (The generic transaction, ``SqlStore.release``, did the same in five round trips
        and a thread hand-off: a tenth of a busy worker's parks took it, whenever the
        inline gate had just closed, at about four times the CPU of the pipeline.)

        With the rows comes whether the run has a wake time now: the second statement
        woke it, or its row has one (a wait's timeout, or a cancel asked for while it
        ran). Only then are the workers told (NOTIFY): a run that waits for a message
        alone is nobody's work until the message comes, and its sender tells them."""
        names = list(release.waiting_for or ())
        wake = (
            "WITH w AS (UPDATE runs SET not_before = %s::double precision WHERE id = %s "
            "AND status = 'waiting' AND lease_owner IS NULL AND lease_epoch = %s "
            "AND EXISTS (SELECT 1 FROM inbox WHERE inbox.run_id = %s "
            "AND inbox.consumed_seq IS NULL AND inbox.name = ANY(%s)) RETURNING id) "
            # This statement's snapshot has the park's row, not the CTE's update.
            "SELECT EXISTS (SELECT 1 FROM w) OR EXISTS (SELECT 1 FROM runs "
            "WHERE id = %s AND not_before IS NOT NULL)"
        )
        params = (now, lease.run_id, lease.epoch, lease.run_id, names, lease.run_id)
        statements = [statement, (wake, params)]
        try:
            done = self.lanes.try_inline_transaction(statements)
            if done is None:
                done = await self.lanes.transaction(statements)
        except self._psycopg.errors.UniqueViolation:
            raise finished_elsewhere(lease) from None
        except self._psycopg.Error as exc:
            raise StorageError(f"PostgreSQL error: {exc}") from exc
        rows, woken = done
        row: Sequence[object] = woken[0]  # type: ignore[assignment]  # one row, one column
        return rows, bool(row[0])

    # The reads at the start of every tick, on the loop too: with a thousand runs in
    # flight, a thread hand-off per read is what bounds a worker.

    async def get_run(self, run_id: str) -> RunRecord | None:
        rows = await self._fetch_async(f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
        return run_from_row(rows[0]) if rows else None

    async def _log_tail(self, run_id: str, after_seq: int) -> list[Any]:
        """A run's log, read with the logs of the other runs whose ticks ask in the same
        turn of the event loop (one statement: a claim of a hundred due timers starts a
        hundred ticks at once, each reading its log first). A lone read, with nothing
        else ready to run, goes at once."""
        loop = asyncio.get_running_loop()
        if self._log_reads.empty and loop_is_idle(loop):
            return await super()._log_tail(run_id, after_seq)
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._log_reads.add(_LogRead(run_id, after_seq, future))
        return await future

    async def _read_logs(self, batch: list[_LogRead]) -> None:
        """Read a batch of logs in one statement (LOGS_MANY). If it fails, or a run is
        asked for twice, each log is read alone, so each caller learns its own outcome.
        Every caller is answered, even if this task is cancelled."""
        try:
            if len(batch) > 1 and len({job.run_id for job in batch}) == len(batch):
                try:
                    rows = await self._fetch_async(
                        LOGS_MANY,
                        ([job.run_id for job in batch], [job.after_seq for job in batch]),
                        inline=False,  # logs of unbounded size: never blocking the loop
                    )
                except Exception as exc:
                    log.warning(
                        "batched read of %d logs failed (%s); each goes alone", len(batch), exc
                    )
                else:
                    by_run: dict[str, list[Any]] = {job.run_id: [] for job in batch}
                    for row in rows:
                        by_run[row[1]].append(row)
                    self.batched_logs += len(batch)
                    for job in batch:
                        settle(job.future, by_run[job.run_id], None)
                    return
            await asyncio.gather(*(self._read_log_alone(job) for job in batch))
        finally:
            for job in batch:
                settle(job.future, None, StorageError("the batched log read was interrupted"))

    async def _read_log_alone(self, job: _LogRead) -> None:
        try:
            rows = await super()._log_tail(job.run_id, job.after_seq)
        except Exception as exc:
            settle(job.future, None, exc)
        else:
            settle(job.future, rows, None)

    async def _event_rows(self, sql: str, params: Sequence[object]) -> list[object]:
        # A whole log can be large: never on the inline lane, which would block the loop
        # for as long as it takes to read (or run into its statement timeout).
        return await self._fetch_async(sql, params, inline=False)

    async def _long_log(self, run_id: str, after_seq: int) -> list[Any]:
        """A log known to be long, read on a thread of the sync pool (a blocking read),
        not the loop's way: psycopg's async read takes a turn of the loop (a reader added
        and removed, a future, a timer) for every few kilobytes the socket delivers; a
        25 MB log took 84 ms that way and 72 ms on a thread (wall time, bench/RESULTS.md).
        A short log keeps the loop's way: there a thread's hand-off costs more than the
        turns it saves. So does a long one while ``_long_reads_max`` are already being
        read (a burst of long runs must not take every thread claims need) or while
        other ticks' logs wait to be read in this turn (it joins their statement).

        The read is one statement, so one snapshot. A tick cancelled meanwhile does not
        stop it: the thread finishes the transfer, then its connection goes back to the
        pool, as any statement of the sync pool does."""
        if self._long_reads >= self._long_reads_max or not self._log_reads.empty:
            return await self._log_tail(run_id, after_seq)
        self._long_reads += 1
        try:
            # The generic store's read: one statement in a thread of the sync pool (this
            # class's own _event_rows is the loop's way).
            return await super()._event_rows(LOG_ROWS, (run_id, after_seq))
        finally:
            self._long_reads -= 1
            self.lanes.gate.turned()  # that wait was a turn of the loop

    def _is_conflict(self, exc: BaseException) -> bool:
        return isinstance(exc, self._psycopg.errors.UniqueViolation)

    # -- retention hooks (see toren.store.pruning) --------------------------------------

    def _in(self, values: Sequence[str]) -> tuple[str, list[object]]:
        # One array parameter: one statement shape whatever the number of values.
        return "= ANY(?)", [list(values)]

    def _lock_owned_blobs(self, cur: Cursor, clause: str, params: Sequence[object]) -> None:
        # Every body the deleted runs stored first, locked at once in hash order (the
        # order in which steps lock the rows they store again), so the statements that
        # follow take no further lock and cannot deadlock with a step. A step that counted
        # a body as shared meanwhile has committed when the lock is granted.
        self._x(
            cur, f"SELECT hash FROM blobs WHERE run_id {clause} ORDER BY hash FOR UPDATE", params
        )

    def _advance_sequences(self, cur: Cursor, seq: int, inbox_id: int) -> None:
        # Rows inserted with their own ids do not move PostgreSQL's sequences.
        for table, column, top in (("events", "seq", seq), ("inbox", "id", inbox_id)):
            self._x(
                cur,
                "SELECT setval(pg_get_serial_sequence(?, ?), ?) WHERE ? > COALESCE("
                "pg_sequence_last_value(pg_get_serial_sequence(?, ?)::regclass), 0)",
                (table, column, top, top, table, column),
            )

    def _claim(
        self, cur: Any, worker_id: str, limit: int, now: float, ttl: float, only: str | None
    ) -> list[Lease]:
        sql, params = _claim_statement(worker_id, limit, now, ttl, only)
        self._x(cur, sql, params)
        return [claimed_lease(worker_id, r[0], r[1], r[2], r[3:]) for r in cur.fetchall()]

    async def claim(
        self, worker_id: str, limit: int, *, now: float, ttl: float, only: str | None = None
    ) -> list[Lease]:
        """Lease up to ``limit`` runnable runs in one statement on the loop (see CLAIM)."""
        if limit <= 0:
            return []
        sql, params = _claim_statement(worker_id, limit, now, ttl, only)
        rows = await self._fetch_async(sql, params)
        leases = [claimed_lease(worker_id, r[0], r[1], r[2], r[3:]) for r in rows]
        if len(leases) < limit and await self._keyed_waiting(now, only):
            rest = limit - len(leases)
            leases += await self._run(
                lambda cur: claim_keyed(
                    self,
                    cur,
                    dialect="postgres",
                    worker_id=worker_id,
                    limit=rest,
                    now=now,
                    ttl=ttl,
                    only=only,
                )
            )
        return leases

    async def _keyed_waiting(self, now: float, only: str | None) -> bool:
        """Any queued run of a concurrency key that could start now (one index probe on
        the loop: a worker with no keyed runs pays no transaction for them)."""
        only_sql, only_params = ("AND id = %s ", (only,)) if only else ("", ())
        rows = await self._fetch_async(
            "SELECT 1 FROM runs WHERE status = 'queued' AND concurrency_key IS NOT NULL "
            f"AND (not_before IS NULL OR not_before <= %s) {only_sql}LIMIT 1",
            (now, *only_params),
        )
        return bool(rows)

    async def next_due(self, *, now: float) -> float | None:
        """See ``SqlStore.next_due``; on the loop (an idle worker asks after each claim
        that came up short)."""
        rows = await self._fetch_async(NEXT_DUE, (now, now, now))
        return None if not rows or rows[0][0] is None else float(rows[0][0])

    async def send_message(self, run_id: str, name: str, payload: object, *, now: float) -> int:
        """One statement on the loop (see SEND_MESSAGE)."""
        rows = await self._fetch_async(SEND_MESSAGE, (run_id, name, dumps(payload), now, now))
        if not rows:
            raise RunNotFound(f"no run with id {run_id!r}")
        status, msg_id = rows[0][0], rows[0][1]
        if msg_id is None:
            raise RunNotFound(f"run {run_id!r} is {status} and takes no more messages")
        return int(msg_id)

    async def next_message(self, run_id: str, names: Sequence[str]) -> InboxMessage | None:
        """The oldest unconsumed message of these names, read on the loop: a woken run
        reads it first thing in its tick."""
        marks = ", ".join("?" for _ in names)
        rows = await self._fetch_async(
            "SELECT id, run_id, name, payload, created_at FROM inbox WHERE run_id = ? "
            f"AND consumed_seq IS NULL AND name IN ({marks}) ORDER BY id LIMIT 1",
            (run_id, *names),
        )
        if not rows:
            return None
        row = rows[0]
        message = read_json(row[3], "inbox", "payload", id=row[0], run_id=run_id)
        return InboxMessage(row[0], row[1], row[2], message, row[4])

    async def migrate(self) -> None:
        """Apply the schema list. Entries that already hold are skipped after a catalog
        look-up, so a start against an up-to-date database takes no table lock at all
        (``ADD COLUMN IF NOT EXISTS`` alone would take an ACCESS EXCLUSIVE lock on every
        start, and ``CREATE INDEX IF NOT EXISTS`` a SHARE lock: under live traffic that
        stalls writers and can deadlock with them). Needed entries run one statement per
        transaction under a session advisory lock, so concurrent starts do not race."""

        def apply(cur: Any) -> None:
            cur.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
            try:
                present = _present_schema(cur)
                cur.execute("SET lock_timeout = '30s'")
                for migration in SCHEMA:
                    if applies(migration, "postgres") and not _is_present(migration, present):
                        cur.execute(render(migration, "postgres"))
            finally:
                cur.execute("RESET lock_timeout")
                cur.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))

        await self.lanes.reach()  # an unreachable server is its own error, not a schema problem
        try:
            await self._run(apply, write=False)
        except StorageError as exc:
            raise SchemaError(f"cannot apply the schema: {exc}") from exc

    async def notify(self) -> None:
        await self._fetch_async(f"NOTIFY {CHANNEL}", (), rows=False)

    async def wait_for_work(self, timeout: float) -> bool:
        """Wait for a NOTIFY on the work channel (True) or ``timeout`` seconds (False)."""
        return await self.lanes.wait_for_work(timeout)

    async def close(self) -> None:
        await self.lanes.close()
