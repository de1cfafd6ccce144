"""The storage interface as the stores see it. The ports (``JournalStore`` for ticks and
workers, ``RunStore`` for the API and the CLI, ``Store`` for both) and the records that
cross them are owned by the engine (:mod:`toren.core.ports`, :mod:`toren.core.records`)
and re-exported here. All SQL of a dialect lives in that dialect's module; shared
statements (written with ``?`` placeholders, every column named) live in
:mod:`toren.store.sql`."""

from __future__ import annotations

import json
from typing import Any

from toren.core.ports import JournalStore as JournalStore
from toren.core.ports import RunStore as RunStore
from toren.core.ports import Store as Store
from toren.core.records import Appended as Appended
from toren.core.records import InboxMessage as InboxMessage
from toren.core.records import Lease as Lease
from toren.core.records import NewRun as NewRun
from toren.core.records import Release as Release
from toren.core.records import RunDelta as RunDelta
from toren.core.records import RunRecord as RunRecord
from toren.core.records import SearchBacklog as SearchBacklog
from toren.core.records import SearchSource as SearchSource
from toren.core.records import ValueSummary as ValueSummary
from toren.core.records import WorkerInfo as WorkerInfo
from toren.core.values import NANO as NANO
from toren.core.values import STATUSES as STATUSES
from toren.core.values import TERMINAL_STATUSES as TERMINAL_STATUSES
from toren.core.values import from_nano as from_nano
from toren.core.values import to_nano as to_nano
from toren.errors import CorruptRow


def read_json(
    text: str | None,
    table: str,
    column: str,
    error: type[CorruptRow] = CorruptRow,
    **row: Any,
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
