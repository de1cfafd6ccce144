"""Shared fixtures. Every store test runs on SQLite and on PostgreSQL.

PostgreSQL comes from ``TOREN_TEST_PG`` (default: the local server at 127.0.0.1:5432,
user postgres). When it is unreachable the PostgreSQL half is skipped, except under
``CI=true``, where a missing PostgreSQL is a failure.

A PostgreSQL test database is a copy of a migrated template (``CREATE DATABASE ...
TEMPLATE``), not a new database migrated again for each test: the copy is a file copy on
the server, where the migration is some fifty DDL transactions, each with its own commit.
The template is named after a hash of the schema's DDL, so a changed schema gets a new one;
it is made once per machine and schema by whichever test process gets there first (the
others wait on an advisory lock), and no session ever connects to it (``ALLOW_CONNECTIONS
false``), since a copy fails while anyone is connected to its source. Tests that need an
empty database (the schema's own tests, the 0.1 fixtures) take ``empty_db_url`` or
``create_pg_database``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from toren.store import Store, connect
from toren.store.schema import SCHEMA, Migration, applies, render

if TYPE_CHECKING:
    import psycopg

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


def clone_pg_database(prefix: str = "toren_t") -> str:
    """A new database holding today's schema and no rows: a copy of the template."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{pg_template()}"')
    return name


TEMPLATE_PREFIX = "toren_tmpl_"
# The advisory lock (on the admin database) under which a template is made or dropped.
_TEMPLATE_LOCK = 0x746F72656E5F74  # "toren_t"
# A template of another schema (another branch, an older checkout) that no test session
# has used for this long is dropped; a session in progress touches its own at its start.
TEMPLATE_UNUSED_FOR = 24 * 3600
_template: str | None = None


def template_name(schema: tuple[Migration, ...] = SCHEMA) -> str:
    """The template's name: a hash of the PostgreSQL DDL, in order."""
    ddl = "\n".join(render(m, "postgres") for m in schema if applies(m, "postgres"))
    return TEMPLATE_PREFIX + hashlib.sha256(ddl.encode()).hexdigest()[:16]


def pg_template() -> str:
    """The migrated template of this schema, made by the first test process that needs it."""
    global _template
    if _template is None:
        _template = _ensure_template(template_name())
    return _template


def _ensure_template(name: str) -> str:
    import psycopg
    from psycopg import sql

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
        try:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                _make_template(conn, name)
            # The last use, read by the clean-up below (of other schemas' templates).
            conn.execute(
                sql.SQL("COMMENT ON DATABASE {} IS {}").format(
                    sql.Identifier(name),
                    sql.Literal(f"toren test template, used {time.time():.0f}"),
                )
            )
            _drop_unused_templates(conn, keep=name)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))
    return name


