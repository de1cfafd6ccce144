"""PostgreSQL connections: the lanes a statement can take, and LISTEN.

:class:`Lanes` owns every connection a :class:`~toren.store.postgres.PostgresStore` opens,
which holds the SQL and its semantics and calls :meth:`Lanes.fetch` (one autocommit
statement, its rows) and :meth:`Lanes.run` (a function over a cursor, in one transaction):

- the **sync pool** and its **thread pool** (``run``, ``in_tx``): transactions of many
  statements, run off the event loop;
- the **async pool**: one statement awaited on the loop;
- the **fast lane**: one connection of the async pool kept out of it, with its cursor,
  used whenever no other statement is on it;
- the **inline lane**: one connection of its own whose statements run on the event loop's
  thread, blocking, only while :class:`~toren.store.sql.InlineGate` says the loop has
  nothing else to do, with short lock and statement timeouts;
- **LISTEN** on the work channel, one connection, for :meth:`Lanes.wait_for_work`.

:class:`TurnBatcher` gathers the writes requested in one turn of the loop (group commit).
The connection budget per worker process is in docs/storage.md#connections.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from toren.errors import StorageError
from toren.store.sql import InlineGate, loop_is_idle, woken
from toren.store.urls import shown_url, without_secrets

T = TypeVar("T")
J = TypeVar("J")
log = logging.getLogger("toren.store")
CHANNEL = "toren_work"
# The inline lane blocks the event loop while its statement runs, so it gives up on any
# wait it can: a row lock held by another transaction, a statement that runs long (both
# cancelled before the commit: the statement did nothing, and goes the loop's way), a peer
# gone silent (TCP keepalives and a user timeout end the connection within seconds).
# Every connection of a store ends a transaction left open and idle this long: a worker
# frozen (SIGSTOP, a paused VM) between two statements of a transaction would otherwise
# hold its row and advisory locks for as long as it is frozen (a key's claims, for one,
# all wait for its lock), well past its leases. The server ends its session; the worker
# meets a closed connection when it thaws, as after any database failure. Far above any
# wait of Toren's own between two statements of a transaction (none leaves the thread).
_IDLE_IN_TRANSACTION = "SET idle_in_transaction_session_timeout = '10s'"
_INLINE_SETTINGS = (
    f"SET lock_timeout = '20ms'; SET statement_timeout = '250ms'; {_IDLE_IN_TRANSACTION}"
)
_INLINE_CONNECT = {
    "autocommit": True,
    "keepalives": 1,
    "keepalives_idle": 2,
    "keepalives_interval": 1,
    "keepalives_count": 3,
    "tcp_user_timeout": 5000,  # ms
}
_INLINE_RETRY = 5.0  # s between attempts to (re)open the inline lane
_PROBE_TIMEOUT = 10  # s: the first connection's connect_timeout, unless the URL sets one
# s a statement waits for a pooled connection before it fails (StorageError). The pools
# open without waiting to be filled: psycopg_pool closes a pool for good when its
# ``open(wait=True)`` times out, and a store whose pool was closed so (the server at
# max_connections for a while, or a loop too busy to finish the connection in time under
# hundreds of concurrent requests) failed every later statement until restarted.
_POOL_TIMEOUT = 30.0


def _import_psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise StorageError(
            "PostgreSQL support needs psycopg, which is not installed: "
            "pip install 'toren-run[postgres]'",
            missing="psycopg",
            install="pip install 'toren-run[postgres]'",
        ) from exc
    return psycopg, psycopg_pool


def _configure(conn: Any) -> None:
    """A pooled connection's session settings (see ``_IDLE_IN_TRANSACTION``)."""
    conn.execute(_IDLE_IN_TRANSACTION)


async def _configure_async(conn: Any) -> None:
    await conn.execute(_IDLE_IN_TRANSACTION)


def _not_pipelined(conn: Any) -> None:
    """A pool's check of a connection given back: one left in pipeline mode (its
    pipeline's entry or exit cut short by a cancellation) is thrown away, not handed out
    again, where statements sent on it would wait for a Sync that never comes."""
    if conn.pgconn.pipeline_status != 0:
        raise StorageError("a connection was given back in pipeline mode")


