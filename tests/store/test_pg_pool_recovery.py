"""PostgreSQL: a store whose pools cannot connect for a while fails those statements, and
works again once the server lets it in (issue 34: under 200 concurrent event reads the
async pool's first fill timed out, psycopg_pool closed it for good, and every later read
of that API process failed: 500s, and event pages cut mid-body)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from toren.errors import StorageError
from toren.store import open_store


@pytest.fixture
def role_url(pg_only_url: str) -> Iterator[tuple[str, psycopg.Connection[Any]]]:
    """A URL of ``pg_only_url``'s database as a role of its own, and an admin connection
    that can refuse and allow that role's logins."""
    role = f"toren_pool_{uuid.uuid4().hex[:10]}"
    admin = psycopg.connect(pg_only_url, autocommit=True)
    admin.execute(f'CREATE ROLE "{role}" LOGIN')
    admin.execute(f'GRANT SELECT ON ALL TABLES IN SCHEMA public TO "{role}"')
    scheme, _, rest = pg_only_url.partition("://")
    host = rest.split("@", 1)[-1]
    try:
        yield f"{scheme}://{role}@{host}", admin
    finally:
        admin.execute(f'ALTER ROLE "{role}" LOGIN')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        admin.execute(f'DROP OWNED BY "{role}"')
        admin.execute(f'DROP ROLE "{role}"')
        admin.close()


async def test_pools_recover_after_the_server_refused_them(
    role_url: tuple[str, psycopg.Connection[Any]],
) -> None:
    url, admin = role_url
    store: Any = open_store(url)
    try:
        await store.lanes.reach()  # the start's probe got in
        store.lanes.pool_timeout = 0.5  # how long a statement waits for a connection
        admin.execute(f'ALTER ROLE "{url.split("://")[1].split("@")[0]}" NOLOGIN')

        def one(cur: Any) -> int:
            return int(cur.execute("SELECT 1").fetchone()[0])

        # Neither pool can connect: the statements fail, the pools keep trying.
        with pytest.raises(StorageError):
            await store.get_run("run_missing")  # the async pool
        with pytest.raises(StorageError):
            await store._run(one, write=False)  # the sync pool
        admin.execute(f'ALTER ROLE "{url.split("://")[1].split("@")[0]}" LOGIN')
        store.lanes.pool_timeout = 60.0  # long enough for the pools' next attempt
        assert await store.get_run("run_missing") is None
        assert await store._run(one, write=False) == 1
    finally:
        await store.close()
