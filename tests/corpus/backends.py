"""Empty databases for corpus runs: a new SQLite file each time, or one PostgreSQL
database per session emptied between runs (every table empty and every sequence back at
1, as in a new database; creating and dropping a database per scenario took most of the
corpus's time)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toren.store import connect

from ..conftest import PG_ADMIN, pg_url

BACKENDS = ("sqlite", "postgres")


class FreshDatabases:
    def __init__(self, tmp: Path, prefix: str = "c_corpus") -> None:
        self.tmp = tmp
        self.pg_name = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.pg_made = False
        self.count = 0

    @contextmanager
    def fresh(self, backend: str) -> Iterator[str]:
        """The URL of an empty, migrated database (its store is the caller's to open)."""
        self.count += 1
        if backend == "sqlite":
            path = self.tmp / f"corpus-{self.count}.db"
            yield f"sqlite:///{path}"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            return
        url = pg_url(self.pg_name)
        if not self.pg_made:
            _admin(PG_ADMIN, f'CREATE DATABASE "{self.pg_name}"')
            # No wait for the disk on each commit: what is committed is the same, sooner
            # (a crash of the test's PostgreSQL server is not what the corpus is about).
            _admin(PG_ADMIN, f'ALTER DATABASE "{self.pg_name}" SET synchronous_commit = off')
            self.pg_made = True
            _migrate_in_thread(url)  # callable with or without a running event loop
        else:
            _admin(url, _TRUNCATE)
        yield url

    def close(self) -> None:
        if self.pg_made:
            _admin(PG_ADMIN, f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')
            self.pg_made = False


# Every table of the schema emptied and every sequence restarted, whatever a later release
# adds to it. DELETE, not TRUNCATE: on tables this small it is ten times quicker (TRUNCATE
# makes new files for every table and index).
_TRUNCATE = """
DO $$ DECLARE r record;
BEGIN
  FOR r IN SELECT tablename FROM pg_tables WHERE schemaname = current_schema() LOOP
    EXECUTE format('DELETE FROM %I', r.tablename);
  END LOOP;
  FOR r IN SELECT sequencename FROM pg_sequences WHERE schemaname = current_schema() LOOP
    EXECUTE format('ALTER SEQUENCE %I RESTART', r.sequencename);
  END LOOP;
END $$;
"""


def _admin(url: str, sql: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql)


def _migrate_in_thread(url: str) -> None:
    async def migrate() -> None:
        store = await connect(url)
        await store.close()

    thread = threading.Thread(target=lambda: asyncio.run(migrate()))
    thread.start()
    thread.join()