async def _not_pipelined_async(conn: Any) -> None:
    _not_pipelined(conn)


async def _pipelined(
    conn: Any, statements: Sequence[tuple[str, Sequence[object]]]
) -> list[list[object]]:
    """The statements on an async autocommit connection in pipeline mode, between an
    explicit ``BEGIN`` and ``COMMIT``, all sent together with one Sync: one round trip,
    one transaction; each statement's rows. Explicit, not the pipeline's implicit
    transaction (:meth:`Lanes.try_inline_transaction`): psycopg sends the Sync whenever
    the pipeline block is left, so a cancellation (at one of its yields to a busy loop)
    or a client-side error after the first statements were queued would commit those
    alone; with a ``BEGIN`` and no ``COMMIT`` they stay an open transaction, rolled back
    when the connection goes back to its pool."""
    cursors = []
    try:
        async with conn.pipeline():
            await conn.cursor().execute("BEGIN")
            for sql, params in statements:
                cursor = conn.cursor()
                await cursor.execute(sql, params)
                cursors.append(cursor)
            await conn.cursor().execute("COMMIT")
    except Exception:
        # A statement failed (the server's error, or one psycopg raised before sending
        # it): the transaction is left open, aborted or not; rolled back here, the
        # connection is idle again and stays usable (a cancellation leaves it to the pool).
        if (
            not conn.broken
            and conn.pgconn.pipeline_status == 0
            and conn.info.transaction_status in (2, 3)
        ):  # INTRANS, INERROR
            await conn.execute("ROLLBACK")
        raise
    return [
        list(await cursor.fetchall()) if cursor.description is not None else []
        for cursor in cursors
    ]


