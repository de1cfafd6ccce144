"""The self-migrating schema: idempotent, additive only, upgrades old databases in place,
and old queries keep working on the new schema (rollback safety)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from toren.store import connect, open_store
from toren.store.schema import (
    SCHEMA,
    AddColumn,
    Column,
    CreateIndex,
    CreateTable,
    CreateVirtualTable,
    render,
)

FIXTURES = Path(__file__).parents[1] / "fixtures" / "v0_1"
FORBIDDEN = re.compile(r"\b(DROP|RENAME|TRUNCATE|DELETE|UPDATE)\b|ALTER\s+COLUMN", re.I)


def frozen_statements(dialect: str) -> list[str]:
    lines = (FIXTURES / f"first_schema.{dialect}.sql").read_text().splitlines()
    text = "\n".join(line for line in lines if not line.startswith("--"))
    return [s.strip() for s in text.split(";\n") if s.strip().rstrip(";")]


@pytest.mark.parametrize("dialect", ["sqlite", "postgres"])
def test_ddl_is_additive_only(dialect: str) -> None:
    for migration in SCHEMA:
        assert isinstance(migration, (CreateTable, AddColumn, CreateIndex, CreateVirtualTable))
        sql = render(migration, dialect)
        assert not FORBIDDEN.search(sql), f"non-additive DDL: {sql}"
        if isinstance(migration, AddColumn):
            col = migration.column
            # A NOT NULL column needs a default, or old rows would be invalid.
            assert not col.not_null or col.default is not None, sql
            assert not col.primary_key


def test_ddl_check_rejects_destructive_statements() -> None:
    """The check above can fail: these are what it exists to reject."""
    for bad in (
        "ALTER TABLE runs DROP COLUMN input",
        "ALTER TABLE runs RENAME COLUMN agent TO agent_name",
        "ALTER TABLE runs ALTER COLUMN steps TYPE TEXT",
        "DROP INDEX runs_claim",
    ):
        assert FORBIDDEN.search(bad)


def test_existing_entries_never_change() -> None:
    """The first entries are frozen: new releases append, they never edit."""
    for dialect in ("sqlite", "postgres"):
        frozen = [s.rstrip(";") for s in frozen_statements(dialect)]
        current = [render(m, dialect) for m in SCHEMA[: len(frozen)]]
        assert frozen == current


def test_column_render() -> None:
    col = Column("process", "text", not_null=True, default="'main'")
    assert col.render("postgres") == "process TEXT NOT NULL DEFAULT 'main'"
    assert render(AddColumn("runs", col), "postgres").endswith(
        "ADD COLUMN IF NOT EXISTS process TEXT NOT NULL DEFAULT 'main'"
    )


async def _columns(store: Any, table: str) -> list[tuple[str, str]]:
    if store.dialect == "sqlite":
        rows = await store._run(lambda c: c.execute(f"PRAGMA table_info({table})").fetchall())
        return sorted((r[1], r[2]) for r in rows)
    rows = await store._run(
        lambda c: c.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (table,),
        ).fetchall()
    )
    return sorted((r[0], r[1]) for r in rows)


async def test_applying_the_ddl_twice_is_a_no_op(empty_db_url: str) -> None:
    store = await connect(empty_db_url)
    try:
        before = {
            t: await _columns(store, t) for t in ("runs", "events", "blobs", "inbox", "workers")
        }
        await store.migrate()
        await store.migrate()
        after = {t: await _columns(store, t) for t in before}
        assert before == after
        assert ("process", "TEXT" if store.dialect == "sqlite" else "text") in after["runs"]  # type: ignore[attr-defined]
    finally:
        await store.close()


async def test_concurrent_starts_migrate_safely(empty_db_url: str) -> None:
    import asyncio

    stores = [open_store(empty_db_url) for _ in range(4)]
    try:
        await asyncio.gather(*(s.migrate() for s in stores))
    finally:
        for s in stores:
            await s.close()


async def test_first_schema_database_upgrades_in_place(empty_db_url: str) -> None:
    """A database created by the frozen first schema, with rows, is upgraded by a normal
    start: rows intact, new columns defaulted (every old run becomes process 'main')."""
    store = open_store(empty_db_url)
    dialect = store.dialect  # type: ignore[attr-defined]
    statements = [s.rstrip(";") for s in frozen_statements(dialect)]

    def create_old(cur: Any) -> None:
        for sql in statements:
            cur.execute(sql)
        # Queries exactly as the first release wrote them (explicit columns).
        store._x(
            cur,
            "INSERT INTO runs (id, agent, status, input, created_at, updated_at) "  # type: ignore[attr-defined]
            "VALUES (?, ?, ?, ?, ?, ?)",
            ("run_old", "legacy", "queued", '{"a":1}', 1.0, 1.0),
        )
        store._x(
            cur,
            "INSERT INTO events (run_id, stream, type, created_at, payload, slot) "  # type: ignore[attr-defined]
            "VALUES (?, ?, ?, ?, ?, ?)",
            ("run_old", "", "RunStarted", 1.0, '{"agent":"legacy","input":{"a":1}}', "run:start"),
        )

    try:
        await store._run(create_old)  # type: ignore[attr-defined]
        await store.migrate()
        run = await store.get_run("run_old")
        assert run is not None
        assert (run.agent, run.process, run.status, run.input) == (
            "legacy",
            "main",
            "queued",
            {"a": 1},
        )
        assert run.steps == 0 and run.cost_nanousd == 0 and run.waiting_for is None
        events = await store.load_events("run_old")
        assert [e.type for e in events] == ["RunStarted"]
        assert events[0].payload.process == "main"  # type: ignore[attr-defined]
    finally:
        await store.close()


async def test_old_queries_work_on_the_new_schema(db_url: str) -> None:
    """Rollback safety: the first release's explicit-column queries run unchanged against
    today's schema (new columns take their defaults)."""
    store = await connect(db_url)
    old_queries = [
        (
            "INSERT INTO runs (id, agent, status, input, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
            ("run_a", "x", "queued", "null", 1.0, 1.0),
        ),
        (
            "UPDATE runs SET lease_owner = ?, lease_epoch = lease_epoch + 1, lease_expires_at = ? "
            "WHERE id = ? AND lease_owner IS NULL",
            ("w1", 99.0, "run_a"),
        ),
        (
            "INSERT INTO events (run_id, stream, position, generation, slot, type, digest, code_version, "
            "worker_id, created_at, format_version, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                "run_a",
                "main",
                0,
                0,
                "main#0:0",
                "ValueRecorded",
                "d",
                "v",
                "w1",
                2.0,
                1,
                '{"what":"now","value":2.0}',
            ),
        ),
        (
            "INSERT INTO inbox (run_id, name, payload, created_at) VALUES (?, ?, ?, ?)",
            ("run_a", "m", "1", 3.0),
        ),
        (
            "INSERT INTO workers (id, code_version, started_at, heartbeat_at) VALUES (?, ?, ?, ?)",
            ("w1", "v", 1.0, 1.0),
        ),
        ("INSERT INTO blobs (hash, body) VALUES (?, ?)", ("h", "{}")),
    ]
    selects = [
        "SELECT id, agent, status, input, output, error, idempotency_key, created_at, updated_at, "
        "lease_owner, lease_epoch, lease_expires_at, not_before, cancel_requested FROM runs",
        "SELECT seq, run_id, stream, position, generation, slot, type, digest, code_version, "
        "worker_id, created_at, format_version, payload FROM events",
        "SELECT id, run_id, name, payload, created_at, consumed_seq FROM inbox",
        "SELECT id, code_version, started_at, heartbeat_at, draining FROM workers",
    ]

    def run_old(cur: Any) -> list[Any]:
        for sql, params in old_queries:
            store._x(cur, sql, params)  # type: ignore[attr-defined]
        return [store._x(cur, s).fetchall() for s in selects]  # type: ignore[attr-defined]

    try:
        results = await store._run(run_old)  # type: ignore[attr-defined]
        assert results[0][0][:3] == ("run_a", "x", "queued")
        assert results[1][0][6] == "ValueRecorded"
        run = await store.get_run("run_a")
        assert run is not None and run.process == "main" and run.lease_owner == "w1"
    finally:
        await store.close()


