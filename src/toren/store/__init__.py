"""Storage: SQLite (embedded default) and PostgreSQL behind one interface, by URL."""

from __future__ import annotations

from toren.errors import StorageError
from toren.store.base import (
    Backend,
    Lease,
    Release,
    RetentionStore,
    RunDelta,
    RunRecord,
    Store,
    WorkerInfo,
)
from toren.store.urls import shown_url

DEFAULT_URL = "sqlite:///.toren/toren.db"


def open_store(url: str) -> Backend:
    """The store for ``url`` (``sqlite:///path`` or ``postgresql://...``), not yet migrated."""
    if url.startswith("sqlite:"):
        from toren.store.sqlite import SQLiteStore

        return SQLiteStore(url)
    if url.startswith(("postgresql://", "postgres://")):
        from toren.store.postgres import PostgresStore

        return PostgresStore(url)
    raise StorageError(
        f"unsupported database URL {shown_url(url)!r}; expected sqlite:///path.db "
        "or postgresql://user@host/db"
    )


async def connect(url: str) -> Backend:
    """Open and migrate: every start applies the schema (there is no migration step)."""
    store = open_store(url)
    await store.migrate()
    return store


__all__ = [
    "DEFAULT_URL",
    "Backend",
    "Lease",
    "Release",
    "RetentionStore",
    "RunDelta",
    "RunRecord",
    "Store",
    "WorkerInfo",
    "connect",
    "open_store",
]