class Lanes:
    """Every connection of one PostgreSQL store, and the lane each statement takes."""

    def __init__(self, url: str, *, pool_size: int = 16) -> None:
        self.url = url
        psycopg, psycopg_pool = _import_psycopg()
        self.psycopg = psycopg
        self.psycopg_pool = psycopg_pool
        self._pool_size = pool_size
        self._apool: Any = None
        self._lane: tuple[Any, Any] | None = None  # (connection, cursor): see _loop_way
        self._lane_free = True
        self.gate = InlineGate()
        self._inline: tuple[Any, Any] | None = None  # (connection, cursor): see _on_inline
        self._inline_opening: asyncio.Future[None] | None = None
        self._inline_retry_at = 0.0  # monotonic time before which no new attempt is made
        self._closed = False
        self._pool = psycopg_pool.ConnectionPool(
            url,
            min_size=1,
            max_size=pool_size,
            kwargs={"autocommit": True},
            configure=_configure,
            reset=_not_pipelined,
            open=False,
        )
        self._opened = False
        self._reachable = False  # see _probe
        self._executor = ThreadPoolExecutor(max_workers=pool_size, thread_name_prefix="toren-pg")
        self._listener: Any = None
        self._listen_task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self.notifications = 0  # NOTIFYs received on the work channel (wait_for_work)
        self.listening = False  # the work channel's LISTEN is in place
        self.inline_statements = 0  # statements run on the inline lane
        # Statements that gave up a wait there and took the loop, by reason.
        self.inline_deferred: collections.Counter[str] = collections.Counter()
        self.pool_timeout = _POOL_TIMEOUT

    def in_tx(self, fn: Callable[[object], T], write: bool) -> T:
        if not self._opened:
            self._pool.open(wait=False)  # see _POOL_TIMEOUT
            self._opened = True
        with self._pool.connection(timeout=self.pool_timeout) as conn:
            if not write:
                with conn.cursor() as cur:
                    return fn(cur)
            with conn.transaction(), conn.cursor() as cur:
                return fn(cur)

    def _probe(self) -> None:
        """Connect once, directly, before any pool opens. A pool retries a refused or
        rejected connection in the background, logging every attempt, until its timeout
        (30 s), and then reports only that it is incomplete; one direct attempt fails at
        once with the server's answer ("database ... does not exist", "connection
        refused")."""
        psycopg = self.psycopg
        try:
            options = psycopg.conninfo.conninfo_to_dict(self.url)
            timeout = {} if "connect_timeout" in options else {"connect_timeout": _PROBE_TIMEOUT}
            psycopg.connect(self.url, autocommit=True, **timeout).close()
        except psycopg.Error as exc:
            cause = without_secrets(" ".join(str(exc).split()), self.url)
            raise StorageError(
                f"cannot connect to PostgreSQL at {shown_url(self.url)!r}: {cause}",
                url=shown_url(self.url),
            ) from None
        self._reachable = True

    async def reach(self) -> None:
        """Probe the server the first time the store is used (see :meth:`_probe`)."""
        if not self._reachable:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._probe)

    async def run(self, fn: Callable[[object], T], *, write: bool = True) -> T:
        if not self._reachable:
            await self.reach()
        loop = asyncio.get_running_loop()
        with self._storage_errors():
            return await loop.run_in_executor(self._executor, self.in_tx, fn, write)

    async def _async_pool(self) -> None:
        """Open the async pool on first use (after the first connection's probe)."""
        if self._apool is None:
            await self.reach()
            self._apool = self.psycopg_pool.AsyncConnectionPool(
                self.url,
                min_size=1,
                max_size=self._pool_size,
                kwargs={"autocommit": True},
                configure=_configure_async,
                reset=_not_pipelined_async,
                open=False,
            )
            await self._apool.open(wait=False)  # see _POOL_TIMEOUT

    async def fetch(
        self, sql: str, params: Sequence[object], *, rows: bool = True, inline_ok: bool = True
    ) -> list[object]:
        """One autocommit statement (psycopg's ``%s`` placeholders); all its rows. On the
        inline lane when the gate is open (unless ``inline_ok`` is False: a read of
        unbounded size), else on the fast lane or an async connection."""
        await self._async_pool()
        with self._storage_errors():
            done = self.try_inline(sql, params, rows) if inline_ok else None
        if done is not None:
            return done

        async def statement(conn: Any, cur: Any) -> list[object]:
            await cur.execute(sql, params)
            return list(await cur.fetchall()) if rows else []

        return await self._loop_way(statement)

    @contextlib.contextmanager
    def _storage_errors(self) -> Iterator[None]:
        """psycopg's errors as ``StorageError`` (a unique violation as it is: the store
        tells a conflict from it)."""
        try:
            yield
        except self.psycopg.errors.UniqueViolation:
            raise
        except self.psycopg.Error as exc:
            raise StorageError(f"PostgreSQL error: {exc}") from exc

    async def _loop_way(self, work: Callable[[Any, Any], Awaitable[T]]) -> T:
        """``work(connection, cursor)`` awaited on the loop: on the fast lane when no
        other statement is on it, else on a connection of the async pool. A fast-lane
        connection that fails goes back to the pool (which checks it and replaces it if
        broken) unless it is idle again: outside a transaction, out of pipeline mode."""
        with self._storage_errors():
            try:
                if not (self._lane_free and self._pool_size > 1):
                    async with self._apool.connection(timeout=self.pool_timeout) as conn:
                        return await work(conn, conn.cursor())
                self._lane_free = False
                try:
                    if self._lane is None:
                        conn = await self._apool.getconn(timeout=self.pool_timeout)
                        self._lane = (conn, conn.cursor())
                    conn, cur = self._lane
                    try:
                        return await work(conn, cur)
                    except BaseException:  # an error, or a cancellation mid-statement
                        if (
                            conn.broken
                            or conn.info.transaction_status != 0  # not IDLE
                            or conn.pgconn.pipeline_status != 0  # still in pipeline mode
                        ):
                            self._lane = None
                            await self._apool.putconn(conn)
                        raise
                finally:
                    self._lane_free = True
            finally:
                self.gate.turned()  # that wait was a turn of the loop

    def try_inline(
        self, sql: str, params: Sequence[object], rows: bool = True, *, turn: bool = False
    ) -> list[object] | None:
        """The statement's rows if it ran on the inline lane; None if it must go the loop's
        way: the gate is closed, the lane not open yet, or the statement gave up on a wait
        it could not bound (then it did nothing). ``turn``: the caller is a turn of the
        loop of its own (a scheduled flush), which needs no gate."""
        if not self._inline_ready() or (
            not turn and not self.gate.open(asyncio.get_running_loop())
        ):
            return None
        return self._bounded(lambda: self._on_inline(sql, params, rows))

    def _bounded(self, run: Callable[[], T]) -> T | None:
        """``run()`` on the inline lane, or None if it gave up on a wait the lane bounds
        (its lock or statement timeout): the caller then goes the loop's way."""
        errors = self.psycopg.errors
        try:
            return run()
        except errors.LockNotAvailable:
            self.inline_deferred["lock_timeout"] += 1
            return None
        except errors.QueryCanceled:
            self.inline_deferred["statement_timeout"] += 1
            return None

    def _inline_ready(self) -> bool:
        """The inline lane is open; if not, it is being opened (or will be, once its
        retry time has come)."""
        if self._inline is not None:
            return True
        if (
            self._inline_opening is None
            and not self._closed
            and time.monotonic() >= self._inline_retry_at
        ):
            self._inline_opening = asyncio.ensure_future(self._open_inline())
        return False

    def try_inline_transaction(
        self, statements: Sequence[tuple[str, Sequence[object]]]
    ) -> list[list[object]] | None:
        """Each statement's rows, the statements run in order in one transaction on the
        inline lane and sent together (psycopg's pipeline mode: one round trip for all of
        them; each statement still takes its own snapshot, as READ COMMITTED gives it);
        None when they must go the loop's way, as for :meth:`try_inline` (nothing was
        committed then: a statement that gave up on a wait aborts the transaction).

        The transaction is the pipeline's own: on the lane's autocommit connection, what
        is sent before a Sync runs as one implicit transaction, committed at the Sync if
        every statement succeeded and rolled back whole if one failed (the protocol's
        pipelining rule). No ``BEGIN`` and ``COMMIT`` around it: two statements fewer
        to send and to read back."""
        if not self._inline_ready() or not self.gate.open(asyncio.get_running_loop()):
            return None
        return self._bounded(lambda: self._on_inline_transaction(statements))

    def _on_inline_transaction(
        self, statements: Sequence[tuple[str, Sequence[object]]]
    ) -> list[list[object]]:
        conn, _ = self._inline  # type: ignore[misc]
        try:
            with conn.pipeline():  # one Sync, at its end: one implicit transaction
                cursors = []
                for sql, params in statements:
                    cursor = conn.cursor()
                    cursor.execute(sql, params)
                    cursors.append(cursor)
            self.inline_statements += len(statements)
            return [
                list(cursor.fetchall()) if cursor.description is not None else []
                for cursor in cursors
            ]
        except BaseException:
            self._drop_broken_inline(conn)
            raise

    async def transaction(
        self, statements: Sequence[tuple[str, Sequence[object]]]
    ) -> list[list[object]]:
        """Each statement's rows, the statements run in order in one transaction, sent
        together (:func:`_pipelined`): :meth:`try_inline_transaction` the loop's way
        (:meth:`_loop_way`), awaited. One round trip, as inline; a transaction of a
        function over a cursor (:meth:`run`) would take a thread hand-off and a round
        trip per statement. All or nothing also when the caller is cancelled midway."""
        await self._async_pool()
        return await self._loop_way(lambda conn, cur: _pipelined(conn, statements))

    def _on_inline(self, sql: str, params: Sequence[object], rows: bool) -> list[object]:
        """The inline lane: one statement on a connection of its own, run on the event
        loop's thread and waited for there, blocking. Only when the loop has nothing else
        to do (see :class:`InlineGate`): a lone run's step then pays neither the loop's
        wake-ups nor the async driver's bookkeeping (about half of psycopg's client time
        per statement). A broken connection is dropped, and opened again later."""
        conn, cur = self._inline  # type: ignore[misc]
        try:
            cur.execute(sql, params)
            self.inline_statements += 1
            return cur.fetchall() if rows else []
        except BaseException:
            self._drop_broken_inline(conn)
            raise

    def _drop_broken_inline(self, conn: Any) -> None:
        """A broken inline connection is dropped, and opened again later."""
        if conn.broken:
            self._inline = None
            self._inline_opening = None
            with contextlib.suppress(Exception):
                conn.close()

    async def _open_inline(self) -> None:
        """Connect the inline lane off the loop (connecting takes milliseconds); until it
        is ready, statements take the loop's way. A failed attempt is retried a few
        seconds later. A server that waits for synchronous standbys at commit gets no
        inline lane: that wait has no bound the lane could set."""

        def connect() -> Any:
            conn = self.psycopg.connect(self.url, **_INLINE_CONNECT)
            try:
                conn.execute(_INLINE_SETTINGS)
                standbys = conn.execute("SHOW synchronous_standby_names").fetchone()[0]
                if standbys:
                    conn.close()
                    return None
            except BaseException:
                conn.close()
                raise
            return conn

        try:
            conn = await asyncio.get_running_loop().run_in_executor(self._executor, connect)
        except Exception as exc:
            log.warning("no inline PostgreSQL connection yet (%s); retrying later", exc)
            self._inline_retry_at = time.monotonic() + _INLINE_RETRY
            self._inline_opening = None
            return
        if conn is None:
            return  # synchronous standbys: _inline_opening stays set, never tried again
        if self._closed:
            conn.close()
            return
        self._inline = (conn, conn.cursor())

    async def _listen(self) -> None:
        psycopg = self.psycopg
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                self._listener = conn
                await conn.execute(f"LISTEN {CHANNEL}")
                # What was signalled before this LISTEN (the worker's first claim came
                # earlier; a reconnect missed everything in between) is looked for now.
                self.listening = True
                if self._wakeup is not None:
                    self._wakeup.set()
                async for _ in conn.notifies():
                    self.notifications += 1
                    if self._wakeup is not None:
                        self._wakeup.set()
            except asyncio.CancelledError:
                raise
            except Exception:
                self.listening = False
                await asyncio.sleep(1.0)  # the database restarted: listen again

    async def wait_for_work(self, timeout: float) -> bool:
        """Wait for a NOTIFY on the work channel (True) or ``timeout`` seconds (False)."""
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        if self._listen_task is None:
            self._listen_task = asyncio.create_task(self._listen())
        return await woken(self._wakeup, timeout)

    async def close(self) -> None:
        self._closed = True
        if self._listen_task is not None:
            self._listen_task.cancel()
            with contextlib.suppress(BaseException):
                await self._listen_task
        if self._listener is not None:
            with contextlib.suppress(Exception):
                await self._listener.close()
        if self._inline_opening is not None:
            with contextlib.suppress(BaseException):
                await self._inline_opening
        if self._inline is not None:
            with contextlib.suppress(Exception):
                self._inline[0].close()
            self._inline = None
        if self._apool is not None:
            if self._lane is not None:
                await self._apool.putconn(self._lane[0])
                self._lane = None
            await self._apool.close()
        loop = asyncio.get_running_loop()
        if self._opened:
            await loop.run_in_executor(self._executor, self._pool.close)
        self._executor.shutdown(wait=True)


class TurnBatcher(Generic[J]):
    """Writes requested in the same turn of the event loop, handed over together (group
    commit): at the end of the turn, a lone write to ``inline`` (which commits it there and
    says True, or says False), else the batch to ``many`` in a task of its own."""

    def __init__(
        self,
        lanes: Lanes,
        inline: Callable[[J], bool],
        many: Callable[[list[J]], Awaitable[None]],
    ) -> None:
        self._lanes = lanes
        self._inline = inline
        self._many = many
        self._batch: list[J] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def empty(self) -> bool:
        return not self._batch

    def add(self, job: J) -> None:
        self._batch.append(job)
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._lanes.gate.turned()
        batch, self._batch = self._batch, []
        alone = len(batch) == 1 and loop_is_idle(asyncio.get_running_loop())
        if alone and self._inline(batch[0]):
            return
        task = asyncio.ensure_future(self._many(batch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
