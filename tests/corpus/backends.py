"""Fresh, empty databases for corpus runs: a new SQLite file, or a PostgreSQL database
copied from a migrated template (``CREATE DATABASE ... TEMPLATE``: tens of milliseconds,
where creating and migrating one takes half a second)."""

from __future__ import annotations

import asyncio
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
        self.prefix = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self.template: str | None = None
        self.count = 0

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(sql)

    def _template(self) -> str:
        if self.template is None:
            name = f"{self.prefix}_tpl"
            self._admin(f'CREATE DATABASE "{name}"')
            self.template = name

            _migrate_in_thread(name)  # callable with or without a running event loop
        return self.template

    @contextmanager
    def fresh(self, backend: str) -> Iterator[str]:
        self.count += 1
        if backend == "sqlite":
            path = self.tmp / f"corpus-{self.count}.db"
            yield f"sqlite:///{path}"
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)
            return
        name = f"{self.prefix}_{self.count}"
        self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self._template()}"')
        # No wait for the disk on each commit: what is committed is the same, only faster
        # (a crash of the test's PostgreSQL server is not what the corpus is about).
        self._admin(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
        try:
            yield pg_url(name)
        finally:
            self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def close(self) -> None:
        if self.template is not None:
            self._admin(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)')
            self.template = None


def _migrate_in_thread(name: str) -> None:
    import threading

    async def migrate() -> None:
        store = await connect(pg_url(name))
        await store.close()

    thread = threading.Thread(target=lambda: asyncio.run(migrate()))
    thread.start()
    thread.join()
