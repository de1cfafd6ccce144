"""The search indexer: builds each run's search text, already redacted and bounded, and
stores it where the database's text index finds it (``run_search``; the query side is
:mod:`toren.store.search`). Documented in docs/http-api.md#search.

Search never reads what runs store: only this text, built through the same
:class:`~toren.redact.Redactor` as every response. A secret that responses show as
``[redacted]`` is ``redacted`` here too, so no query (a prefix of the secret extended one
character at a time included) can tell it is there.

The API server runs one indexer in the background. It walks the runs by ``updated_at``
from where it last looked, a few at a time (``BATCH``), so a database of old runs is
filled in small batches after an upgrade and a run is indexed again when its outcome is
set. Until the indexer reaches a run, search does not find it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterator
from typing import Any

from toren.core.contract.ports import RunStore
from toren.core.contract.records import SearchSource
from toren.redact import Redactor, StreamRedactor
from toren.store.search import words

log = logging.getLogger("toren.api.search")

# The search text of one run, in characters of its words (docs/http-api.md#search): the
# agent name, then the error (its first ERROR_BUDGET), the output (OUTPUT_BUDGET) and the
# input up to the whole TEXT_BUDGET.
TEXT_BUDGET = 32 * 1024
ERROR_BUDGET = 2 * 1024
OUTPUT_BUDGET = 12 * 1024
# What of an error is searched: its summary, not its traceback.
ERROR_FIELDS = ("type", "code", "message")
BATCH = 8  # runs per batch: each may carry a large input, parsed whole
# Runs changed up to this long before the newest change are looked at again on every
# pass: a run committed a little after a later one (clocks of several workers, a slow
# transaction) is not skipped.
SLACK = 60.0


def search_text(source: SearchSource, redactor: Redactor) -> str:
    """The words a run is found by: its agent, error, output and input, redacted, then
    bounded."""
    parts = [" ".join(words(source.agent))]
    left = TEXT_BUDGET - len(parts[0])
    for stored, budget in (
        (source.error, ERROR_BUDGET),
        (source.output, OUTPUT_BUDGET),
        (source.input, TEXT_BUDGET),
    ):
        summary = stored is source.error
        text = value_words(stored, redactor, min(budget, left), summary=summary)
        if text:
            parts.append(text)
            left -= len(text) + 1
        if left <= 0:
            break
    return " ".join(parts)


def value_words(
    stored: str | None, redactor: Redactor, budget: int, *, summary: bool = False
) -> str:
    """The words of a stored JSON value (its keys and scalars), redacted, at most ``budget``
    characters. Only about ``2 * budget`` characters of its text are read; when the text
    was cut there, the end that could be the start of a secret or a key shape is held back
    (:class:`StreamRedactor`), so a cut never leaves part of a secret to be found."""
    if stored is None or budget <= 0:
        return ""
    try:
        value: object = json.loads(stored)
    except ValueError:
        value = stored  # unreadable: its text as it is, redacted the same way
    if summary and isinstance(value, dict):
        value = {k: value[k] for k in ERROR_FIELDS if k in value}
    limit = 2 * budget + max((len(s) for s in redactor.secrets), default=0)
    raw, cut = _collect(value, limit)
    stream = StreamRedactor(redactor)
    redacted = stream.feed(raw) if cut else stream.feed(raw) + stream.flush()
    found = " ".join(words(redacted))
    if len(found) <= budget:
        return found
    return found[:budget].rsplit(" ", 1)[0]  # never half a word


def _collect(value: object, limit: int) -> tuple[str, bool]:
    """The strings of ``value`` joined by newlines, at most ``limit`` characters, and
    whether that cut anything off."""
    out: list[str] = []
    size = 0
    for piece in _strings(value):
        if size + len(piece) >= limit:
            out.append(piece[: limit - size])
            return "\n".join(out), True
        out.append(piece)
        size += len(piece) + 1
    return "\n".join(out), False


def _strings(value: object) -> Iterator[str]:
    """Keys and scalars of a JSON value, in document order (iterative: any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in reversed(list(item.items())):
                stack.extend((v, k))
        elif isinstance(item, list):
            stack.extend(reversed(item))
        elif isinstance(item, str):
            yield item
        elif item is not None and not isinstance(item, bool):
            yield str(item)


class SearchIndexer:
    def __init__(
        self, store: RunStore, redactor: Redactor, *, interval: float = 1.0, batch: int = BATCH
    ) -> None:
        self.store = store
        self.redactor = redactor
        self.interval = interval
        self.batch = batch
        self.since = 0.0  # every run changed at or after this is looked at

    async def step(self) -> int:
        """Index one batch; the number of runs indexed."""
        backlog = await self.store.search_backlog(since=self.since, limit=self.batch)
        if backlog.runs:
            texts = await asyncio.to_thread(self._texts, backlog.runs)
            await self.store.put_search_texts(texts)
        if len(backlog.runs) == self.batch:
            self.since = backlog.runs[-1].updated_at
        elif backlog.latest_change is not None:
            self.since = max(self.since, backlog.latest_change - SLACK)
        return len(backlog.runs)

    async def catch_up(self) -> int:
        """Index until nothing is left; the number of runs indexed."""
        total = 0
        while n := await self.step():
            total += n
        return total

    async def run(self) -> None:
        """Index forever (the API server's background task)."""
        while True:
            try:
                await self.catch_up()
            except Exception:
                # The database went away for a while: try again on the next pass.
                log.warning("search indexing failed; retrying", exc_info=True)
            await asyncio.sleep(self.interval)

    def _texts(self, runs: list[SearchSource]) -> list[tuple[str, str, str]]:
        return [(r.run_id, r.phase, search_text(r, self.redactor)) for r in runs]


@contextlib.asynccontextmanager
async def indexing(indexer: SearchIndexer) -> Any:
    task = asyncio.create_task(indexer.run(), name="toren-search-indexer")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
