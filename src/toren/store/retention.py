"""Retention: prune finished runs, export runs as JSON Lines, import them back.

A finished run (``completed``, ``failed``, ``cancelled``) is pruned whole: its row, its
event log, its inbox and the message bodies (``blobs``) no other run stored. Runs in
flight (``queued``, ``running``) and parked runs (``waiting``) are never selected, and
the delete re-checks status and finish time in its own statement, so a run that changed
meanwhile is left alone. Each batch is one short transaction; workers stepping live runs
keep writing meanwhile (see docs/storage.md#retention for why that is safe).

Message bodies are content-addressed and shared between runs (a system prompt, tool
specs). Each body row records its first writer (``run_id``) and how many times another
run stored it again (``shares``). A run only ever references bodies it stored itself (its
steps store every new message, its list nodes and tool specs), so a body whose first
writer is pruned and that no other run stored is referenced by no remaining event, and
goes with the run. A shared body is kept: it may be referenced elsewhere.

Export format (one JSON object per line, UTF-8): a header ``{"toren_export": 1, ...}``,
then for each run a ``run`` line (the row's columns as stored, and the hashes of every
body its events reference), the ``blob`` lines not yet written in this file, its
``event`` lines in seq order and its ``inbox`` lines. Stored text (payloads, inputs,
bodies) is carried as JSON strings, so an import restores it byte for byte.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

from toren.core.values import TERMINAL_STATUSES
from toren.errors import InvalidInput, StorageError
from toren.store.base import Store, read_json
from toren.store.sql import EVENT_COLUMNS, RUN_COLUMNS, Cursor, insert_blobs_sql

T = TypeVar("T")
FORMAT = 1
INBOX_COLUMNS = "id, run_id, name, payload, created_at, consumed_seq"
_RUN_COLS = tuple(c.strip() for c in RUN_COLUMNS.split(","))
_EVENT_COLS = tuple(c.strip() for c in EVENT_COLUMNS.split(","))
_INBOX_COLS = tuple(c.strip() for c in INBOX_COLUMNS.split(","))


def check_statuses(statuses: Iterable[str]) -> tuple[str, ...]:
    """Only finished statuses can be pruned or bulk-exported."""
    chosen = tuple(dict.fromkeys(statuses)) or tuple(sorted(TERMINAL_STATUSES))
    wrong = [s for s in chosen if s not in TERMINAL_STATUSES]
    if wrong:
        raise InvalidInput(
            f"status {wrong[0]!r} cannot be pruned: only finished runs are "
            f"({', '.join(sorted(TERMINAL_STATUSES))}); runs in flight or waiting are "
            "never touched"
        )
    return chosen


@dataclass
class PruneResult:
    runs: int = 0
    events: int = 0
    inbox: int = 0
    blobs: int = 0
    batches: int = 0
    run_ids: list[str] = field(default_factory=list)

    def add(self, other: PruneResult) -> None:
        self.runs += other.runs
        self.events += other.events
        self.inbox += other.inbox
        self.blobs += other.blobs
        self.batches += other.batches
        self.run_ids += other.run_ids

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "events": self.events,
            "inbox": self.inbox,
            "blobs": self.blobs,
            "batches": self.batches,
        }


# -- running SQL off the worker's loop ----------------------------------------------------


async def _bulk(store: Store, fn: Callable[[Cursor], T], *, write: bool = True) -> T:
    """Run ``fn(cur)`` in one transaction, never on the event loop's own thread: a batch
    of deletes or a page of an export takes milliseconds to seconds, and a worker's loop
    must keep stepping its runs meanwhile. PostgreSQL's ``_run`` already uses its thread
    pool; SQLite's would group-commit on the loop, so its database thread does it."""
    sql_store: Any = store
    if sql_store.dialect == "sqlite":
        import sqlite3

        try:
            on_thread: T = await sql_store._on_thread(fn, write=write)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite error on {sql_store.path!r}: {exc}") from exc
        return on_thread
    result: T = await sql_store._run(fn, write=write)
    return result


