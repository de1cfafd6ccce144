"""The self-migrating schema: one ordered list of additive, idempotent DDL, as data.

There is no migration tool and no migration step. Every worker and API start applies
:data:`SCHEMA` in order. Each entry is idempotent (``IF NOT EXISTS``; on SQLite, which has
no ``ADD COLUMN IF NOT EXISTS``, the column list is checked first) and additive: a new
column carries a default that makes old rows valid. Nothing is ever dropped, renamed or
retyped below a major; ``tests/store/test_schema.py`` rejects such entries.

To change the schema in a minor: APPEND entries (never edit or reorder existing ones).
Rollbacks are safe because every query names its columns, so an older release ignores
columns it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass

# Portable column types and their spelling per dialect.
TYPES = {
    "text": ("TEXT", "TEXT"),
    "int": ("INTEGER", "BIGINT"),
    "real": ("REAL", "DOUBLE PRECISION"),
    "serial": ("INTEGER PRIMARY KEY", "BIGSERIAL PRIMARY KEY"),
    "tsvector": ("", "TSVECTOR"),  # PostgreSQL only (an AddColumn with dialect="postgres")
}


@dataclass(frozen=True)
class Column:
    name: str
    type: str
    not_null: bool = False
    default: str | None = None  # an SQL literal valid in both dialects
    primary_key: bool = False

    def render(self, dialect: str) -> str:
        sql_type = TYPES[self.type][0 if dialect == "sqlite" else 1]
        parts = [self.name, sql_type]
        if self.primary_key and self.type != "serial":
            parts.append("PRIMARY KEY")
        if self.not_null:
            parts.append("NOT NULL")
        if self.default is not None:
            parts.append(f"DEFAULT {self.default}")
        return " ".join(parts)


@dataclass(frozen=True)
class CreateTable:
    table: str
    columns: tuple[Column, ...]


@dataclass(frozen=True)
class AddColumn:
    table: str
    column: Column
    dialect: str | None = None  # applied on this dialect only (None: both)


@dataclass(frozen=True)
class CreateIndex:
    name: str
    table: str
    columns: tuple[str, ...]  # column names, or (on one dialect) expressions
    unique: bool = False
    dialect: str | None = None  # applied on this dialect only (None: both)
    using: str | None = None  # the index method (PostgreSQL ``gin``); None: the default


@dataclass(frozen=True)
class CreateVirtualTable:
    """A SQLite virtual table (``CREATE VIRTUAL TABLE IF NOT EXISTS``), such as FTS5."""

    table: str
    module: str  # the module and its arguments: ``fts5(body)``
    dialect: str = "sqlite"


def applies(migration: Migration, dialect: str) -> bool:
    if isinstance(migration, CreateIndex | CreateVirtualTable | AddColumn):
        return migration.dialect in (None, dialect)
    return True


Migration = CreateTable | AddColumn | CreateIndex | CreateVirtualTable

# What a list of runs reads of a run's input, output and error (toren.store.sql): the
# value itself when its JSON text is at most SUMMARY_INLINE bytes, its size, and a preview
# of a larger one. On SQLite these expressions are also indexed (``runs_list`` below):
# a row's columns after a 1 MB input live at the end of a chain of overflow pages, so a
# page of 50 such runs read from the table costs ~25 ms; read from the index it costs
# ~0.2 ms. PostgreSQL keeps large values out of line (TOAST): no index needed there.
SUMMARY_INLINE = 4096
# The expression PostgreSQL's first search index holds (``run_search_fulltext``, kept: the
# schema never drops). Searches no longer use it: they read the stored column
# ``run_search.vector`` (its GIN index ``run_search_vector``), which the indexer fills on
# write with this same expression. A bitmap heap scan rechecks the rows it visits; over
# the expression it parsed up to 32 KiB of text again per row, over the column it reads
# the stored vector.
SEARCH_VECTOR = "to_tsvector('simple', body)"
SUMMARY_PREVIEW = 256
LIST_COLUMNS = (
    "id, agent, process, status, idempotency_key, created_at, updated_at, lease_owner, "
    "lease_epoch, lease_expires_at, not_before, cancel_requested, waiting_for, input_tokens, "
    "output_tokens, cost_nanousd, saved_nanousd, steps, code_version, lease_recoveries, "
    "invalidations, retries, forked_from, forked_at, blocked_error, blocked_attempts, "
    "blocked_since"
)


def byte_size(column: str, dialect: str) -> str:
    """The SQL of a text column's size in bytes, read from the value's header (its text
    is not counted through, nor a large value decompressed)."""
    return f"length(CAST({column} AS BLOB))" if dialect == "sqlite" else f"octet_length({column})"


def summary_expressions(dialect: str) -> tuple[str, ...]:
    """Per JSON column: the inline value, its size in bytes, the preview of a large one."""
    found: list[str] = []
    for column in ("input", "output", "error"):
        n = byte_size(column, dialect)
        found += [
            f"CASE WHEN {n} <= {SUMMARY_INLINE} THEN {column} END",
            n,
            f"CASE WHEN {n} > {SUMMARY_INLINE} THEN substr({column}, 1, {SUMMARY_PREVIEW}) END",
        ]
    return tuple(found)


def _c(name: str, type_: str, **kw: object) -> Column:
    return Column(name, type_, **kw)  # type: ignore[arg-type]


SCHEMA: tuple[Migration, ...] = (
    # --- 0.1.0 -------------------------------------------------------------------------
    CreateTable(
        "runs",
        (
            _c("id", "text", primary_key=True),
            _c("agent", "text", not_null=True),
            _c("status", "text", not_null=True, default="'queued'"),
            _c("input", "text"),
            _c("output", "text"),
            _c("error", "text"),
            _c("idempotency_key", "text"),
            _c("created_at", "real", not_null=True),
            _c("updated_at", "real", not_null=True),
            _c("lease_owner", "text"),
            _c("lease_epoch", "int", not_null=True, default="0"),
            _c("lease_expires_at", "real"),
            _c("not_before", "real"),
            _c("cancel_requested", "int", not_null=True, default="0"),
        ),
    ),
    CreateTable(
        "events",
        (
            _c("seq", "serial"),
            _c("run_id", "text", not_null=True),
            _c("stream", "text", not_null=True, default="''"),
            _c("position", "int"),
            _c("generation", "int", not_null=True, default="0"),
            _c("slot", "text"),
            _c("type", "text", not_null=True),
            _c("digest", "text"),
            _c("code_version", "text", not_null=True, default="''"),
            _c("worker_id", "text", not_null=True, default="''"),
            _c("created_at", "real", not_null=True),
            _c("format_version", "int", not_null=True, default="1"),
            _c("payload", "text", not_null=True),
        ),
    ),
    CreateTable(
        "blobs",
        (
            _c("hash", "text", primary_key=True),
            _c("body", "text", not_null=True),
            _c("size", "int", not_null=True, default="0"),
        ),
    ),
    CreateTable(
        "inbox",
        (
            _c("id", "serial"),
            _c("run_id", "text", not_null=True),
            _c("name", "text", not_null=True),
            _c("payload", "text"),
            _c("created_at", "real", not_null=True),
            _c("consumed_seq", "int"),
        ),
    ),
    CreateTable(
        "workers",
        (
            _c("id", "text", primary_key=True),
            _c("code_version", "text", not_null=True),
            _c("started_at", "real", not_null=True),
            _c("heartbeat_at", "real", not_null=True),
            _c("draining", "int", not_null=True, default="0"),
        ),
    ),
    CreateIndex("events_run_seq", "events", ("run_id", "seq")),
    CreateIndex("events_run_slot", "events", ("run_id", "slot"), unique=True),
    CreateIndex("runs_idempotency", "runs", ("idempotency_key",), unique=True),
    CreateIndex("runs_claim", "runs", ("status", "not_before")),
    CreateIndex("inbox_run", "inbox", ("run_id", "consumed_seq")),
    # Added within 0.1 development; kept as ADD COLUMN so that a database created by the
    # first schema upgrades in place, exactly as the versioning page describes.
    AddColumn("runs", _c("process", "text", not_null=True, default="'main'")),
    AddColumn("runs", _c("waiting_for", "text")),
    AddColumn("runs", _c("input_tokens", "int", not_null=True, default="0")),
    AddColumn("runs", _c("output_tokens", "int", not_null=True, default="0")),
    AddColumn("runs", _c("cost_nanousd", "int", not_null=True, default="0")),
    AddColumn("runs", _c("saved_nanousd", "int", not_null=True, default="0")),
    AddColumn("runs", _c("steps", "int", not_null=True, default="0")),
    AddColumn("runs", _c("code_version", "text")),
    AddColumn("runs", _c("lease_recoveries", "int", not_null=True, default="0")),
    AddColumn("runs", _c("invalidations", "int", not_null=True, default="0")),
    AddColumn("workers", _c("hostname", "text")),
    AddColumn("workers", _c("pid", "int")),
    CreateIndex("runs_created", "runs", ("created_at",)),
    CreateIndex("runs_agent", "runs", ("agent", "created_at")),
    # --- after 0.1: retry and fork (runs.retries, lineage) ---------------------------
    AddColumn("runs", _c("retries", "int", not_null=True, default="0")),
    AddColumn("runs", _c("forked_from", "text")),
    AddColumn("runs", _c("forked_at", "text")),
    # --- retention and big databases (docs/storage.md#retention) ------------------------
    # A message body's first writer (``run_id``; NULL on rows stored before this) and how
    # many times another run stored it again (``shares``): prune deletes the bodies only a
    # pruned run ever stored without a full scan of the log.
    AddColumn("blobs", _c("run_id", "text")),
    AddColumn("blobs", _c("shares", "int", not_null=True, default="0")),
    CreateIndex("blobs_run", "blobs", ("run_id",)),
    # Listing newest first by every documented filter walks an index in id order (keyset
    # pagination: ``id < cursor``), whatever the table's size; prune finds finished runs
    # by status and finish time.
    CreateIndex("runs_status_id", "runs", ("status", "id")),
    CreateIndex("runs_agent_id", "runs", ("agent", "id")),
    CreateIndex("runs_agent_status_id", "runs", ("agent", "status", "id")),
    CreateIndex("runs_process_id", "runs", ("process", "id")),
    CreateIndex("runs_finished", "runs", ("status", "updated_at")),
    # Prune keeps a run while a fork of it exists (one lookup per candidate).
    CreateIndex("runs_forked_from", "runs", ("forked_from",)),
    # A run blocked on an infrastructure error: what failed, how often in a row, since when
    # (the retry time is not_before). See docs/storage.md.
    AddColumn("runs", _c("blocked_error", "text")),
    AddColumn("runs", _c("blocked_attempts", "int", not_null=True, default="0")),
    AddColumn("runs", _c("blocked_since", "real")),
    # Covers GET /v1/runs on SQLite (see SUMMARY_INLINE above). Its columns are
    # LIST_COLUMNS and the summary expressions, exactly: a query reading anything else
    # would go back to the table.
    CreateIndex(
        "runs_list",
        "runs",
        (*(c.strip() for c in LIST_COLUMNS.split(",")), *summary_expressions("sqlite")),
        dialect="sqlite",
    ),
    # --- 0.2.0: schedules (toren.core.contract.schedule; docs/schedules.md) ----------------------
    # One row per schedule, from agent.yaml (``source``: the code version that declared
    # it and the start time of its worker: the newest wins, as in the storm guard) or the
    # API. ``next_fire_at`` is the next nominal time not yet decided: every firing moves
    # it on with a compare-and-set in the same transaction that starts the run(s), so one
    # decision lands per nominal time whatever the number of workers.
    CreateTable(
        "schedules",
        (
            _c("id", "text", primary_key=True),
            _c("agent", "text", not_null=True),
            _c("name", "text", not_null=True),
            _c("process", "text", not_null=True, default="'main'"),
            _c("spec", "text", not_null=True),
            _c("input", "text"),
            _c("source", "text", not_null=True, default="'api'"),
            _c("code_version", "text"),
            _c("declared_at", "real"),
            _c("paused", "int", not_null=True, default="0"),
            _c("note", "text"),
            _c("removed", "int", not_null=True, default="0"),
            _c("next_fire_at", "real"),
            _c("buffered_at", "real"),
            _c("last_fired_at", "real"),
            _c("last_run_id", "text"),
            _c("last_skip_at", "real"),
            _c("last_skip_reason", "text"),
            _c("fires", "int", not_null=True, default="0"),
            _c("skips", "int", not_null=True, default="0"),
            _c("lateness_total", "real", not_null=True, default="0"),
            _c("created_at", "real", not_null=True),
            _c("updated_at", "real", not_null=True),
        ),
    ),
    CreateIndex("schedules_due", "schedules", ("removed", "paused", "next_fire_at")),
    # A scheduled run's origin: which schedule, for which nominal time.
    AddColumn("runs", _c("schedule_id", "text")),
    AddColumn("runs", _c("scheduled_for", "real")),
    CreateIndex("runs_schedule_id", "runs", ("schedule_id", "id")),
    # --- 0.2.0: flow control (toren.core.contract.flow; docs/flow-control.md) -------------------
    # A run's concurrency key and limit, and its priority in the key's queue.
    AddColumn("runs", _c("concurrency_key", "text")),
    AddColumn("runs", _c("concurrency_limit", "int")),
    AddColumn("runs", _c("priority", "int", not_null=True, default="0")),
    CreateIndex("runs_concurrency", "runs", ("concurrency_key", "status")),
    # Since 0.2: each event's link in its run's hash chain (docs/digest.md §7), NULL on
    # events written before; and the tool errors a run recorded (docs/agent-yaml.md).
    AddColumn("events", _c("chain", "text")),
    AddColumn("runs", _c("tool_errors", "int", not_null=True, default="0")),
    # --- search (docs/http-api.md#search) -------------------------------------------------
    # One row per run: its search text (redacted and bounded, built by the API's indexer,
    # toren.api.search) and the phase of the run it was built in: ``open`` while the run
    # has no outcome, else its final status. A run whose phase changed since (it finished,
    # or a retry cleared its outcome) is indexed again; steps alone do not re-index it.
    # Runs without a row are not found by search until the indexer reaches them.
    # PostgreSQL searches it through a GIN full-text index; SQLite through the FTS5 table
    # ``run_search_fts`` (external content: its rowid is run_search's rowid).
    CreateTable(
        "run_search",
        (
            _c("run_id", "text", primary_key=True),
            _c("body", "text", not_null=True, default="''"),
            _c("phase", "text", not_null=True, default="'open'"),
        ),
    ),
    CreateIndex(
        "run_search_fulltext",
        "run_search",
        (f"({SEARCH_VECTOR})",),
        dialect="postgres",
        using="gin",
    ),
    CreateVirtualTable("run_search_fts", "fts5(body, content='run_search', content_rowid='rowid')"),
    # The indexer finds what changed since it last looked through this index.
    CreateIndex("runs_updated", "runs", ("updated_at",)),
    # --- 0.2.0: a schedule whose agent the newest deploy no longer has ------------------
    # Why it does not fire (NULL: it does); see docs/schedules.md#removed-agents.
    AddColumn("schedules", _c("orphaned", "text")),
    # --- 0.2.0: provider rate limits (toren.core.contract.ratelimit; docs/flow-control.md) --
    # One row per "provider:model": the limit last declared, the fleet's 429 state, counts.
    CreateTable(
        "rate_limits",
        (
            _c("key", "text", primary_key=True),
            _c("rpm", "int"),
            _c("tpm", "int"),
            _c("period", "real", not_null=True, default="60"),
            _c("blocked_until", "real"),
            _c("strikes", "int", not_null=True, default="0"),
            _c("probe", "int"),
            _c("calls", "int", not_null=True, default="0"),
            _c("paced", "int", not_null=True, default="0"),
            _c("waited", "real", not_null=True, default="0"),
            _c("throttled", "int", not_null=True, default="0"),
            _c("updated_at", "real", not_null=True),
        ),
    ),
    # One row per slot taken in a key's window (deleted once out of it).
    CreateTable(
        "rate_grants",
        (
            _c("id", "serial"),
            _c("key", "text", not_null=True),
            _c("owner", "text", not_null=True),
            _c("at", "real", not_null=True),
            _c("tokens", "int", not_null=True, default="0"),
            _c("state", "int", not_null=True, default="0"),
        ),
    ),
    CreateIndex("rate_grants_key_at", "rate_grants", ("key", "at")),
    CreateIndex("rate_grants_owner", "rate_grants", ("owner",)),
    # The key a run waits on for its next slot (status 'waiting', not_before the slot).
    AddColumn("runs", _c("paced", "text")),
    CreateIndex("runs_paced", "runs", ("paced", "status")),
    # PostgreSQL: the search text's vector, stored (``to_tsvector('simple', body)``, filled
    # by the indexer as it writes ``body``), and the GIN index searches read. NULL on rows
    # written before it: the indexer counts such a row as missing and writes it again, a
    # small batch at a time (toren.api.search), like a run it never indexed.
    AddColumn("run_search", _c("vector", "tsvector"), dialect="postgres"),
    CreateIndex("run_search_vector", "run_search", ("vector",), dialect="postgres", using="gin"),
)


def render(migration: Migration, dialect: str) -> str:
    """The SQL of one entry. On SQLite an AddColumn renders without IF NOT EXISTS; the
    SQLite store checks ``PRAGMA table_info`` first."""
    if isinstance(migration, CreateTable):
        cols = ", ".join(c.render(dialect) for c in migration.columns)
        return f"CREATE TABLE IF NOT EXISTS {migration.table} ({cols})"
    if isinstance(migration, AddColumn):
        col = migration.column.render(dialect)
        if dialect == "sqlite":
            return f"ALTER TABLE {migration.table} ADD COLUMN {col}"
        return f"ALTER TABLE {migration.table} ADD COLUMN IF NOT EXISTS {col}"
    if isinstance(migration, CreateVirtualTable):
        return f"CREATE VIRTUAL TABLE IF NOT EXISTS {migration.table} USING {migration.module}"
    unique = "UNIQUE " if migration.unique else ""
    cols = ", ".join(migration.columns)
    using = f" USING {migration.using}" if migration.using else ""
    return (
        f"CREATE {unique}INDEX IF NOT EXISTS {migration.name} ON {migration.table}{using} ({cols})"
    )
