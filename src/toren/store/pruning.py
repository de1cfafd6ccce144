"""Retention's SQL, shared by both dialects: the :class:`toren.store.base.RetentionStore`
methods (prune, the blob sweep, export and import of one run) and the journal port's
``prune_finished`` / ``sweep_blobs`` that a worker's retention loop calls. What differs by
dialect is a hook each dialect module overrides (:meth:`RetentionSql._bulk`, ``_in``,
``_lock_owned_blobs``, ``_advance_sequences``, ``prune_lock``); the file format and the
batching live in :mod:`toren.store.retention`.

A finished run (``completed``, ``failed``, ``cancelled``) is pruned whole: its row, its
event log, its inbox and the message bodies (``blobs``) no other run stored. The delete
re-checks status and finish time in its own statement, so a run that changed since it
was chosen is left alone (docs/storage.md#retention).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from toren.core.contract.values import TERMINAL_STATUSES
from toren.errors import InvalidInput, StorageError
from toren.store.base import ExportedRun, PruneResult, Row, check_statuses, read_json
from toren.store.sql import EVENT_COLUMNS, RUN_COLUMNS, Cursor, SqlStore, insert_blobs_sql

T = TypeVar("T")
INBOX_COLUMNS = "id, run_id, name, payload, created_at, consumed_seq"
RUN_COLS = tuple(c.strip() for c in RUN_COLUMNS.split(","))
EVENT_COLS = tuple(c.strip() for c in EVENT_COLUMNS.split(","))
INBOX_COLS = tuple(c.strip() for c in INBOX_COLUMNS.split(","))
_FINISHED = tuple(sorted(TERMINAL_STATUSES))


def _finished_where(statuses: Sequence[str]) -> str:
    marks = ", ".join("?" for _ in statuses)
    # A run another run was forked from stays while that fork exists: the fork's copied
    # steps reference the message bodies the source stored (docs/storage.md#retention).
    return (
        f"status IN ({marks}) AND updated_at < ? AND lease_owner IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM runs AS fork WHERE fork.forked_from = runs.id)"
    )


def _referenced(events: Sequence[Sequence[Any]]) -> tuple[set[str], set[str]]:
    """(list nodes, other bodies) that model-call events reference directly."""
    nodes: set[str] = set()
    direct: set[str] = set()
    type_at, payload_at = EVENT_COLS.index("type"), EVENT_COLS.index("payload")
    for row in events:
        if row[type_at] != "ModelCallRecorded":
            continue
        payload = read_json(row[payload_at], "events", "payload", seq=row[0])
        if not isinstance(payload, dict):
            continue
        node = payload.get("message_list")
        if isinstance(node, str):
            nodes.add(node)
        direct.update(h for h in payload.get("tools") or () if isinstance(h, str))
    return nodes, direct


class RetentionSql(SqlStore):
    """:class:`toren.store.base.RetentionStore` over the shared SQL; the dialects inherit
    it and override the hooks below."""

    prune_lock = ""  # appended to the select of the runs to prune (PostgreSQL: SKIP LOCKED)

    # -- dialect hooks ----------------------------------------------------------------

    async def _bulk(self, fn: Callable[[Cursor], T], *, write: bool = True) -> T:
        """Run ``fn(cur)`` in one transaction, never on the event loop's own thread: a
        batch of deletes or a page of an export takes milliseconds to seconds, and a
        worker's loop must keep stepping its runs meanwhile."""
        return await self._run(fn, write=write)

    def _in(self, values: Sequence[str]) -> tuple[str, list[object]]:
        """``IN (...)`` for a list of values, and its parameters."""
        return f"IN ({', '.join('?' for _ in values)})", list(values)

    def _lock_owned_blobs(self, cur: Cursor, clause: str, params: Sequence[object]) -> None:
        """Lock the bodies the runs being deleted stored first (a no-op where a write
        transaction already excludes every other writer)."""

    def _delete_search(self, cur: Cursor, clause: str, params: Sequence[object]) -> None:
        """Delete the search text of the runs being deleted (toren.store.search)."""
        self._x(cur, f"DELETE FROM run_search WHERE run_id {clause}", params)

    def _advance_sequences(self, cur: Cursor, seq: int, inbox_id: int) -> None:
        """Move the id sequences past ids inserted explicitly (a no-op where the next id
        already follows the largest one present)."""

    # -- the journal port's half --------------------------------------------------------

    async def prune_finished(self, *, before: float, limit: int) -> int:
        """Prune one batch of up to ``limit`` runs finished before ``before``: the number
        of runs pruned."""
        return (await self.delete_finished(before=before, statuses=_FINISHED, limit=limit)).runs

    # -- prune ------------------------------------------------------------------------

    async def count_finished(self, *, before: float, statuses: Sequence[str]) -> tuple[int, int]:
        """(runs, events) that a prune with these bounds would delete now."""
        statuses = check_statuses(statuses)
        where = _finished_where(statuses)

        def tx(cur: Cursor) -> tuple[int, int]:
            params = (*statuses, before)
            runs = self._x(cur, f"SELECT COUNT(id) FROM runs WHERE {where}", params).fetchone()
            events = self._x(
                cur,
                "SELECT COUNT(seq) FROM events WHERE run_id IN "
                f"(SELECT id FROM runs WHERE {where})",
                params,
            ).fetchone()
            return int(runs[0]), int(events[0])

        return await self._bulk(tx, write=False)

    async def finished_ids(
        self, *, before: float, statuses: Sequence[str], after: str, limit: int
    ) -> list[str]:
        """Up to ``limit`` ids of runs finished before ``before``, the first above
        ``after``, in id order (a page of a bulk export)."""
        statuses = check_statuses(statuses)
        sql = (
            f"SELECT id FROM runs WHERE {_finished_where(statuses)} AND id > ? ORDER BY id LIMIT ?"
        )
        params = (*statuses, before, after, limit)
        return await self._bulk(
            lambda cur: [str(r[0]) for r in self._x(cur, sql, params)], write=False
        )

    def _prunable(self, statuses: Sequence[str]) -> str:
        where = _finished_where(statuses)
        return f"SELECT id FROM runs WHERE {where} ORDER BY updated_at LIMIT ?{self.prune_lock}"

    async def prunable_ids(
        self, *, before: float, statuses: Sequence[str], limit: int
    ) -> list[str]:
        """The ids a :meth:`delete_finished` with these bounds would take, oldest first."""
        statuses = check_statuses(statuses)
        sql, params = self._prunable(statuses), (*statuses, before, limit)
        return await self._bulk(
            lambda cur: [str(r[0]) for r in self._x(cur, sql, params)], write=False
        )

    async def delete_finished(
        self,
        *,
        before: float,
        statuses: Sequence[str],
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> PruneResult:
        """Delete up to ``limit`` runs finished before ``before`` (of ``ids`` when given,
        else the oldest), with their events, inbox and the bodies only they stored: one
        transaction."""
        statuses = check_statuses(statuses)
        where = _finished_where(statuses)
        select = self._prunable(statuses)

        def tx(cur: Cursor) -> PruneResult:
            chosen = list(ids) if ids is not None else None
            if chosen is None:
                chosen = [r[0] for r in self._x(cur, select, (*statuses, before, limit))]
            if not chosen:
                return PruneResult()
            clause, params = self._in(chosen)
            # The bounds again, in the delete itself: a run resumed or retried since it
            # was chosen is no longer finished, and stays.
            deleted = [
                str(r[0])
                for r in self._x(
                    cur,
                    f"DELETE FROM runs WHERE id {clause} AND {where} RETURNING id",
                    (*params, *statuses, before),
                ).fetchall()
            ]
            if not deleted:
                return PruneResult()
            clause, params = self._in(deleted)
            self._delete_search(cur, clause, params)
            events = self._x(cur, f"DELETE FROM events WHERE run_id {clause}", params).rowcount
            inbox = self._x(cur, f"DELETE FROM inbox WHERE run_id {clause}", params).rowcount
            self._lock_owned_blobs(cur, clause, params)
            blobs = self._x(
                cur, f"DELETE FROM blobs WHERE run_id {clause} AND shares = 0", params
            ).rowcount
            # A body the deleted runs stored first but others stored too may still be
            # referenced: it loses its owner and waits for the next sweep_blobs.
            self._x(cur, f"UPDATE blobs SET run_id = NULL WHERE run_id {clause}", params)
            return PruneResult(len(deleted), events, inbox, blobs, 1, deleted)

        return await self._bulk(tx)

    # -- the blob sweep -----------------------------------------------------------------

    async def sweep_blobs(self, *, page: int = 200) -> int:
        """Delete the bodies without an owner (shared bodies whose first writer was
        pruned, and rows stored before bodies had owners) that no event references any
        more: a mark over every run's log (``page`` runs at a time, each run's list nodes
        walked), then a delete of the unmarked ones. Costs a read of the whole log. The
        number of bodies deleted.

        Safe beside live writers: a writer that stores one of these bodies again counts
        it in ``shares`` (its owner is NULL), and the delete only takes rows whose
        ``shares`` is still what it was before the mark began; a body a run references
        without storing it again, it stored earlier, in an event the mark sees."""
        orphans = "SELECT hash, shares FROM blobs WHERE run_id IS NULL"
        candidates: dict[str, int] = dict(
            await self._bulk(lambda cur: list(self._x(cur, orphans)), write=False)
        )
        after = ""
        while candidates:

            def mark(cur: Cursor, start: str = after) -> tuple[list[str], set[str]]:
                ids = [
                    str(r[0])
                    for r in self._x(
                        cur, "SELECT id FROM runs WHERE id > ? ORDER BY id LIMIT ?", (start, page)
                    )
                ]
                if not ids:
                    return ids, set()
                clause, params = self._in(ids)
                events = self._x(
                    cur,
                    f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id {clause} "
                    "AND type = 'ModelCallRecorded'",
                    params,
                ).fetchall()
                return ids, set(self._run_blobs(cur, events))

            ids, used = await self._bulk(mark, write=False)
            if not ids:
                break
            for h in used:
                candidates.pop(h, None)
            after = ids[-1]
        # Events of runs that no longer exist (a partial delete of an older release) are
        # not marked above: bodies they reference go too, as the log they belong to is gone.
        deleted = 0
        items = sorted(candidates.items())
        for i in range(0, len(items), 500):

            def delete(cur: Cursor, rows: list[tuple[str, int]] = items[i : i + 500]) -> int:
                sql = "DELETE FROM blobs WHERE hash = ? AND run_id IS NULL AND shares = ?"
                return sum(self._x(cur, sql, row).rowcount for row in rows)

            deleted += await self._bulk(delete)
        return deleted

    def _bodies(self, cur: Cursor, hashes: Iterable[str]) -> dict[str, str]:
        wanted = sorted(set(hashes))
        out: dict[str, str] = {}
        for i in range(0, len(wanted), 500):
            clause, params = self._in(wanted[i : i + 500])
            rows = self._x(cur, f"SELECT hash, body FROM blobs WHERE hash {clause}", params)
            out.update((str(h), str(b)) for h, b in rows.fetchall())
        return out

    def _run_blobs(self, cur: Cursor, events: Sequence[Sequence[object]]) -> dict[str, str]:
        """Every body the events reference: list nodes (walking ``prev``), their messages
        and tool specs. A missing one is an error: an export would not import as a whole
        log, and a sweep would delete what is still in use."""
        nodes, direct = _referenced(events)
        found: dict[str, str] = {}
        todo = set(nodes)
        while todo:
            got = self._bodies(cur, todo)
            missing = todo - got.keys()
            if missing:
                raise StorageError(
                    f"message list node {sorted(missing)[0]!r} is missing from blobs"
                )
            found.update(got)
            nxt: set[str] = set()
            for h in todo:
                body = json.loads(got[h])
                direct.update(body.get("items") or ())
                prev = body.get("prev")
                if isinstance(prev, str) and prev not in found:
                    nxt.add(prev)
            todo = nxt
        rest = direct - found.keys()
        got = self._bodies(cur, rest)
        missing = rest - got.keys()
        if missing:
            raise StorageError(f"message body {sorted(missing)[0]!r} is missing from blobs")
        found.update(got)
        return found

    # -- export and import ----------------------------------------------------------------

    async def export_run(self, run_id: str) -> ExportedRun:
        """The run whole, read in one transaction (a finished run does not change). An
        unknown id is an error naming it."""

        def tx(cur: Cursor) -> ExportedRun:
            found = self._x(cur, f"SELECT {RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,))
            row = found.fetchone()
            if row is None:
                raise InvalidInput(f"no run with id {run_id!r} to export")
            events = self._x(
                cur, f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq", (run_id,)
            ).fetchall()
            inbox = self._x(
                cur, f"SELECT {INBOX_COLUMNS} FROM inbox WHERE run_id = ? ORDER BY id", (run_id,)
            ).fetchall()
            return ExportedRun(
                dict(zip(RUN_COLS, row, strict=True)),
                [dict(zip(EVENT_COLS, ev, strict=True)) for ev in events],
                [dict(zip(INBOX_COLS, msg, strict=True)) for msg in inbox],
                self._run_blobs(cur, events),
            )

        return await self._bulk(tx, write=False)

    async def import_run(self, run: ExportedRun) -> bool:
        """Insert the run with its events (their original seq), inbox and bodies in one
        transaction; False (nothing written) when a run with its id is present. Columns
        this release does not know (a newer one's) are left out."""
        run_id = str(run.row["id"])

        def insert(cur: Cursor, table: str, known: tuple[str, ...], row: Row) -> None:
            cols = [c for c in known if c in row]
            marks = ", ".join("?" for _ in cols)
            sql = f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})"
            self._x(cur, sql, [row[c] for c in cols])

        def tx(cur: Cursor) -> bool:
            if self._x(cur, "SELECT id FROM runs WHERE id = ?", (run_id,)).fetchone():
                return False
            insert(cur, "runs", RUN_COLS, run.row)
            for event in run.events:
                insert(cur, "events", EVENT_COLS, event)
            for message in run.inbox:
                insert(cur, "inbox", INBOX_COLS, message)
            hashes = sorted(run.blobs)
            for i in range(0, len(hashes), 200):
                chunk = hashes[i : i + 200]
                params = [v for h in chunk for v in (h, run.blobs[h], len(run.blobs[h]), run_id)]
                self._x(cur, insert_blobs_sql(len(chunk)), params)
            return True

        try:
            return await self._bulk(tx)
        except Exception as exc:
            if self._is_conflict(exc):
                raise StorageError(
                    f"cannot import run {run_id!r}: one of its event seqs or inbox ids is "
                    f"taken by another run in this database ({exc})"
                ) from None
            raise

    async def reserve_ids(self, *, seq: int, inbox_id: int) -> None:
        """After an import: new events and messages never take an id up to these (in a
        fresh database, say). Never moves a sequence back."""
        await self._bulk(lambda cur: self._advance_sequences(cur, seq, inbox_id))