def _x(store: Store, cur: Cursor, sql: str, params: Sequence[Any] = ()) -> Any:
    sql_store: Any = store
    return sql_store._x(cur, sql, params)


def _postgres(store: Store) -> bool:
    return getattr(store, "dialect", "") == "postgres"


def _in(store: Store, values: Sequence[Any]) -> tuple[str, list[Any]]:
    """``IN (...)`` for a list of values: one array parameter on PostgreSQL (one statement
    shape), a placeholder each on SQLite."""
    if _postgres(store):
        return "= ANY(?)", [list(values)]
    return f"IN ({', '.join('?' for _ in values)})", list(values)


def _finished_where(statuses: Sequence[str]) -> str:
    marks = ", ".join("?" for _ in statuses)
    # A run another run was forked from stays while that fork exists: the fork's copied
    # steps reference the message bodies the source stored (docs/storage.md#retention).
    return (
        f"status IN ({marks}) AND updated_at < ? AND lease_owner IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM runs AS fork WHERE fork.forked_from = runs.id)"
    )


# -- prune ------------------------------------------------------------------------------


async def count_finished(
    store: Store, *, before: float, statuses: Sequence[str]
) -> tuple[int, int]:
    """(runs, events) that a prune with these bounds would delete now (``--dry-run``)."""
    where = _finished_where(statuses)

    def tx(cur: Cursor) -> tuple[int, int]:
        runs = _x(
            store, cur, f"SELECT COUNT(id) FROM runs WHERE {where}", (*statuses, before)
        ).fetchone()[0]
        events = _x(
            store,
            cur,
            f"SELECT COUNT(seq) FROM events WHERE run_id IN (SELECT id FROM runs WHERE {where})",
            (*statuses, before),
        ).fetchone()[0]
        return int(runs), int(events)

    return await _bulk(store, tx, write=False)


async def prune_batch(
    store: Store,
    *,
    before: float,
    statuses: Sequence[str] = tuple(sorted(TERMINAL_STATUSES)),
    limit: int = 200,
    before_delete: Callable[[list[str]], Any] | None = None,
) -> PruneResult:
    """Delete up to ``limit`` runs that finished (with one of ``statuses``) before the
    epoch time ``before``, oldest first, with their events, inbox and the message bodies
    only they stored: one transaction. ``before_delete(run_ids)`` is awaited first when
    given (an export of exactly the runs about to go)."""
    statuses = check_statuses(statuses)
    where = _finished_where(statuses)
    # PostgreSQL: workers pruning at once split the work instead of queueing on each
    # other's rows (SKIP LOCKED); the delete below re-checks the same bounds regardless.
    lock = " FOR UPDATE SKIP LOCKED" if _postgres(store) else ""
    select = f"SELECT id FROM runs WHERE {where} ORDER BY updated_at LIMIT ?{lock}"

    if before_delete is not None:
        ids = await _bulk(
            store,
            lambda cur: [r[0] for r in _x(store, cur, select, (*statuses, before, limit))],
            write=False,
        )
        if not ids:
            return PruneResult()
        await before_delete(ids)
    else:
        ids = None

    def tx(cur: Cursor) -> PruneResult:
        chosen = ids
        if chosen is None:
            chosen = [r[0] for r in _x(store, cur, select, (*statuses, before, limit))]
        if not chosen:
            return PruneResult()
        clause, params = _in(store, chosen)
        # The bounds again, in the delete itself: a run resumed or retried since it was
        # chosen is no longer finished, and stays.
        deleted = [
            r[0]
            for r in _x(
                store,
                cur,
                f"DELETE FROM runs WHERE id {clause} AND {where} RETURNING id",
                (*params, *statuses, before),
            ).fetchall()
        ]
        if not deleted:
            return PruneResult()
        clause, params = _in(store, deleted)
        if not _postgres(store):
            # FTS5 over an external content table: rows leave its index by 'delete'.
            _x(
                store,
                cur,
                "INSERT INTO run_search_fts (run_search_fts, rowid, body) "
                f"SELECT 'delete', rowid, body FROM run_search WHERE run_id {clause}",
                params,
            )
        _x(store, cur, f"DELETE FROM run_search WHERE run_id {clause}", params)
        events = _x(store, cur, f"DELETE FROM events WHERE run_id {clause}", params).rowcount
        inbox = _x(store, cur, f"DELETE FROM inbox WHERE run_id {clause}", params).rowcount
        if _postgres(store):
            # Every body the deleted runs stored first, locked at once in hash order (the
            # order in which steps lock the rows they store again), so the statements
            # below take no further lock and cannot deadlock with a step. A step that
            # counted a body as shared meanwhile has committed when the lock is granted.
            _x(
                store,
                cur,
                f"SELECT hash FROM blobs WHERE run_id {clause} ORDER BY hash FOR UPDATE",
                params,
            )
        blobs = _x(
            store, cur, f"DELETE FROM blobs WHERE run_id {clause} AND shares = 0", params
        ).rowcount
        # A body the deleted runs stored first but others stored too may still be
        # referenced: it loses its owner and waits for the next sweep_blobs.
        _x(store, cur, f"UPDATE blobs SET run_id = NULL WHERE run_id {clause}", params)
        return PruneResult(len(deleted), events, inbox, blobs, 1, deleted)

    return await _bulk(store, tx)