def _make_template(conn: psycopg.Connection[Any], name: str) -> None:
    """Migrate a scratch database with the store's own ``migrate`` (so the template is
    exactly what ``connect`` makes), then publish it under its name in one rename: a
    session killed half-way leaves only a scratch database, dropped by the next."""
    building = f"{name}_b"
    run = conn.execute
    run(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
    run(f'CREATE DATABASE "{building}"')

    async def migrate() -> None:
        store = await connect(pg_url(building))
        await store.close()

    # A thread of its own: this may be called from a test already inside an event loop.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, migrate()).result()
    run(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
    run(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')


def _drop_unused_templates(conn: psycopg.Connection[Any], keep: str) -> None:
    rows = conn.execute(
        "SELECT datname, coalesce(shobj_description(oid, 'pg_database'), '') FROM pg_database "
        "WHERE starts_with(datname, %s) AND datname <> %s",
        (TEMPLATE_PREFIX, keep),
    ).fetchall()
    for other, comment in rows:
        _, _, used = comment.rpartition("used ")
        # No mark: a scratch database or one whose session died before marking it (both
        # are made and marked under the lock this session holds, so neither is in use).
        if used.isdigit() and time.time() - int(used) < TEMPLATE_UNUSED_FOR:
            continue
        conn.execute(f'ALTER DATABASE "{other}" WITH IS_TEMPLATE false')
        conn.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')


def drop_pg_database(name: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# A test's PostgreSQL database is given back, not dropped, when nothing but rows changed:
# emptied and renamed, the next test of this process takes it (tests/store/
# test_pg_template.py). A copy and a drop cost PostgreSQL ~0.25 s of CPU each time (it
# WAL-logs the template's ~8 MB, catalogs included), some 700 times a suite; emptying
# costs a few milliseconds. The rename makes the old URL point nowhere, so a connection
# a test leaked (a pool, a worker process) fails as it did against a dropped database,
# instead of writing into the next test's rows.
_pool: list[str] = []
_template_shape: str | None = None
REUSE_MAX_BYTES = 48 * 1024 * 1024  # a database grown past this is dropped, not emptied

# What a test could change beyond rows, as one hash: relations and their columns (dropped
# ones included), defaults, indexes, constraints, functions, triggers, extensions,
# schemas, the database's own settings. A database whose hash differs from a fresh copy's
# is dropped.
_SHAPE = """
SELECT md5(string_agg(x, '|' ORDER BY x)) FROM (
  SELECT 'c:' || n.nspname || '.' || c.relname || ':' || c.relkind::text || ':'
         || coalesce(a.attname, '') || ':' || coalesce(format_type(a.atttypid, a.atttypmod), '')
         || ':' || coalesce(a.attnotnull::text, '') || ':' || coalesce(a.attisdropped::text, '')
         || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '') AS x
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
  LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
  WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  UNION ALL SELECT 'i:' || pg_get_indexdef(i.indexrelid) FROM pg_index i
    JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
  UNION ALL SELECT 'k:' || conname || ':' || pg_get_constraintdef(oid) FROM pg_constraint
    WHERE connamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL SELECT 'f:' || oid::regprocedure::text FROM pg_proc
    WHERE pronamespace NOT IN ('pg_catalog'::regnamespace, 'information_schema'::regnamespace)
  UNION ALL SELECT 't:' || tgname FROM pg_trigger WHERE NOT tgisinternal
  UNION ALL SELECT 'x:' || extname || ':' || extversion FROM pg_extension
  UNION ALL SELECT 'n:' || nspname FROM pg_namespace
  UNION ALL SELECT 's:' || array_to_string(setconfig, ',') FROM pg_db_role_setting
    WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
) shape
"""


def lend_pg_database() -> str:
    """A copy of the migrated template with no rows: one a test of this process gave
    back, or a new copy."""
    global _template_shape
    if _pool:
        return _pool.pop()
    name = clone_pg_database()
    if _template_shape is None:
        _template_shape = _shape_of(name)
    return name


def give_back_pg_database(name: str) -> None:
    """Empty ``name`` and keep it, under a new name, for the next test; drop it instead
    when its schema, settings or statistics differ from a fresh copy's, it grew large,
    or anything fails."""
    try:
        fresh = _emptied(name)
    except Exception:
        fresh = None
    if fresh is None:
        drop_pg_database(name)  # a no-op when it was renamed (and then dropped) already
    else:
        _pool.append(fresh)


def _shape_of(name: str) -> str:
    import psycopg

    with psycopg.connect(pg_url(name), autocommit=True) as conn:
        row = conn.execute(_SHAPE).fetchone()
    assert row is not None
    return str(row[0])


def _emptied(name: str) -> str | None:
    import psycopg

    fresh = f"toren_t_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        # Closed to new connections first, so that nothing a test left behind (a pool, a
        # worker process) reconnects between the emptying and the rename; then whatever
        # is still connected is ended, and the rename makes the old URL point nowhere.
        admin.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (name,),
        )
        deadline = time.monotonic() + 5
        while admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
        ).fetchone() != (0,):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.01)
        admin.execute(f'ALTER DATABASE "{name}" RENAME TO "{fresh}"')
        admin.execute(f'ALTER DATABASE "{fresh}" WITH ALLOW_CONNECTIONS true')
    try:
        return _emptied_as(fresh)
    except Exception:
        return _dropped(fresh)


def _emptied_as(fresh: str) -> str | None:
    import psycopg

    with psycopg.connect(pg_url(fresh), autocommit=True) as conn:
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
        if size is None or size[0] > REUSE_MAX_BYTES:
            return _dropped(fresh)
        shape = conn.execute(_SHAPE).fetchone()
        if shape is None or shape[0] != _template_shape:
            return _dropped(fresh)
        relations = conn.execute(
            "SELECT c.relname, c.relkind, pg_relation_size(c.oid) > 0 FROM pg_class c "
            "WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'S')"
        ).fetchall()
        with conn.transaction():
            for relname, kind, written in relations:
                if kind == "S":
                    conn.execute(f'ALTER SEQUENCE "{relname}" RESTART')
                elif written:
                    # A new, empty file, as the copy had: no dead rows, no page counts.
                    conn.execute(f'TRUNCATE "{relname}"')
            # Analyzed (autovacuum, after many rows) or counted as a table of rows: a
            # planner test in the next test would plan with this one's statistics.
            seen = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM pg_statistic s JOIN pg_class c "
                "ON c.oid = s.starelid WHERE c.relnamespace = 'public'::regnamespace) OR "
                "EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = 'public'::regnamespace "
                "AND relkind = 'r' AND (reltuples <> -1 OR relpages <> 0))"
            ).fetchone()
        if seen is None or seen[0]:
            return _dropped(fresh)
        # The activity counters autovacuum decides by start again from zero, as a copy's.
        conn.execute("SELECT pg_stat_reset()")
    return fresh


