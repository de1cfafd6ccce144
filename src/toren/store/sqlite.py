"""SQLite store: the embedded default (standard library ``sqlite3``, WAL).

One connection, used from one dedicated thread, so every statement is serialised and the
event loop never blocks on a commit. Several processes may share the file (the CLI and a
worker): writes take ``BEGIN IMMEDIATE`` and wait on the busy timeout. Durability:
``synchronous=FULL`` by default (a committed step survives power loss);
``?synchronous=normal`` in the URL trades that for speed (still safe against a killed
process).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

from toren.errors import SchemaError, StorageError
from toren.store.base import Lease
from toren.store.schema import SCHEMA, AddColumn, render
from toren.store.sql import CLAIMABLE, SqlStore

T = TypeVar("T")
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


class SQLiteStore(SqlStore):
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
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toren-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._wakeup: asyncio.Event | None = None

    def _connect(self) -> sqlite3.Connection:
        if self._conn is None:
            if self.path != ":memory:":
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
            conn.execute("PRAGMA busy_timeout=30000")
            conn.execute("PRAGMA foreign_keys=OFF")
            self._conn = conn
        return self._conn

    def _in_tx(self, fn: Callable[[Any], T], write: bool) -> T:
        conn = self._connect()
        cur = conn.cursor()
        cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            result = fn(cur)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        return result

    async def _run(self, fn: Callable[[Any], T], *, write: bool = True) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._in_tx, fn, write)
        except sqlite3.IntegrityError:
            raise
        except sqlite3.Error as exc:
            raise StorageError(f"SQLite error on {self.path!r}: {exc}") from exc

    def _is_conflict(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in str(exc)

    def _claim(
        self, cur: Any, worker_id: str, limit: int, now: float, ttl: float, only: str | None
    ) -> list[Lease]:
        only_sql, only_params = ("AND id = ? ", (only,)) if only else ("", ())
        rows = cur.execute(
            f"SELECT id, lease_owner, lease_epoch, status FROM runs WHERE {CLAIMABLE} "
            f"{only_sql}ORDER BY COALESCE(not_before, created_at) LIMIT ?",
            (now, now, now, *only_params, limit),
        ).fetchall()
        leases = []
        for run_id, old_owner, epoch, status in rows:
            recovered = old_owner is not None
            cur.execute(
                "UPDATE runs SET lease_owner = ?, lease_epoch = ?, lease_expires_at = ?, "
                "status = CASE WHEN status = 'waiting' THEN 'running' ELSE status END, "
                "lease_recoveries = lease_recoveries + ? WHERE id = ?",
                (worker_id, epoch + 1, now + ttl, int(recovered), run_id),
            )
            leases.append(Lease(run_id, worker_id, epoch + 1, recovered, status))
        return leases

    async def migrate(self) -> None:
        def apply(cur: Any) -> None:
            for migration in SCHEMA:
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

    async def wait_for_work(self, timeout: float) -> None:
        """Wake on an in-process signal (start_run, send_message in this process) or
        after ``timeout`` (the polling interval, for writers in other processes)."""
        if self._wakeup is None:
            self._wakeup = asyncio.Event()
        try:
            await asyncio.wait_for(self._wakeup.wait(), timeout)
        except TimeoutError:
            pass
        self._wakeup.clear()

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        await asyncio.get_running_loop().run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=True)