async def sweep_blobs(store: Store, *, page: int = 200) -> int:
    """Delete the bodies without an owner (shared bodies whose first writer was pruned,
    and rows stored before bodies had owners) that no event references any more: a mark
    over every run's log (read page by page, each run's list nodes walked), then a delete
    of the unmarked ones. Costs a read of the whole log: run it after a large prune, not
    per batch. The number of bodies deleted.

    Safe beside live writers: a writer that stores one of these bodies again counts it in
    ``shares`` (its owner is NULL), and the delete only takes rows whose ``shares`` is
    still what it was before the mark began; a body a run references without storing it
    again, it stored earlier, in an event the mark sees."""
    candidates: dict[str, int] = dict(
        await _bulk(
            store,
            lambda cur: list(_x(store, cur, "SELECT hash, shares FROM blobs WHERE run_id IS NULL")),
            write=False,
        )
    )
    if not candidates:
        return 0
    after = ""
    while candidates:

        def mark(cur: Cursor, start: str = after) -> tuple[list[str], set[str]]:
            ids = [
                r[0]
                for r in _x(
                    store,
                    cur,
                    "SELECT id FROM runs WHERE id > ? ORDER BY id LIMIT ?",
                    (start, page),
                )
            ]
            if not ids:
                return ids, set()
            clause, params = _in(store, ids)
            events = _x(
                store,
                cur,
                f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id {clause} "
                "AND type = 'ModelCallRecorded'",
                params,
            ).fetchall()
            return ids, set(_run_blobs(store, cur, events))

        ids, used = await _bulk(store, mark, write=False)
        if not ids:
            break
        for h in used:
            candidates.pop(h, None)
        after = ids[-1]
    # Events of runs that no longer exist (a partial delete of an older release) are not
    # marked above: bodies they reference go too, as the log they belong to is gone.
    deleted = 0
    items = sorted(candidates.items())
    for i in range(0, len(items), 500):
        chunk = items[i : i + 500]

        def delete(cur: Cursor, rows: list[tuple[str, int]] = chunk) -> int:
            count = 0
            for h, shares in rows:
                count += _x(
                    store,
                    cur,
                    "DELETE FROM blobs WHERE hash = ? AND run_id IS NULL AND shares = ?",
                    (h, shares),
                ).rowcount
            return count

        deleted += await _bulk(store, delete)
    return deleted