def _dropped(name: str) -> None:
    drop_pg_database(name)
    return None


def drop_lent_pg_databases() -> None:
    while _pool:
        drop_pg_database(_pool.pop())


def require_pg() -> None:
    if _PG_PROBLEM:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true requires PostgreSQL: {_PG_PROBLEM}")
        pytest.skip(_PG_PROBLEM)


# PostgreSQL connections one test process may use at its peak (its stores, the servers
# and worker subprocesses its tests start): four processes overflowed the default 100.
PG_CONNECTIONS_PER_PROCESS = 60


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two processes per core (from 2 to 8), as PostgreSQL's
    ``max_connections`` allows. Many tests spend most of their time waiting (on leases,
    worker subprocesses, a browser, Docker), so one process per core leaves the cores idle
    while both wait. At PostgreSQL's default of 100 connections that is 2 processes;
    ``.ci/run`` raises it to 300. ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    wanted = min(8, max(2, 2 * (os.cpu_count() or 1)))
    try:
        import psycopg

        with psycopg.connect(PG_ADMIN, connect_timeout=3) as conn:
            row = conn.execute("SHOW max_connections").fetchone()
        allowed = int(row[0]) // PG_CONNECTIONS_PER_PROCESS if row else 2
    except Exception:
        allowed = wanted  # no PostgreSQL: its tests skip (or fail under CI=true) anyway
    return max(2, min(wanted, allowed))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The databases this process kept for reuse are dropped with it."""
    with contextlib.suppress(Exception):
        drop_lent_pg_databases()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests marked ``slow`` first, the others after them in their order: the longest
    first, so pytest-xdist's workers (which take tests in this order, a group as one unit)
    start the minute-long ones while the many short ones are still to come and fill in
    around them, instead of one worker starting a minute-long test at the end while the
    other has nothing left to do."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(autouse=True)
def _output_as_into_a_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI sizes its output to ``COLUMNS`` when it is set, and to whole lines in a pipe
    otherwise (toren.cli._common). pytest-xdist's workers run with ``COLUMNS=80`` and
    ``LINES=24`` in their environment: without this, a table would wrap under xdist and not
    in one process. A test that wants a width sets it."""
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("LINES", raising=False)


@pytest.fixture
def pg_only_url() -> Iterator[str]:
    """A PostgreSQL database of its own (a copy of the migrated template), for the tests
    that need PostgreSQL itself: fleets of worker processes, advisory locks."""
    require_pg()
    name = lend_pg_database()
    try:
        yield pg_url(name)
    finally:
        give_back_pg_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database URL on each backend, with no rows: on SQLite a new file, which
    the first ``connect`` migrates; on PostgreSQL a copy of the migrated template."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/toren.db"
        return
    require_pg()
    name = lend_pg_database()
    try:
        yield pg_url(name)
    finally:
        give_back_pg_database(name)


@pytest.fixture(params=["sqlite", "postgres"])
def empty_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database URL on each backend with no schema at all: for the tests of the
    migration itself."""
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
