"""Retry and fork against the 0.1 database, on both backends: a failed 0.1 run can be
retried and a completed 0.1 run forked with today's code, and what they write (the new
event types, the new columns) is read harmlessly by the frozen 0.1 queries and by a
reader that does not know the new event types."""

from __future__ import annotations

from pathlib import Path

import pytest

import toren
from tests.compat.test_v0_1_fixtures import (  # noqa: F401  (fixtures)
    Q01_LIST_RUNS,
    Q01_LOAD_EVENTS,
    Q01_SELECT_RUN,
    RUNS,
    Raw,
    Resume,
    _ids,
    agent_dirs,
    v0_1_db,
)
from toren.core.contract import events as event_types
from toren.core.contract.events import Event, RunFailed, UnknownEvent, parse_payload
from toren.core.contract.replay import RunLog
from toren.store.sql import event_from_row


def fold_as_0_1(rows: list[tuple[object, ...]], monkeypatch: pytest.MonkeyPatch) -> RunLog:
    """Fold rows read by the frozen 0.1 query the way a reader without the new event
    types does: they parse as unknown events and the fold skips them."""
    with monkeypatch.context() as m:
        for name in ("RunRetried", "RunForked"):
            m.delitem(event_types.EVENT_TYPES, name)
        events: list[Event] = [event_from_row(r) for r in rows]
        unknown = [e for e in events if isinstance(e.payload, UnknownEvent)]
        assert {e.type for e in unknown} <= {"RunRetried", "RunForked"}
        assert parse_payload("RunForked", "{}", run_id="r", seq=1) == UnknownEvent(raw={})
    return RunLog.fold(str(rows[0][1]), events)


async def test_retry_and_fork_on_the_0_1_database_and_what_0_1_reads_of_them(
    v0_1_db: tuple[str, str],  # noqa: F811
    tmp_path: Path,
    agent_dirs: list[Path],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, url = v0_1_db
    ids = _ids(backend)
    Resume.environment(monkeypatch, tmp_path)
    store = await toren.connect(url)  # today's migration of the 0.1 database
    resume = Resume(store, tmp_path, agent_dirs)
    try:
        # A 0.1 run that failed in agent code (on purpose, so it fails again): retried, its
        # recorded model call replays unpaid, and the new failure carries a traceback.
        failed_id = ids["fixture_failed"]
        old = await store.load_events(failed_id)
        queued = await toren.retry_run(store, resume.resolver, failed_id, clock=resume.clock)
        assert queued.status == "queued" and queued.retries == 1
        result = await toren.tick(failed_id, resume.deps)
        assert result.status == "failed" and resume.paid() == 0
        assert "fails task 'beta' on purpose" in result.error["traceback"]  # type: ignore[index]
        events = await store.load_events(failed_id)
        assert [e.to_dict() for e in events[: len(old)]] == [e.to_dict() for e in old]
        assert [e.type for e in events[len(old) :]] == ["RunRetried", "RunFailed"]

        # A completed 0.1 run forked at its last model call: that call alone is paid, the
        # emails of the copied tool calls are not sent again; the source is untouched.
        source = ids["support_completed"]
        before = [e.to_dict() for e in await store.load_events(source)]
        fork = await toren.fork_run(store, resume.resolver, source, at="main:4", clock=resume.clock)
        result = await toren.tick(fork.id, resume.deps)
        assert result.status == "completed", result.error
        assert resume.paid() == 1 and resume.emails() == 0
        assert [e.to_dict() for e in await store.load_events(source)] == before
    finally:
        await store.close()
        resume.resolver.close()

    raw = Raw(backend, url)
    try:
        # The frozen 0.1 queries read the rows today's code wrote (new columns ignored).
        row = raw.all(Q01_SELECT_RUN, (failed_id,))[0]
        assert (row[0], row[3]) == (failed_id, "failed")
        forked = raw.all(Q01_SELECT_RUN, (fork.id,))[0]
        assert (forked[0], forked[1], forked[3]) == (fork.id, "support-agent", "completed")
        assert fork.id in [r[0] for r in raw.all(Q01_LIST_RUNS, ("completed", 50))]
        # A reader without the new event types folds both logs without trouble.
        retried = fold_as_0_1(raw.all(Q01_LOAD_EVENTS, (failed_id, 0)), monkeypatch)
        assert retried.terminal is not None and isinstance(retried.terminal.payload, RunFailed)
        assert retried.terminal.seq == max(r[0] for r in raw.all(Q01_LOAD_EVENTS, (failed_id, 0)))
        copied = fold_as_0_1(raw.all(Q01_LOAD_EVENTS, (fork.id, 0)), monkeypatch)
        assert copied.terminal is not None and copied.terminal.type == "RunCompleted"
        assert copied.forked is None  # not understood, skipped
        assert sorted(copied.streams["main"].steps) == [0, 1, 2, 3, 4]
        assert copied.started is not None
        assert copied.started.input == RUNS["support_completed"]["input"]
    finally:
        raw.close()