async def prune(
    store: Store,
    *,
    before: float,
    statuses: Sequence[str] = tuple(sorted(TERMINAL_STATUSES)),
    batch: int = 200,
    pause: float = 0.0,
    before_delete: Callable[[list[str]], Any] | None = None,
    on_batch: Callable[[PruneResult], None] | None = None,
) -> PruneResult:
    """Prune every run that finished before ``before``, ``batch`` runs per transaction,
    sleeping ``pause`` seconds between batches (to leave the database to live work)."""
    import asyncio

    total = PruneResult()
    while True:
        done = await prune_batch(
            store, before=before, statuses=statuses, limit=batch, before_delete=before_delete
        )
        if not done.runs:
            return total
        total.add(done)
        total.run_ids = []  # a long prune does not keep every id
        if on_batch is not None:
            on_batch(done)
        if pause:
            await asyncio.sleep(pause)


# -- export -----------------------------------------------------------------------------


async def finished_ids(
    store: Store, *, before: float, statuses: Sequence[str], page: int = 500
) -> AsyncIterator[str]:
    """The ids of runs finished before ``before``, oldest id first, page by page."""
    statuses = check_statuses(statuses)
    where = _finished_where(statuses)
    sql = f"SELECT id FROM runs WHERE {where} AND id > ? ORDER BY id LIMIT ?"

    def read(after: str) -> Callable[[Cursor], list[Any]]:
        return lambda cur: list(_x(store, cur, sql, (*statuses, before, after, page)))

    after = ""
    while True:
        rows = await _bulk(store, read(after), write=False)
        for (run_id,) in rows:
            yield run_id
        if len(rows) < page:
            return
        after = rows[-1][0]


def _referenced(events: Sequence[Sequence[Any]]) -> tuple[set[str], set[str]]:
    """(list nodes, other bodies) that model-call events reference directly."""
    nodes: set[str] = set()
    direct: set[str] = set()
    type_at, payload_at = _EVENT_COLS.index("type"), _EVENT_COLS.index("payload")
    for row in events:
        if row[type_at] != "ModelCallRecorded":
            continue
        payload = read_json(row[payload_at], "events", "payload", seq=row[0])
        if not isinstance(payload, dict):
            continue
        node = payload.get("message_list")
        if isinstance(node, str):
            nodes.add(node)
        direct.update(h for h in payload.get("tools") or () if isinstance(h, str))
    return nodes, direct


def _bodies(store: Store, cur: Cursor, hashes: Iterable[str]) -> dict[str, str]:
    wanted = sorted(set(hashes))
    out: dict[str, str] = {}
    for i in range(0, len(wanted), 500):
        clause, params = _in(store, wanted[i : i + 500])
        rows = _x(store, cur, f"SELECT hash, body FROM blobs WHERE hash {clause}", params)
        out.update((h, b) for h, b in rows.fetchall())
    return out


def _run_blobs(store: Store, cur: Cursor, events: Sequence[Sequence[Any]]) -> dict[str, str]:
    """Every body the events reference: list nodes (walking ``prev``), their messages and
    tool specs. A missing one is an error: the export would not import as a whole log."""
    nodes, direct = _referenced(events)
    found: dict[str, str] = {}
    todo = set(nodes)
    while todo:
        got = _bodies(store, cur, todo)
        missing = todo - got.keys()
        if missing:
            raise StorageError(f"message list node {sorted(missing)[0]!r} is missing from blobs")
        found.update(got)
        nxt: set[str] = set()
        for h in todo:
            body = json.loads(got[h])
            direct.update(body.get("items") or ())
            prev = body.get("prev")
            if isinstance(prev, str) and prev not in found:
                nxt.add(prev)
        todo = nxt
    rest = direct - found.keys()
    got = _bodies(store, cur, rest)
    missing = rest - got.keys()
    if missing:
        raise StorageError(f"message body {sorted(missing)[0]!r} is missing from blobs")
    found.update(got)
    return found


