"""SQLite store: the embedded default (standard library ``sqlite3``, WAL).

Writes are *group-committed* on the event loop's own thread: every write requested
during one turn of the loop joins one ``BEGIN IMMEDIATE`` transaction, each in its own
savepoint, committed once; each caller learns its own outcome after that commit. A lone
write, with nothing else ready to run, commits at once (no turn of the loop); a lone
step pays no thread hand-off; many runs stepping at once share one fsync. That connection
never waits for a lock (busy timeout 0): if another process holds the write lock, the
group is handed to the database thread, which waits on the busy timeout so the loop never
blocks on it. Reads run on that thread too, on its own connection (WAL lets them proceed
beside a writer), except two short reads by key every wake makes (a run's row, its next
message): those run on the loop's connection when nothing else is ready, as a lone write
does, and take the thread when that connection cannot answer at once.

Durability: ``synchronous=FULL`` by default (a committed step survives power loss);
``?synchronous=normal`` in the URL trades that for speed (still safe against a killed
process). A write of lease bookkeeping alone (a claim, a renewal: rows a recovery
rebuilds, never an event) commits without waiting for the disk (``synchronous=NORMAL``
for that transaction): the WAL is one file written in order, so the next durable commit
(any step's) makes it durable too, and a power loss before that can only undo a lease,
which every process it concerned lost with the machine (docs/storage.md). So do a
message's receipt alone (its ``MessageReceived`` and the consumed inbox row: undone with
everything after it, the run takes the same message again) and a park (undone, the run is
found running under a lease that ran out with its holder, taken over, replayed and parked
again): writes that record no effect, which a replay writes again.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import re
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from toren.core.contract.events import Event
from toren.core.contract.values import RunStatus
from toren.errors import CorruptRow, SchemaError, StorageError
from toren.store.base import Lease, Release
from toren.store.flow import UNKEYED, claim_keyed
from toren.store.pruning import RetentionSql
from toren.store.schema import SCHEMA, AddColumn, applies, render
from toren.store.sql import (
    CLAIMABLE,
    LOG_HEAD,
    TOTALS,
    UNBLOCK,
    Cursor,
    InlineGate,
    claimed_columns,
    claimed_lease,
    claimed_message_join,
    claimed_unread,
    lease_lost,
    release_not_before,
    release_values,
    settle,
    totals_values,
    woken,
)

T = TypeVar("T")
_MAX_GROUP = 256  # writes committed together at most
# sqlite3's error for stored text that is not UTF-8 (the column named, then the text).
_NOT_UTF8 = re.compile(r"Could not decode to UTF-8 column '([^']*)'")
_CLAIMED = (
    f"SELECT {claimed_columns('runs', 'sqlite')} FROM runs {claimed_message_join('runs')} "
    "WHERE runs.id = ?"  # a run just claimed
)


class _Job:
    """One unit of work for the database thread, and how to hand its outcome back."""

    __slots__ = ("durable", "fn", "future", "loop", "write")

    def __init__(
        self,
        fn: Callable[[Cursor], Any],
        write: bool,
        future: asyncio.Future[Any],
        loop: Any,
        durable: bool = True,
    ) -> None:
        self.fn, self.write, self.future, self.loop = fn, write, future, loop
        self.durable = durable

    def finish(self, result: object, error: BaseException | None) -> None:
        self.loop.call_soon_threadsafe(settle, self.future, result, error)


_SYNC_MODES = {"full": "FULL", "normal": "NORMAL", "off": "OFF", "extra": "EXTRA"}


def parse_sqlite_url(url: str) -> tuple[str, dict[str, str]]:
    """``sqlite:///relative.db``, ``sqlite:////abs/path.db``, ``sqlite:///:memory:``."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or not parts.path.startswith("/"):
        raise StorageError(
            f"bad SQLite URL {url!r}; expected sqlite:///relative/path.db or "
            "sqlite:////absolute/path.db"
        )
    path = parts.path[1:] or ":memory:"
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    return path, options


