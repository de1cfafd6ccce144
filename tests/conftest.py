"""Shared fixtures. Every store test runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``TOREN_TEST_PG`` (default: the local server at 127.0.0.1:5432,
user postgres). When it is unreachable the PostgreSQL half is skipped, except under
``CI=true``, where a missing PostgreSQL is a failure.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from toren.store import Store, connect

PG_ADMIN = os.environ.get("TOREN_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


def _pg_available() -> str | None:
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return None
    except Exception as exc:
        return f"PostgreSQL not reachable at {PG_ADMIN}: {exc}"


_PG_PROBLEM = _pg_available()


def pg_url(dbname: str) -> str:
    base, _, _ = PG_ADMIN.rpartition("/")
    return f"{base}/{dbname}"


def create_pg_database(prefix: str = "toren_t") -> str:
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return name


def drop_pg_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def require_pg() -> None:
    if _PG_PROBLEM:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true requires PostgreSQL: {_PG_PROBLEM}")
        pytest.skip(_PG_PROBLEM)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, empty database URL on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/toren.db"
        return
    require_pg()
    name = create_pg_database()
    try:
        yield pg_url(name)
    finally:
        drop_pg_database(name)


@contextlib.asynccontextmanager
async def opened_store(url: str) -> AsyncIterator[Store]:
    """A store on ``url``, closed afterwards (the ``store`` fixtures' body)."""
    s = await connect(url)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[Store]:
    async with opened_store(db_url) as s:
        yield s