def _dump(record: dict[str, Any]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


async def export_runs(
    store: Store, run_ids: AsyncIterator[str] | Iterable[str], out: IO[str]
) -> int:
    """Write the runs, their events, inbox and referenced bodies to ``out`` as JSON Lines;
    the number of runs written. An unknown id is an error naming it."""
    out.write(_dump({"toren_export": FORMAT, "created_at": time.time()}))
    written: set[str] = set()
    count = 0

    async def ids() -> AsyncIterator[str]:
        if isinstance(run_ids, AsyncIterator):
            async for run_id in run_ids:
                yield run_id
        else:
            for run_id in run_ids:
                yield run_id

    async for run_id in ids():

        def tx(cur: Cursor, rid: str = run_id) -> tuple[Any, list[Any], list[Any], dict[str, str]]:
            row = _x(store, cur, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (rid,))
            found = row.fetchone()
            if found is None:
                raise InvalidInput(f"no run with id {rid!r} to export")
            events = _x(
                store,
                cur,
                f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq",
                (rid,),
            ).fetchall()
            inbox = _x(
                store,
                cur,
                f"SELECT {INBOX_COLUMNS} FROM inbox WHERE run_id = ? ORDER BY id",
                (rid,),
            ).fetchall()
            return found, events, inbox, _run_blobs(store, cur, events)

        # One read transaction per run (a consistent snapshot on PostgreSQL when it is
        # not REPEATABLE READ: a finished run does not change).
        run, events, inbox, blobs = await _bulk(store, tx, write=False)
        out.write(
            _dump(
                {
                    "type": "run",
                    "row": dict(zip(_RUN_COLS, run, strict=True)),
                    "blobs": sorted(blobs),
                }
            )
        )
        for h in sorted(blobs):
            if h not in written:
                out.write(_dump({"type": "blob", "hash": h, "body": blobs[h]}))
                written.add(h)
        for ev in events:
            out.write(_dump({"type": "event", "row": dict(zip(_EVENT_COLS, ev, strict=True))}))
        for msg in inbox:
            out.write(_dump({"type": "inbox", "row": dict(zip(_INBOX_COLS, msg, strict=True))}))
        count += 1
    out.flush()
    return count


# -- import -----------------------------------------------------------------------------


@dataclass
class ImportResult:
    runs: int = 0
    skipped: list[str] = field(default_factory=list)  # already present
    events: int = 0
    blobs: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "skipped": len(self.skipped),
            "events": self.events,
            "blobs": self.blobs,
        }


@dataclass
class _Pending:
    row: dict[str, Any]
    blobs: list[str]
    events: list[dict[str, Any]] = field(default_factory=list)
    inbox: list[dict[str, Any]] = field(default_factory=list)


def _columns(row: dict[str, Any], known: tuple[str, ...], what: str, line: int) -> list[str]:
    """The row's columns this release knows (named in its INSERT), in its order. Unknown
    ones (a newer release's) are left out; a missing key column is an error."""
    if not isinstance(row, dict) or known[0] not in row:
        raise InvalidInput(f"line {line}: the {what} record has no {known[0]!r}")
    return [c for c in known if c in row]


