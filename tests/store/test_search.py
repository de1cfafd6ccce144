"""Run search: the indexer (toren.api.search) fills ``run_search`` in small batches, for
runs stored before it existed too, and a query reads the database's own text index (FTS5
on SQLite, a GIN full-text index on PostgreSQL). On both databases."""

from __future__ import annotations

import json
import time
from typing import Any

import toren
from toren.api.search import TEXT_BUDGET, SearchIndexer, search_text, value_words
from toren.core.contract.records import SearchSource
from toren.redact import REDACTED, Redactor
from toren.store import Store
from toren.store.search import parse, words
from toren.store.sql import SEARCH_PLAN

from .test_list_indexes import plan_of

SECRET = "hunter2-Zq8Xv3Kp9Wm2"


async def _create(store: Store, n: int, input: Any) -> str:
    run = await toren.start_run(store, _agents(), "billing", input)
    return run.id


def _agents() -> toren.Registry:
    reg = toren.Registry()

    async def billing(ctx: toren.Context, input: Any) -> Any:
        return input

    reg.add("billing", billing)
    return reg


async def _ids(store: Store, query: str) -> list[str]:
    return [r.id for r in await store.list_runs(search=query, limit=100, summary=True)]


async def test_old_runs_are_found_once_the_backfill_reaches_them(store: Store) -> None:
    ids = [await _create(store, n, {"note": f"invoice {n} {SECRET}"}) for n in range(7)]
    # Stored before any indexing (as after an upgrade): not found yet.
    assert await _ids(store, "invoice") == []
    indexer = SearchIndexer(store, Redactor([SECRET]), batch=3)
    assert await indexer.step() == 3  # a small batch at a time
    assert len(await _ids(store, "invoice")) == 3
    assert await indexer.catch_up() == 4
    assert await _ids(store, "invoice") == sorted(ids, reverse=True)  # newest id first
    assert await _ids(store, "invoice 4") == [ids[4]]
    assert await _ids(store, '"invoice 4"') == [ids[4]]
    assert await _ids(store, "invo*") == sorted(ids, reverse=True)
    for k in range(1, len(SECRET) + 1):
        for query in (SECRET[:k], f"{SECRET[:k]}*"):
            assert await _ids(store, query) == [], query
    assert await indexer.catch_up() == 0  # nothing is indexed twice


async def test_a_run_is_indexed_again_when_its_outcome_is_set(store: Store) -> None:
    run_id = await _create(store, 1, "draft")
    indexer = SearchIndexer(store, Redactor())
    await indexer.catch_up()
    assert await _ids(store, "draft") == [run_id]
    sql_store: Any = store

    def finish(cur: Any) -> None:
        output = json.dumps({"answer": "approved refund"})
        sql_store._x(
            cur,
            "UPDATE runs SET status = 'completed', output = ?, updated_at = ? WHERE id = ?",
            (output, time.time(), run_id),
        )

    await sql_store._run(finish)
    assert await indexer.catch_up() == 1
    assert await _ids(store, "approved refund") == [run_id]
    assert await _ids(store, "draft") == [run_id]


async def test_search_reads_the_text_index(store: Store) -> None:
    sql_store: Any = store
    clause = sql_store._search_clause()
    sql = f"SELECT id FROM runs WHERE {clause} ORDER BY id DESC LIMIT 51"
    param = sql_store._search_param(parse("refund*"))
    if store.url.startswith("sqlite"):
        plan = await plan_of(store, sql, (param,))
        assert "VIRTUAL TABLE INDEX 0:M" in plan, plan  # an FTS5 MATCH
    else:

        def explain(cur: Any) -> str:
            for statement in SEARCH_PLAN:  # as list_runs plans a search
                sql_store._x(cur, statement)
            rows = sql_store._x(cur, f"EXPLAIN {sql}", (param,)).fetchall()
            return " / ".join(str(r[0]) for r in rows)

        # A table of a few rows, where a scan would look cheapest: the text index still.
        await _create(store, 1, {"note": "refund"})
        await SearchIndexer(store, Redactor()).catch_up()
        plan = await sql_store._run(explain)
        # The stored vector's index: a recheck reads the vector, it parses no text again.
        assert "Bitmap Index Scan on run_search_vector" in plan, plan
        assert "Seq Scan on run_search" not in plan and "to_tsvector" not in plan, plan
        assert await _ids(store, "refund") != []


