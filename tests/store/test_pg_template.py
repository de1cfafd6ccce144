"""The suite's PostgreSQL databases are copies of a migrated template (tests/conftest.py):
a copy must be exactly what a start makes of an empty database, a changed schema must get
a template of its own, and templates nobody uses are dropped."""

from __future__ import annotations

import time
import uuid
from typing import Any

from tests.conftest import (
    _TEMPLATE_LOCK,
    PG_ADMIN,
    TEMPLATE_PREFIX,
    TEMPLATE_UNUSED_FOR,
    _drop_unused_templates,
    clone_pg_database,
    create_pg_database,
    drop_pg_database,
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