async def import_runs(store: Store, lines: Iterable[str]) -> ImportResult:
    """Read an export (JSON Lines) back. A run already in the database is skipped (an
    import can be repeated); each other run is inserted in one transaction with its
    events (their original seq), inbox and bodies."""
    result = ImportResult()
    bodies: dict[str, str] = {}
    pending: _Pending | None = None
    header = False
    max_seq = max_inbox = 0
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(
                f"line {number} is not JSON ({exc}); is this a toren export?"
            ) from None
        if not header:
            if not isinstance(record, dict) or record.get("toren_export") != FORMAT:
                raise InvalidInput(
                    f"line {number} is not a toren export header (expected "
                    f'{{"toren_export": {FORMAT}, ...}}); write one with `toren runs export`'
                )
            header = True
            continue
        kind = record.get("type") if isinstance(record, dict) else None
        if kind == "blob":
            bodies[str(record["hash"])] = str(record["body"])
        elif kind == "run":
            if pending is not None:
                await _import_one(store, pending, bodies, result)
            row = record.get("row")
            _columns(row, _RUN_COLS, "run", number)
            pending = _Pending(row, [str(h) for h in record.get("blobs") or ()])
        elif kind in ("event", "inbox"):
            if pending is None:
                raise InvalidInput(f"line {number}: an {kind} record before any run record")
            row = record.get("row")
            _columns(row, _EVENT_COLS if kind == "event" else _INBOX_COLS, kind, number)
            if row.get("run_id") != pending.row["id"]:
                raise InvalidInput(
                    f"line {number}: an {kind} of run {row.get('run_id')!r} among the "
                    f"records of run {pending.row['id']!r}"
                )
            if kind == "event":
                pending.events.append(row)
                max_seq = max(max_seq, int(row["seq"]))
            else:
                pending.inbox.append(row)
                max_inbox = max(max_inbox, int(row["id"]))
        # Other record types (a newer release's) are skipped, as the log's readers do.
    if not header:
        raise InvalidInput("the file is empty: expected a toren export (JSON Lines)")
    if pending is not None:
        await _import_one(store, pending, bodies, result)
    if _postgres(store) and result.runs:
        await _bulk(store, lambda cur: _advance_sequences(store, cur, max_seq, max_inbox))
    return result


def _advance_sequences(store: Store, cur: Cursor, max_seq: int, max_inbox: int) -> None:
    """Rows inserted with their own ids do not move PostgreSQL's sequences: move them past
    what was imported, so new events and messages never take an imported id (in a fresh
    database, say). Never moves a sequence back."""
    for table, column, top in (("events", "seq", max_seq), ("inbox", "id", max_inbox)):
        _x(
            store,
            cur,
            "SELECT setval(pg_get_serial_sequence(?, ?), ?) WHERE ? > COALESCE("
            "pg_sequence_last_value(pg_get_serial_sequence(?, ?)::regclass), 0)",
            (table, column, top, top, table, column),
        )


async def _import_one(
    store: Store, run: _Pending, bodies: dict[str, str], result: ImportResult
) -> None:
    run_id = str(run.row["id"])
    missing = [h for h in run.blobs if h not in bodies]
    if missing:
        raise InvalidInput(f"run {run_id!r}: message body {missing[0]!r} is not in the file")

    def tx(cur: Cursor) -> bool:
        exists = _x(store, cur, "SELECT id FROM runs WHERE id = ?", (run_id,)).fetchone()
        if exists is not None:
            return False
        for table, known, rows in (
            ("runs", _RUN_COLS, [run.row]),
            ("events", _EVENT_COLS, run.events),
            ("inbox", _INBOX_COLS, run.inbox),
        ):
            for row in rows:
                cols = [c for c in known if c in row]
                marks = ", ".join("?" for _ in cols)
                _x(
                    store,
                    cur,
                    f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})",
                    [row[c] for c in cols],
                )
        for i in range(0, len(run.blobs), 200):
            chunk = sorted(run.blobs)[i : i + 200]
            params = [v for h in chunk for v in (h, bodies[h], len(bodies[h]), run_id)]
            _x(store, cur, insert_blobs_sql(len(chunk)), params)
        return True

    try:
        added = await _bulk(store, tx)
    except Exception as exc:
        if type(exc).__name__ in ("IntegrityError", "UniqueViolation"):
            raise StorageError(
                f"cannot import run {run_id!r}: one of its event seqs or inbox ids is taken "
                f"by another run in this database ({exc})"
            ) from None
        raise
    if added:
        result.runs += 1
        result.events += len(run.events)
        result.blobs += len(run.blobs)
    else:
        result.skipped.append(run_id)