async def test_rows_without_a_stored_vector_are_backfilled(store: Store) -> None:
    """PostgreSQL: a search text written before ``run_search.vector`` existed (its vector
    NULL) is not found through the vector until the indexer writes it again, in its small
    batches; afterwards it is, and nothing is indexed twice."""
    if store.url.startswith("sqlite"):
        return  # FTS5 holds its own index; there is no stored vector to fill
    ids = [await _create(store, n, {"note": f"voucher {n}"}) for n in range(5)]
    indexer = SearchIndexer(store, Redactor(), batch=2)
    await indexer.catch_up()
    assert await _ids(store, "voucher") == sorted(ids, reverse=True)
    sql_store: Any = store

    def as_before_the_column(cur: Any) -> None:
        sql_store._x(cur, "UPDATE run_search SET vector = NULL")

    await sql_store._run(as_before_the_column)
    assert await _ids(store, "voucher") == []
    backfill = SearchIndexer(store, Redactor(), batch=2)  # a new server start
    assert await backfill.step() == 2
    assert len(await _ids(store, "voucher")) == 2
    assert await backfill.catch_up() == 3
    assert await _ids(store, "voucher") == sorted(ids, reverse=True)
    assert await _ids(store, '"voucher 3"') == [ids[3]]
    assert await SearchIndexer(store, Redactor()).catch_up() == 0


def test_the_search_text_is_bounded_and_redacted() -> None:
    big = {"key": SECRET, "text": "lorem ipsum " * 100_000}
    source = SearchSource("r", 0.0, "open", "billing", json.dumps(big), None, None)
    text = search_text(source, Redactor([SECRET]))
    assert len(text) <= TEXT_BUDGET and text.startswith("billing key redacted text lorem ipsum")
    assert "zq8xv3kp9wm2" not in text


def test_an_errors_summary_is_searched_and_its_traceback_is_not() -> None:
    error = {
        "type": "RefundRefused",
        "code": "card_declined",
        "message": "the bank said wobblegong",
        "traceback": "File agent.py, line 9, in snorkelfrog",
    }
    source = SearchSource("r", 0.0, "failed", "billing", None, None, json.dumps(error))
    found = search_text(source, Redactor()).split()
    for word in ("refundrefused", "card", "declined", "wobblegong"):
        assert word in [w.lower() for w in found], found
    assert not {"snorkelfrog", "agent", "line"} & {w.lower() for w in found}, found


def test_a_cut_never_leaves_part_of_a_secret() -> None:
    """A secret (or a key shape) straddling where the text is cut: no prefix of it is
    indexed, whatever the cut."""
    redactor = Redactor([SECRET])
    key = "sk-proj-QJxW7v0q9ZzY2x5KbNNu"
    for secret in (SECRET, key):
        for budget in range(8, 40):
            for pad in range(0, 3 * budget, 3):
                stored = json.dumps("a " * (pad // 2) + secret + " tail")
                found = value_words(stored, redactor, budget).split()
                tail = words(secret)[-1]
                assert not any(w and tail.startswith(w) and len(w) > 2 for w in found), (
                    budget,
                    pad,
                    found,
                )
    assert REDACTED.strip("[]") in value_words(json.dumps(f"x {SECRET} y"), redactor, 100)


async def test_pruning_a_run_removes_its_search_text(store: Store) -> None:
    run_id = await _create(store, 1, "ephemeral words")
    sql_store: Any = store

    def finish(cur: Any) -> None:
        sql_store._x(
            cur, "UPDATE runs SET status = 'completed', updated_at = 1 WHERE id = ?", (run_id,)
        )

    await sql_store._run(finish)
    await SearchIndexer(store, Redactor()).catch_up()
    assert await _ids(store, "ephemeral") == [run_id]
    assert (await store.prune_finished(before=time.time(), limit=10)) == 1  # type: ignore[attr-defined]

    def left(cur: Any) -> list[Any]:
        rows = sql_store._x(cur, "SELECT run_id FROM run_search").fetchall()
        if store.url.startswith("sqlite"):  # the FTS index agrees with its content table
            sql_store._x(
                cur, "INSERT INTO run_search_fts (run_search_fts) VALUES ('integrity-check')"
            )
        return list(rows)

    assert await sql_store._run(left) == []


async def test_a_search_alone_pages_through_every_match_newest_first(store: Store) -> None:
    """On PostgreSQL a search with no other filter takes its page's ids from the search
    table itself (no join of every match to ``runs``): the pages, cursor included, are
    those of the join; a search text whose run was deleted by hand (a prune removes both)
    is skipped as the join skips it, and the page stays full."""
    ids = [await _create(store, n, {"note": f"parcel {n}"}) for n in range(9)]
    await SearchIndexer(store, Redactor()).catch_up()
    newest = sorted(ids, reverse=True)
    pages: list[list[str]] = []
    before = None
    while True:
        page = await store.list_runs(search="parc*", limit=4, before=before, summary=True)
        if not page:
            break
        pages.append([r.id for r in page])
        before = page[-1].id
    assert pages == [newest[0:4], newest[4:8], newest[8:9]]
    sql_store: Any = store
    await sql_store._run(
        lambda cur: sql_store._x(cur, "DELETE FROM runs WHERE id = ?", (newest[1],))
    )
    page = await store.list_runs(search="parcel", limit=4, summary=True)
    assert [r.id for r in page] == [newest[0], *newest[2:5]]
    assert all(r.input == {"note": r.input["note"]} for r in page)  # type: ignore[index]
