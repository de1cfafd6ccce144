"""The storage interface as the stores see it. The ports (``JournalStore`` for ticks and workers,
``RunStore`` for the API and the CLI, ``Store`` for both) and the records that cross them are owned
by the engine (:mod:`toren.core.contract.ports`, :mod:`toren.core.contract.records`) and re-exported
here, beside the retention port (:class:`RetentionStore`: prune, export, import) that only the
store's own tools use. All SQL of a dialect lives in that dialect's module; shared statements
(written with ``?`` placeholders, every column named) live in :mod:`toren.store.sql` and, for
retention, :mod:`toren.store.pruning`."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from toren.core.contract.ports import JournalStore as JournalStore
from toren.core.contract.ports import RunStore as RunStore
from toren.core.contract.ports import Store as Store
from toren.core.contract.records import Appended as Appended
from toren.core.contract.records import InboxMessage as InboxMessage
from toren.core.contract.records import Lease as Lease
from toren.core.contract.records import NewRun as NewRun
from toren.core.contract.records import Release as Release
from toren.core.contract.records import RunDelta as RunDelta
from toren.core.contract.records import RunRecord as RunRecord
from toren.core.contract.records import SearchBacklog as SearchBacklog
from toren.core.contract.records import SearchSource as SearchSource
from toren.core.contract.records import ValueSummary as ValueSummary
from toren.core.contract.records import WorkerInfo as WorkerInfo
from toren.core.contract.values import NANO as NANO
from toren.core.contract.values import STATUSES as STATUSES
from toren.core.contract.values import TERMINAL_STATUSES as TERMINAL_STATUSES
from toren.core.contract.values import from_nano as from_nano
from toren.core.contract.values import to_nano as to_nano
from toren.errors import CorruptRow, InvalidInput

StoredValue: TypeAlias = str | int | float | None
"""A column's value as a row holds it (text, integer, real or NULL)."""
Row: TypeAlias = dict[str, StoredValue]
"""A stored row by column name: what an export carries and an import inserts."""


def read_json(
    text: str | None,
    table: str,
    column: str,
    error: type[CorruptRow] = CorruptRow,
    **row: object,
) -> Any:
    """The value of a stored JSON column (None for NULL). Unreadable text is ``error``
    naming the table, the row (``row``: its key columns) and the column: a bare decode
    error raised inside a step would be taken for the agent's own and fail the run."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        key = ", ".join(f"{name}={value!r}" for name, value in row.items())
        raise error(
            f"the {column} of {table} row {key} is not valid JSON ({exc}); Toren does not "
            "skip unreadable data: repair the row, then retry",
            table=table,
            column=column,
            **row,
        ) from None


def check_statuses(statuses: Iterable[str]) -> tuple[str, ...]:
    """Only finished statuses can be pruned or bulk-exported (none given: all of them)."""
    chosen = tuple(dict.fromkeys(statuses)) or tuple(sorted(TERMINAL_STATUSES))
    wrong = [s for s in chosen if s not in TERMINAL_STATUSES]
    if wrong:
        raise InvalidInput(
            f"status {wrong[0]!r} cannot be pruned: only finished runs are "
            f"({', '.join(sorted(TERMINAL_STATUSES))}); runs in flight or waiting are "
            "never touched"
        )
    return chosen


@dataclass
class PruneResult:
    """What a prune deleted (``run_ids``: the runs, for one batch)."""

    runs: int = 0
    events: int = 0
    inbox: int = 0
    blobs: int = 0
    batches: int = 0
    run_ids: list[str] = field(default_factory=list)

    def add(self, other: PruneResult) -> None:
        self.runs += other.runs
        self.events += other.events
        self.inbox += other.inbox
        self.blobs += other.blobs
        self.batches += other.batches
        self.run_ids += other.run_ids

    def to_dict(self) -> dict[str, int]:
        return {
            "runs": self.runs,
            "events": self.events,
            "inbox": self.inbox,
            "blobs": self.blobs,
            "batches": self.batches,
        }


@dataclass
class ExportedRun:
    """One run whole, as an export carries it and an import inserts it: its row, its
    events (seq order) and inbox messages (id order) by column name, and every message
    body its events reference (hash -> body)."""

    row: Row
    events: list[Row] = field(default_factory=list)
    inbox: list[Row] = field(default_factory=list)
    blobs: dict[str, str] = field(default_factory=dict)


class RetentionStore(Protocol):
    """The bulk side of a store, for ``toren runs prune | export | import``
    (:mod:`toren.store.retention`): each method is one short transaction off the event
    loop's thread, so a worker sharing the store keeps stepping its runs meanwhile.
    ``statuses`` are finished statuses (:func:`check_statuses`)."""

    async def count_finished(
        self, *, before: float, statuses: Sequence[str]
    ) -> tuple[int, int]: ...
    async def finished_ids(
        self, *, before: float, statuses: Sequence[str], after: str, limit: int
    ) -> list[str]: ...
    async def prunable_ids(
        self, *, before: float, statuses: Sequence[str], limit: int
    ) -> list[str]: ...
    async def delete_finished(
        self,
        *,
        before: float,
        statuses: Sequence[str],
        limit: int,
        ids: Sequence[str] | None = None,
    ) -> PruneResult: ...
    async def sweep_blobs(self, *, page: int = 200) -> int: ...
    async def export_run(self, run_id: str) -> ExportedRun: ...
    async def import_run(self, run: ExportedRun) -> bool: ...
    async def reserve_ids(self, *, seq: int, inbox_id: int) -> None: ...


class Backend(Store, RetentionStore, Protocol):
    """What :func:`toren.store.open_store` returns: the engine's ports and retention."""
