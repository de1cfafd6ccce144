"""Retention: prune finished runs, export runs as JSON Lines, import them back. This module
holds the batching and the file format; each transaction is a typed method of the store
(:class:`toren.store.base.RetentionStore`, its SQL in :mod:`toren.store.pruning` and the
dialect modules).

A finished run (``completed``, ``failed``, ``cancelled``) is pruned whole: its row, its
event log, its inbox and the message bodies (``blobs``) no other run stored. Runs in
flight (``queued``, ``running``) and parked runs (``waiting``) are never selected, and
the delete re-checks status and finish time in its own statement, so a run that changed
meanwhile is left alone. Each batch is one short transaction; workers stepping live runs
keep writing meanwhile (see docs/storage.md#retention for why that is safe).

Message bodies are content-addressed and shared between runs (a system prompt, tool
specs). Each body row records its first writer (``run_id``) and how many times another
run stored it again (``shares``). A run only ever references bodies it stored itself (its
steps store every new message, its list nodes and tool specs), so a body whose first
writer is pruned and that no other run stored is referenced by no remaining event, and
goes with the run. A shared body is kept: it may be referenced elsewhere.

Export format (one JSON object per line, UTF-8): a header ``{"toren_export": 1, ...}``,
then for each run a ``run`` line (the row's columns as stored, and the hashes of every
body its events reference), the ``blob`` lines not yet written in this file, its
``event`` lines in seq order and its ``inbox`` lines. Stored text (payloads, inputs,
bodies) is carried as JSON strings, so an import restores it byte for byte.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO

from toren.core.contract.values import JSON, TERMINAL_STATUSES
from toren.errors import InvalidInput
from toren.store.base import ExportedRun, PruneResult, RetentionStore, Row, check_statuses

__all__ = [
    "FORMAT",
    "ImportResult",
    "PruneResult",
    "check_statuses",
    "export_runs",
    "finished_ids",
    "import_runs",
    "prune",
    "prune_batch",
    "sweep_blobs",
]

FORMAT = 1
_FINISHED = tuple(sorted(TERMINAL_STATUSES))
BeforeDelete = Callable[[list[str]], Awaitable[object]]


# -- prune ------------------------------------------------------------------------------


async def count_finished(
    store: RetentionStore, *, before: float, statuses: Sequence[str]
) -> tuple[int, int]:
    """(runs, events) that a prune with these bounds would delete now (``--dry-run``)."""
    return await store.count_finished(before=before, statuses=statuses)


async def prune_batch(
    store: RetentionStore,
    *,
    before: float,
    statuses: Sequence[str] = _FINISHED,
    limit: int = 200,
    before_delete: BeforeDelete | None = None,
) -> PruneResult:
    """Delete up to ``limit`` runs that finished (with one of ``statuses``) before the
    epoch time ``before``, oldest first, with their events, inbox and the message bodies
    only they stored: one transaction. ``before_delete(run_ids)`` is awaited first when
    given (an export of exactly the runs about to go)."""
    statuses = check_statuses(statuses)
    ids: list[str] | None = None
    if before_delete is not None:
        ids = await store.prunable_ids(before=before, statuses=statuses, limit=limit)
        if not ids:
            return PruneResult()
        await before_delete(ids)
    return await store.delete_finished(before=before, statuses=statuses, limit=limit, ids=ids)


async def sweep_blobs(store: RetentionStore, *, page: int = 200) -> int:
    """Delete the bodies no event references any more (see
    :meth:`toren.store.pruning.RetentionSql.sweep_blobs`): the number deleted."""
    return await store.sweep_blobs(page=page)


async def prune(
    store: RetentionStore,
    *,
    before: float,
    statuses: Sequence[str] = _FINISHED,
    batch: int = 200,
    pause: float = 0.0,
    before_delete: BeforeDelete | None = None,
    on_batch: Callable[[PruneResult], None] | None = None,
) -> PruneResult:
    """Prune every run that finished before ``before``, ``batch`` runs per transaction,
    sleeping ``pause`` seconds between batches (to leave the database to live work)."""
    total = PruneResult()
    while True:
        done = await prune_batch(
            store, before=before, statuses=statuses, limit=batch, before_delete=before_delete
        )
        if not done.runs:
            return total
        total.add(done)
        total.run_ids = []  # a long prune does not keep every id
        if on_batch is not None:
            on_batch(done)
        if pause:
            await asyncio.sleep(pause)


# -- export -----------------------------------------------------------------------------


async def finished_ids(
    store: RetentionStore, *, before: float, statuses: Sequence[str], page: int = 500
) -> AsyncIterator[str]:
    """The ids of runs finished before ``before``, oldest id first, page by page."""
    statuses = check_statuses(statuses)
    after = ""
    while True:
        ids = await store.finished_ids(before=before, statuses=statuses, after=after, limit=page)
        for run_id in ids:
            yield run_id
        if len(ids) < page:
            return
        after = ids[-1]


def _dump(record: dict[str, JSON]) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"


async def export_runs(
    store: RetentionStore, run_ids: AsyncIterator[str] | Iterable[str], out: IO[str]
) -> int:
    """Write the runs, their events, inbox and referenced bodies to ``out`` as JSON Lines;
    the number of runs written. An unknown id is an error naming it."""
    out.write(_dump({"toren_export": FORMAT, "created_at": time.time()}))
    written: set[str] = set()
    count = 0

    async def ids() -> AsyncIterator[str]:
        if isinstance(run_ids, AsyncIterator):
            async for run_id in run_ids:
                yield run_id
        else:
            for run_id in run_ids:
                yield run_id

    async for run_id in ids():
        run = await store.export_run(run_id)
        blobs = sorted(run.blobs)
        out.write(_dump({"type": "run", "row": dict(run.row), "blobs": list(blobs)}))
        for h in blobs:
            if h not in written:
                out.write(_dump({"type": "blob", "hash": h, "body": run.blobs[h]}))
                written.add(h)
        for ev in run.events:
            out.write(_dump({"type": "event", "row": dict(ev)}))
        for msg in run.inbox:
            out.write(_dump({"type": "inbox", "row": dict(msg)}))
        count += 1
    out.flush()
    return count


# -- import -----------------------------------------------------------------------------


@dataclass
class ImportResult:
    runs: int = 0
    skipped: list[str] = field(default_factory=list)  # already present
    events: int = 0
    blobs: int = 0

    def to_dict(self) -> dict[str, int]:
        return {
            "runs": self.runs,
            "skipped": len(self.skipped),
            "events": self.events,
            "blobs": self.blobs,
        }


@dataclass
class _Pending:
    run: ExportedRun
    hashes: list[str]


# The key column of each record type: a record without it is not this release's format.
_KEYS = {"run": "id", "event": "seq", "inbox": "id"}


def _row(record: dict[str, object], kind: str, line: int) -> Row:
    """The record's row (its columns as stored). Columns this release does not know are
    kept here and left out by the store; a missing key column is an error."""
    row = record.get("row")
    key = _KEYS[kind]
    if not isinstance(row, dict) or key not in row:
        raise InvalidInput(f"line {line}: the {kind} record has no {key!r}")
    values: Row = {}
    for column, value in row.items():
        if value is not None and not isinstance(value, str | int | float):
            raise InvalidInput(
                f"line {line}: column {column!r} of the {kind} record holds "
                f"{type(value).__name__}, expected text, a number or null"
            )
        values[str(column)] = value
    return values


async def import_runs(store: RetentionStore, lines: Iterable[str]) -> ImportResult:
    """Read an export (JSON Lines) back. A run already in the database is skipped (an
    import can be repeated); each other run is inserted in one transaction with its
    events (their original seq), inbox and bodies."""
    result = ImportResult()
    bodies: dict[str, str] = {}
    pending: _Pending | None = None
    header = False
    max_seq = max_inbox = 0
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise InvalidInput(
                f"line {number} is not JSON ({exc}); is this a toren export?"
            ) from None
        if not isinstance(record, dict):
            record = {}
        if not header:
            if record.get("toren_export") != FORMAT:
                raise InvalidInput(
                    f"line {number} is not a toren export header (expected "
                    f'{{"toren_export": {FORMAT}, ...}}); write one with `toren runs export`'
                )
            header = True
            continue
        kind = record.get("type")
        if kind == "blob":
            bodies[str(record["hash"])] = str(record["body"])
        elif kind == "run":
            if pending is not None:
                await _import_one(store, pending, bodies, result)
            row = _row(record, "run", number)
            pending = _Pending(ExportedRun(row), [str(h) for h in record.get("blobs") or ()])
        elif kind in ("event", "inbox"):
            if pending is None:
                raise InvalidInput(f"line {number}: an {kind} record before any run record")
            row = _row(record, kind, number)
            if row.get("run_id") != pending.run.row["id"]:
                raise InvalidInput(
                    f"line {number}: an {kind} of run {row.get('run_id')!r} among the "
                    f"records of run {pending.run.row['id']!r}"
                )
            if kind == "event":
                pending.run.events.append(row)
                max_seq = max(max_seq, _int(row["seq"], number))
            else:
                pending.run.inbox.append(row)
                max_inbox = max(max_inbox, _int(row["id"], number))
        # Other record types (a newer release's) are skipped, as the log's readers do.
    if not header:
        raise InvalidInput("the file is empty: expected a toren export (JSON Lines)")
    if pending is not None:
        await _import_one(store, pending, bodies, result)
    if result.runs:
        await store.reserve_ids(seq=max_seq, inbox_id=max_inbox)
    return result


def _int(value: object, line: int) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise InvalidInput(f"line {line}: expected an integer id, got {value!r}")


async def _import_one(
    store: RetentionStore, pending: _Pending, bodies: dict[str, str], result: ImportResult
) -> None:
    run = pending.run
    run_id = str(run.row["id"])
    missing = [h for h in pending.hashes if h not in bodies]
    if missing:
        raise InvalidInput(f"run {run_id!r}: message body {missing[0]!r} is not in the file")
    run.blobs = {h: bodies[h] for h in pending.hashes}
    if await store.import_run(run):
        result.runs += 1
        result.events += len(run.events)
        result.blobs += len(run.blobs)
    else:
        result.skipped.append(run_id)