def test_queries_name_their_columns() -> None:
    """No SELECT * and no positional INSERT anywhere in the store modules."""
    src = Path(__file__).parents[2] / "src" / "toren"
    for path in src.rglob("*.py"):
        text = path.read_text()
        assert not re.search(r"SELECT\s+\*", text, re.I), path
        assert not re.search(r"INSERT\s+INTO\s+\w+\s+VALUES", text, re.I), path


async def test_starting_under_live_traffic_takes_no_locks(db_url: str) -> None:
    """Workers start (and migrate) while others write: no deadlock, no stall. On an
    up-to-date PostgreSQL database the schema check must not lock any table."""
    import asyncio

    import toren
    from toren.providers.scripted import ScriptedProvider

    store = await connect(db_url)
    reg = toren.Registry()

    async def agent(ctx: Any, input: Any) -> Any:
        for i in range(30):
            await ctx.model("scripted:echo", [{"role": "user", "content": f"{input} {i}"}])
        return input

    reg.add("busy", agent)
    deps = toren.TickDeps(store=store, agents=reg, providers={"scripted": ScriptedProvider()})
    runs = [await toren.start_run(store, reg, "busy", i) for i in range(6)]

    async def restart_storm() -> None:
        for _ in range(15):
            other = open_store(db_url)
            await other.migrate()
            await other.close()

    try:
        async with toren.LocalWorkerRuntime(deps, concurrency=6):
            await asyncio.wait_for(restart_storm(), 60)
            for run in runs:
                assert (await toren.wait_for_run(store, run.id, timeout=60)).status == "completed"
    finally:
        await store.close()
