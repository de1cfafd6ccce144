"""The suite's PostgreSQL databases are copies of a migrated template (tests/conftest.py):
a copy must be exactly what a start makes of an empty database, a changed schema must get
a template of its own, and templates nobody uses are dropped."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

import toren
from tests.conftest import (
    _TEMPLATE_LOCK,
    PG_ADMIN,
    TEMPLATE_PREFIX,
    TEMPLATE_UNUSED_FOR,
    _drop_unused_templates,
    clone_pg_database,
    create_pg_database,
    drop_pg_database,
    give_back_pg_database,
    lend_pg_database,
    pg_url,
    require_pg,
    template_name,
)
from toren.store import connect
from toren.store.schema import SCHEMA, CreateIndex


def _catalog(url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = 'public' "
            "ORDER BY table_name, column_name"
        ).fetchall()
        indexes = conn.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
            "ORDER BY indexname"
        ).fetchall()
        rows = {
            table: conn.execute(f'SELECT count(*) FROM "{table}"').fetchone()
            for (table,) in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        }
    return {"columns": columns, "indexes": indexes, "rows": rows}


async def test_a_copy_of_the_template_is_what_a_start_makes_of_an_empty_database() -> None:
    require_pg()
    fresh, copy = create_pg_database(), clone_pg_database()
    try:
        store = await connect(pg_url(fresh))
        await store.close()
        made = _catalog(pg_url(fresh))
        assert made["indexes"] and set(made["rows"]) >= {"runs", "events", "blobs", "inbox"}
        assert all(count == (0,) for count in made["rows"].values())
        assert _catalog(pg_url(copy)) == made
    finally:
        drop_pg_database(fresh)
        drop_pg_database(copy)


def test_a_changed_schema_gets_a_template_of_its_own() -> None:
    today = template_name()
    assert today.startswith(TEMPLATE_PREFIX) and len(today) <= 63
    assert template_name(SCHEMA) == today
    added = CreateIndex("runs_by_agent_x", "runs", ("agent",))
    assert template_name((*SCHEMA, added)) != today
    assert template_name(SCHEMA[1:]) != today
    # Only what PostgreSQL runs counts: an index for SQLite alone changes nothing here.
    assert template_name((*SCHEMA, CreateIndex("x", "runs", ("agent",), dialect="sqlite"))) == today


def test_templates_unused_for_a_day_are_dropped_and_others_kept() -> None:
    import psycopg
    from psycopg import sql

    require_pg()
    tag = uuid.uuid4().hex[:8]
    old, recent, unmarked = (f"{TEMPLATE_PREFIX}zz{tag}{k}" for k in "oru")
    used = {old: time.time() - TEMPLATE_UNUSED_FOR - 60, recent: time.time() - 60}
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        for name in (old, recent, unmarked):
            conn.execute(f'CREATE DATABASE "{name}"')
            conn.execute(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')
        for name, at in used.items():
            conn.execute(
                sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    sql.Identifier(name), sql.Literal(f"toren test template, used {at:.0f}")
                )
            )
        conn.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
        try:
            _drop_unused_templates(conn, keep=template_name())
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))
        left = {
            name
            for (name,) in conn.execute(
                "SELECT datname FROM pg_database WHERE datname = ANY(%s)",
                ([old, recent, unmarked, template_name()],),
            ).fetchall()
        }
        assert left == {recent, template_name()}
        conn.execute(f'ALTER DATABASE "{recent}" WITH IS_TEMPLATE false')
        conn.execute(f'DROP DATABASE "{recent}"')


async def test_a_database_given_back_is_emptied_renamed_and_lent_again_like_a_copy() -> None:
    """A test's database is given back, not dropped: the next test of the process gets it
    with no rows and its sequences restarted, under a new name, so a connection a test
    leaked points nowhere (as with a dropped database) instead of into the next test."""
    import psycopg

    require_pg()
    copy = clone_pg_database()
    first = lend_pg_database()
    try:
        store = await connect(pg_url(first))
        run = await toren.start_run(store, _agents(), "a", {"x": "y" * 5000})
        await store.close()
        leaked = await psycopg.AsyncConnection.connect(pg_url(first))  # left open
        oid = _oid(first)
        give_back_pg_database(first)
        second = lend_pg_database()
        assert second != first and _oid(second) == oid  # the same database, renamed
        with psycopg.connect(PG_ADMIN) as admin:
            names = {r[0] for r in admin.execute("SELECT datname FROM pg_database").fetchall()}
        assert first not in names and second in names
        assert leaked.closed or leaked.broken or await _refused(leaked)
        assert _catalog(pg_url(second)) == _catalog(pg_url(copy))
        for url in (pg_url(second), pg_url(copy)):  # one run in each: the same counters
            store = await connect(url)
            assert await store.get_run(run.id) is None
            await toren.start_run(store, _agents(), "a", {})
            await store.close()
        assert _sequences(pg_url(second)) == _sequences(pg_url(copy))
        give_back_pg_database(second)
    finally:
        drop_pg_database(copy)


def _oid(name: str) -> int | None:
    import psycopg

    with psycopg.connect(PG_ADMIN) as admin:
        row = admin.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return int(row[0]) if row else None


def _sequences(url: str) -> list[tuple[str, int | None]]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT sequencename, last_value FROM pg_sequences WHERE schemaname = 'public' "
            "ORDER BY sequencename"
        ).fetchall()


def _agents() -> toren.Registry:
    async def agent(ctx: Any, input: Any) -> dict[str, Any]:
        return {}

    registry = toren.Registry()
    registry.add("a", agent)
    return registry


async def _refused(conn: Any) -> bool:
    try:
        await conn.execute("SELECT 1")
    except Exception:
        return True
    return False


@pytest.mark.parametrize(
    "change",
    [
        "CREATE INDEX runs_by_test ON runs (agent)",  # the schema
        "ALTER DATABASE \"{name}\" SET work_mem = '8MB'",  # the database's settings
        "ANALYZE runs",  # planner statistics (of an empty table: its row count)
    ],
)
def test_a_database_a_test_changed_beyond_its_rows_is_dropped_not_lent_again(
    change: str,
) -> None:
    import psycopg

    require_pg()
    name = lend_pg_database()
    oid = _oid(name)
    with psycopg.connect(pg_url(name), autocommit=True) as conn:
        conn.execute(change.format(name=name))
    give_back_pg_database(name)
    lent = lend_pg_database()
    try:
        assert _oid(lent) != oid  # a new copy, not the changed database renamed
        with psycopg.connect(PG_ADMIN) as admin:
            left = admin.execute("SELECT count(*) FROM pg_database WHERE oid = %s", (oid,))
            assert left.fetchone() == (0,)  # and the changed one is gone
    finally:
        give_back_pg_database(lent)