class SQLiteStore(RetentionSql):
    dialect = "sqlite"

    def __init__(self, url: str) -> None:
        self.url = url
        self.path, options = parse_sqlite_url(url)
        sync = options.get("synchronous", "full").lower()
        if sync not in _SYNC_MODES:
            raise StorageError(
                f"bad synchronous={sync!r} in {url!r}; expected one of {sorted(_SYNC_MODES)}"
            )
        self.synchronous = _SYNC_MODES[sync]
        # Whether a lease-only write may commit without the disk (see the module's
        # docstring): only when commits otherwise wait for it.
        self._relaxable = self.synchronous in ("FULL", "EXTRA")
        # Whether each open connection (by id) is at the relaxed level now (_level);
        # absent: at the store's level, as opened.
        self._levels: dict[int, bool] = {}
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        # Inline group commit needs a second connection to the same file.
        self._inline = self.path != ":memory:"
        self._loop_conn: sqlite3.Connection | None = None
        self._loop_cur: sqlite3.Cursor | None = None
        self._pending: list[tuple[Callable[[Cursor], Any], asyncio.Future[Any], bool]] = []
        self._flush_scheduled = False
        self._gate = InlineGate()
        self._conn: sqlite3.Connection | None = None
        self._wakeup: asyncio.Event | None = None

    def _open(self, busy_ms: int) -> sqlite3.Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=busy_ms / 1000
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute(f"PRAGMA busy_timeout={busy_ms}")
            conn.execute("PRAGMA foreign_keys=OFF")
        except BaseException:  # locked, or not a database: a later call opens it afresh
            conn.close()
            raise
        return conn

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._open(30_000)
        return self._conn

    # -- inline group commit on the loop's thread --------------------------------------

    async def _group_write(self, fn: Callable[[Cursor], T], durable: bool = True) -> T:
        loop = asyncio.get_running_loop()
        if not self._flush_scheduled and self._gate.open(loop):
            # A lone write with nothing else ready to run: commit it now, in this call
            # (no future, no turn of the loop), as the group's one member would be.
            cur = self._begin_inline(durable)
            if cur is not None:
                ((result, error),) = self._run_group(cur, [fn])
                if error is not None:
                    raise error
                return result  # type: ignore[no-any-return]
            # The write lock is held elsewhere: the database thread waits for it.
            return await self._on_thread(fn, write=True, durable=durable)
        future: asyncio.Future[T] = loop.create_future()
        self._pending.append((fn, future, durable))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush_turn, loop)
        return await future

    def _flush_turn(self, loop: asyncio.AbstractEventLoop) -> None:
        self._gate.turned()
        self._flush(loop)

    def _loop_cursor(self) -> sqlite3.Cursor:
        """The loop's connection's cursor, outside any transaction (the connection opened
        on first use, busy timeout 0). Only a write an interrupt cut short
        (KeyboardInterrupt after BEGIN) leaves one open here: it holds the write lock,
        which every later write would wait on in vain, and nothing of it was committed,
        so it is rolled back."""
        if self._loop_cur is None:
            if self._loop_conn is None:
                self._loop_conn = self._open(0)
            self._loop_cur = self._loop_conn.cursor()
        elif self._loop_cur.connection.in_transaction:
            self._loop_cur.execute("ROLLBACK")
        return self._loop_cur

    def _begin_inline(self, durable: bool) -> Any:
        """Open a write transaction on the loop's connection: its cursor, or None when
        another connection holds the write lock (or, opening, a lock the WAL switch
        needs); the database thread, which waits on the busy timeout, must do it then.
        Raises what opening failed with otherwise (not a database, say)."""
        try:
            cur = self._loop_cursor()
            self._level(cur, durable)
            cur.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            return None
        return cur

    def _level(self, cur: sqlite3.Cursor, durable: bool) -> None:
        """Set the connection's ``synchronous`` for the transaction about to begin (it
        cannot change inside one): the store's level for a durable write, NORMAL for a
        lease-only one. A PRAGMA only when the level changes."""
        relaxed = not durable and self._relaxable
        key = id(cur.connection)
        if self._levels.get(key, False) != relaxed:
            cur.execute(f"PRAGMA synchronous={'NORMAL' if relaxed else self.synchronous}")
            self._levels[key] = relaxed

    async def _lease_write(self, fn: Callable[[Cursor], T]) -> T:
        return await self._run(fn, durable=False)

    async def _replayable_write(self, fn: Callable[[Cursor], T]) -> T:
        return await self._run(fn, durable=False)

    async def _read_small(self, fn: Callable[[Cursor], T]) -> T:
        """A short read by key, inline on the loop's connection when nothing else is
        ready to run (as a lone write is): no hand-off to the database thread and back,
        which costs a wake more than the read (bench/RESULTS.md). A read that would wait
        for a lock (busy timeout 0 here) takes the database thread, which waits."""
        if (
            self._inline
            and not self._flush_scheduled
            and self._gate.open(asyncio.get_running_loop())
        ):
            done, result = self._read_inline(fn)
            if done:
                return result  # type: ignore[return-value]  # done: fn returned it
        return await self._run(fn, write=False)

    def _log_head_inline(self, run_id: str, after_seq: int) -> list[Any] | None:
        """On the loop's connection, when a short read may go there (:meth:`_read_small`);
        SQLite commits one writer at a time, in seq order."""
        if (
            not self._inline
            or self._flush_scheduled
            or not self._gate.open(asyncio.get_running_loop())
        ):
            return None
        done, head = self._read_inline(
            lambda cur: cur.execute(LOG_HEAD, (run_id, after_seq)).fetchall()
        )
        return head if done else None

    def _read_inline(self, fn: Callable[[Cursor], T]) -> tuple[bool, T | None]:
        """``(True, fn(cur))`` on the loop's connection, or ``(False, None)`` when the
        database said no (a lock it would wait for, a connection it cannot open): the
        caller asks the database thread, which waits, or reports the error as every read
        does. What ``fn`` itself raises otherwise (a corrupt row's ``StorageError``) is
        raised. ``fn`` is one statement that finds a few rows at most (by key, or with a
        small ``LIMIT``): its own snapshot, over once its rows are fetched, so no
        ``BEGIN`` and ``COMMIT`` around it (two statements fewer per read, four per
        message wake)."""
        try:
            return True, fn(self._loop_cursor())
        except (sqlite3.Error, OSError):  # OSError: its directory, say
            return False, None

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush_scheduled = False
        batch, self._pending = self._pending, []
        durable = any(d for _, _, d in batch)
        try:
            cur = self._begin_inline(durable)
        except BaseException as exc:  # every caller learns it
            for _, future, _ in batch:
                settle(future, None, exc)
            if not isinstance(exc, Exception):
                raise  # an interrupt still interrupts the loop
            return
        if cur is None:
            for fn, future, d in batch:
                self._submit(_Job(fn, True, future, loop, d))
            return
        outcomes = self._run_group(cur, [fn for fn, _, _ in batch])
        for (_, future, _), (result, error) in zip(batch, outcomes, strict=True):
            settle(future, result, error)

    def _serve(self) -> None:
        """The database thread: reads one at a time, writes in groups."""
        while True:
            job = self._queue.get()
            if job is None:
                self._close_conn()
                return
            self._serve_one(job)
            # Waiting for the next job, the thread must not keep this one (and the result
            # it carries, say a run's last events) alive.
            del job

    def _serve_one(self, job: _Job) -> None:
        if not job.write:
            self._read(job)
            return
        batch = [job]
        while len(batch) < _MAX_GROUP:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None or not more.write:
                self._queue.put(more)  # after this group (a rare reordering of a read)
                break
            batch.append(more)
        self._write_group(batch)

    def _read(self, job: _Job) -> None:
        try:
            cur = self._connect().cursor()
            cur.execute("BEGIN")
            try:
                job.finish(job.fn(cur), None)
            finally:
                cur.execute("COMMIT")
        except BaseException as exc:
            job.finish(None, exc)

    def _write_group(self, batch: list[_Job]) -> None:
        try:
            cur = self._connect().cursor()
            self._level(cur, any(job.durable for job in batch))
            cur.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            for job in batch:
                job.finish(None, exc)
            return
        outcomes = self._run_group(cur, [job.fn for job in batch])
        for job, (result, error) in zip(batch, outcomes, strict=True):
            job.finish(result, error)

    @staticmethod
    def _run_group(
        cur: Cursor, fns: list[Callable[[Cursor], object]]
    ) -> list[tuple[Any, BaseException | None]]:
        """Run each write in its own savepoint of the open transaction, then commit once.
        One write failing (a lease conflict) does not undo the others. A write alone needs
        no savepoint: the transaction is its own."""
        alone = len(fns) == 1
        outcomes: list[tuple[object, BaseException | None]] = []
        try:
            for fn in fns:
                if alone:
                    outcomes.append((fn(cur), None))
                    continue
                cur.execute("SAVEPOINT job")
                try:
                    outcomes.append((fn(cur), None))
                    cur.execute("RELEASE job")
                except Exception as exc:
                    cur.execute("ROLLBACK TO job")
                    cur.execute("RELEASE job")
                    outcomes.append((None, exc))
            cur.execute("COMMIT")
        except BaseException as exc:  # the commit (or a lone write) failed: nothing happened
            with contextlib.suppress(sqlite3.Error):
                cur.execute("ROLLBACK")
            return [(None, exc)] * len(fns)
        return outcomes

    def _submit(self, job: _Job) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="toren-sqlite", daemon=True)
            self._thread.start()
        self._queue.put(job)

    async def _run(
        self, fn: Callable[[Cursor], T], *, write: bool = True, durable: bool = True
    ) -> T:
        try:
            if write and self._inline:
                return await self._group_write(fn, durable)
            return await self._on_thread(fn, write=write, durable=durable)
        except sqlite3.IntegrityError:
            raise
        except (sqlite3.Error, OSError) as exc:  # OSError: its directory cannot be made
            raise self._error(exc) from exc

    async def _bulk(self, fn: Callable[[Cursor], T], *, write: bool = True) -> T:
        # Never the group commit on the loop (``_run``): the database thread runs it.
        try:
            return await self._on_thread(fn, write=write)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise self._error(exc) from exc

    def _error(self, exc: BaseException) -> StorageError:
        """What a failed statement raises. Stored text that is not UTF-8 (SQLite keeps the
        bytes it is given; reading them back as text fails) is a :class:`CorruptRow`,
        naming its column: a repair, not the database coming back, is what it waits for.
        The text itself is left out (it may hold what the row hides)."""
        text = str(exc)
        bad = _NOT_UTF8.match(text)
        if isinstance(exc, sqlite3.OperationalError) and bad is not None:
            column = bad.group(1)
            return CorruptRow(
                f"SQLite error on {self.path!r}: the {column} column of a row holds text "
                "that is not UTF-8; Toren does not skip unreadable data: repair the row, "
                "then retry",
                column=column,
            )
        return StorageError(f"SQLite error on {self.path!r}: {exc}")

    async def _on_thread(
        self, fn: Callable[[Cursor], T], *, write: bool, durable: bool = True
    ) -> T:
        """Run ``fn`` on the database thread and wait for its outcome."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._submit(_Job(fn, write, future, loop, durable))
        return await future

    def _insert_event(self, cur: Any, sql: str, params: Sequence[Any]) -> int | None:
        # ``cur`` is a sqlite3 cursor: ``lastrowid`` is not in the shared Cursor protocol.
        # Without RETURNING: SQLite passes returned rows through a buffer, which costs a
        # step about 5 µs. The seq is the rowid; a fenced insert that found no lease
        # inserted no row.
        cur.execute(sql, params)
        return cur.lastrowid if cur.rowcount == 1 else None

    def _is_conflict(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)

    def _delete_search(self, cur: Cursor, clause: str, params: Sequence[object]) -> None:
        # FTS5 over an external content table: rows leave its index by 'delete' first.
        self._x(
            cur,
            "INSERT INTO run_search_fts (run_search_fts, rowid, body) "
            f"SELECT 'delete', rowid, body FROM run_search WHERE run_id {clause}",
            params,
        )
        super()._delete_search(cur, clause, params)

    def _release(self, cur: Cursor, lease: Lease, release: Release, now: float) -> list[Event]:
        """The release in one update of the row after the events: the lease's fence (the
        first event's insert checks it too, as a step's does), the totals, the new status
        and, for a run parking on its inbox, a look at the inbox in the same statement.
        SQLite has one writer at a time, and this transaction is it: every message
        committed before it is seen, and none can be sent until it commits (then the
        sender finds the run ``waiting`` and wakes it), so the second statement other
        databases need (``SqlStore._release``) is not needed here."""
        stored = self._insert_events(cur, release.events, lease)
        names = release.waiting_for if release.status == RunStatus.WAITING else None
        status, cancelled_at, not_before, *rest = release_values(release, now)
        inbox: str = ""
        inbox_params: tuple[object, ...] = ()
        if names:
            marks = ", ".join("?" for _ in names)
            inbox = (
                "WHEN EXISTS (SELECT 1 FROM inbox WHERE inbox.run_id = ? AND "
                f"inbox.consumed_seq IS NULL AND inbox.name IN ({marks})) THEN ? "
            )
            inbox_params = (lease.run_id, *names, now)
        cur = self._x(
            cur,
            f"UPDATE runs SET status = ?, {release_not_before('?', inbox)}, "
            "waiting_for = ?, output = ?, error = ?, paced = ?, "
            f"lease_owner = NULL, lease_expires_at = NULL, {UNBLOCK}, {TOTALS} "
            "WHERE id = ? AND lease_owner = ? AND lease_epoch = ?",
            (
                status,
                cancelled_at,
                *inbox_params,
                not_before,
                *rest,
                *totals_values(release.delta, now),
                lease.run_id,
                lease.worker_id,
                lease.epoch,
            ),
        )
        if cur.rowcount != 1:
            raise lease_lost(lease)
        return stored

    def _claim(
        self, cur: Cursor, worker_id: str, limit: int, now: float, ttl: float, only: str | None
    ) -> list[Lease]:
        only_sql, only_params = ("AND id = ? ", (only,)) if only else ("", ())
        rows = cur.execute(
            f"SELECT id, lease_owner, lease_epoch, status FROM runs WHERE {CLAIMABLE} "
            f"{UNKEYED}{only_sql}ORDER BY COALESCE(not_before, created_at) LIMIT ?",
            (now, now, now, *only_params, limit),
        ).fetchall()
        leases = []
        for run_id, old_owner, epoch, status in rows:
            recovered = old_owner is not None
            cur.execute(
                "UPDATE runs SET lease_owner = ?, lease_epoch = ?, lease_expires_at = ?, "
                "status = 'running', "
                "lease_recoveries = lease_recoveries + ? WHERE id = ?",
                (worker_id, epoch + 1, now + ttl, int(recovered), run_id),
            )
            # The row as claimed, read in this transaction: the tick starts from it.
            try:
                read = cur.execute(_CLAIMED, (run_id,)).fetchone()
            except sqlite3.OperationalError as exc:
                if _NOT_UTF8.match(str(exc)) is None:
                    raise
                # Text that is not UTF-8 (SQLite stores what it is given; PostgreSQL
                # refuses it) in the row or its oldest message: claim the run without
                # them, and its tick reads them itself and stops there, on that run only.
                last = cur.execute(
                    "SELECT MAX(seq) FROM events WHERE run_id = ?", (run_id,)
                ).fetchone()[0]
                read = claimed_unread(run_id, last)
            leases.append(claimed_lease(worker_id, epoch + 1, old_owner, status, read))
        if len(leases) < limit:  # queued runs of concurrency keys with room
            leases += claim_keyed(
                self,
                cur,
                dialect="sqlite",
                worker_id=worker_id,
                limit=limit - len(leases),
                now=now,
                ttl=ttl,
                only=only,
            )
        return leases

    async def migrate(self) -> None:
        def apply(cur: Cursor) -> None:
            for migration in SCHEMA:
                if not applies(migration, "sqlite"):
                    continue
                if isinstance(migration, AddColumn):
                    # SQLite has no ADD COLUMN IF NOT EXISTS: look before adding.
                    cols = {r[1] for r in cur.execute(f"PRAGMA table_info({migration.table})")}
                    if migration.column.name in cols:
                        continue
                cur.execute(render(migration, "sqlite"))

        try:
            await self._run(apply)
        except StorageError as exc:
            raise SchemaError(f"cannot apply the schema to {self.path!r}: {exc}") from exc

    async def notify(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    async def wait_for_work(self, timeout: float) -> bool:
        """Wake on an in-process signal (start_run, send_message in this process: True)
        or after ``timeout`` (the polling interval, for writers in other processes:
        False)."""
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        return await woken(self._wakeup, timeout)

    def _close_conn(self) -> None:
        if self._conn is not None:
            self._levels.pop(id(self._conn), None)
            self._conn.close()
            self._conn = None

    async def close(self) -> None:
        self._loop_cur = None
        if self._loop_conn is not None:
            self._levels.pop(id(self._loop_conn), None)
            self._loop_conn.close()
            self._loop_conn = None
        if self._thread is not None:
            self._queue.put(None)
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join)
            self._thread = None
