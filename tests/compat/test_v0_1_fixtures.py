"""Compatibility with release 0.1.0: the golden fixtures in tests/fixtures/v0_1/.

The fixtures were written once by 0.1.0 (``tests/fixtures/v0_1/make_fixtures.py``) and are
never regenerated or edited below a major version. These tests hold every later release
to the versioning page (docs/versioning.md):

* the 0.1 event log reads with today's code, every event type, unknown fields tolerated,
  and its digests re-derive byte for byte;
* a 0.1 database (SQLite file and PostgreSQL dump) upgrades in place on a normal start,
  rows intact, and its in-flight runs resume to completion under today's code without
  paying a recorded model call again and without re-sending an email;
* the 0.1 queries, frozen below as text, still run against today's schema (rollback
  safety: a 0.1 worker pointed at a database a newer release has migrated keeps working);
* the replay plan over the 0.1 database is clean with today's example agents, and after a
  prompt edit it predicts exactly the invalidations a real resume then writes.

The committed fixture files are never opened in place: every test works on a copy.
The in-flight runs belong to ``examples/support-agent`` (the real example directory) and
to the frozen ``tests/fixtures/v0_1/agents/fixture-agent``. If an edit to the example
agent makes the clean-replay tests fail, that edit would invalidate users' in-flight runs
of it; that is what these tests are for.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.conftest import create_pg_database, drop_pg_database, pg_url, require_pg
from toren.agents.resolver import DirectoryResolver
from toren.core.contract.digest import message_hash, request_digest, tool_spec_hash
from toren.core.contract.events import Event, UnknownEvent, parse_payload
from toren.core.contract.replay import RunLog
from toren.core.drivers.plan import plan_runs
from toren.providers.scripted import ScriptedProvider, read_ledger
from toren.store import Store
from toren.store.base import RunRecord
from toren.store.schema import SCHEMA, AddColumn, CreateTable

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "v0_1"
SUPPORT = ROOT / "examples" / "support-agent"
MANIFEST: dict[str, Any] = json.loads((FIXTURES / "manifest.json").read_text("utf-8"))
RUNS: dict[str, dict[str, Any]] = {r["scenario"]: r for r in MANIFEST["runs"]}
IN_FLIGHT = [s for s, r in RUNS.items() if r["status"] in ("queued", "running", "waiting")]
RESUME_AT = MANIFEST["clock"]["resume_at"]
TIMER_ADVANCE = MANIFEST["clock"]["timer_advance"]
APPROVAL = MANIFEST["resume_message"]

# The event types of the 0.1 log format (a later release may add more, never fewer).
V0_1_EVENT_TYPES = {
    "RunStarted",
    "ModelCallRecorded",
    "ToolCallRecorded",
    "ValueRecorded",
    "TimerScheduled",
    "TimerFired",
    "MessageReceived",
    "ChildStarted",
    "ChildCompleted",
    "StreamInvalidated",
    "RunWaiting",
    "RunCompleted",
    "RunFailed",
    "RunCancelled",
}


# -- the 0.1 event log ------------------------------------------------------------------


def _lines(name: str) -> list[dict[str, Any]]:
    text = (FIXTURES / name).read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _event(line: dict[str, Any]) -> Event:
    return Event(
        seq=line["seq"],
        run_id=line["run_id"],
        type=line["type"],
        stream=line["stream"],
        position=line["position"],
        generation=line["generation"],
        digest=line["digest"],
        code_version=line["code_version"],
        worker_id=line["worker_id"],
        created_at=line["created_at"],
        format_version=line["format_version"],
        payload=parse_payload(
            line["type"], json.dumps(line["payload"]), run_id=line["run_id"], seq=line["seq"]
        ),
    )


def test_committed_fixtures_are_unchanged() -> None:
    """The fixture files are the ones 0.1.0 wrote (the manifest holds their hashes)."""
    for name, info in MANIFEST["files"].items():
        data = (FIXTURES / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == info["sha256"], f"{name} was modified"
        assert len(data) < 1_000_000
    assert not (FIXTURES / "toren-0.1.sqlite-wal").exists()


def test_the_generator_refuses_to_overwrite(tmp_path: Path) -> None:
    existing = tmp_path / "manifest.json"
    existing.write_text("{}")
    done = subprocess.run(
        [sys.executable, str(FIXTURES / "make_fixtures.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "refusing to overwrite" in done.stderr
    assert existing.read_text() == "{}" and sorted(os.listdir(tmp_path)) == ["manifest.json"]


def test_every_0_1_event_type_reads_with_todays_code() -> None:
    lines = _lines("events.jsonl")
    assert {line["type"] for line in lines} == V0_1_EVENT_TYPES
    for line in lines:
        event = _event(line)
        assert not isinstance(event.payload, UnknownEvent), line["type"]
        assert line["type"] == event.payload.TYPE
        # Nothing 0.1 wrote is lost: every field reads back with its value.
        again = event.to_dict()
        for key, value in line.items():
            if key != "payload":
                assert again[key] == value, (line["type"], key)
        for key, value in line["payload"].items():
            assert again["payload"][key] == value, (line["type"], key)


def test_unknown_fields_and_types_are_tolerated() -> None:
    """What a later release may add (fields, event types) does not break a reader."""
    for line in _lines("events.jsonl"):
        extended = {
            **line,
            "added_later": 1,
            "payload": {**line["payload"], "added_later": {"nested": [1, 2]}},
        }
        event = _event(extended)
        assert not isinstance(event.payload, UnknownEvent)
        assert event.payload == _event(line).payload
    odd = parse_payload("AddedInALaterRelease", '{"x": 1}', run_id="r", seq=1)
    assert isinstance(odd, UnknownEvent) and odd.raw == {"x": 1}


def test_0_1_runs_fold_and_their_digests_re_derive() -> None:
    """Today's fold reads every 0.1 run; the digest of every recorded step re-derives from
    its request byte for byte (the digest rules never change below a major); every blob
    is stored under its content address and every model call's messages read back."""
    blobs = {b["hash"]: b["body"] for b in _lines("blobs.jsonl")}
    decoded = {h: json.loads(body) for h, body in blobs.items()}
    for h, body in decoded.items():
        if "role" in body:
            assert message_hash(body) == h
        elif "parameters" in body:
            assert tool_spec_hash(body) == h
        else:
            assert set(body) == {"prev", "items"}
    by_run: dict[str, list[Event]] = {}
    for line in _lines("events.jsonl"):
        by_run.setdefault(line["run_id"], []).append(_event(line))
    checked = 0
    for run_id, events in by_run.items():
        log = RunLog.fold(run_id, events)
        final = {"completed": "RunCompleted", "failed": "RunFailed", "cancelled": "RunCancelled"}
        scenario = next(s for s, r in RUNS.items() if r["ids"]["sqlite"] == run_id)
        expected = final.get(RUNS[scenario]["status"])
        assert (log.terminal.type if log.terminal else None) == expected
        for event in events:
            p: Any = event.payload
            if event.type == "ModelCallRecorded":
                messages = _messages(decoded, p.message_list)
                assert len(messages) == p.message_count
                body = {
                    "provider": p.provider,
                    "model": p.model,
                    "messages": [message_hash(m) for m in messages],
                    "tools": p.tools,
                    "params": p.params,
                }
                assert request_digest("model", body) == event.digest
            elif event.type == "ToolCallRecorded":
                assert request_digest("tool", {"name": p.name, "args": p.args}) == event.digest
            elif event.type == "ValueRecorded":
                assert request_digest("value", {"what": p.what}) == event.digest
            elif event.type == "ChildStarted":
                body = {"process": p.process, "input": p.input}
                assert request_digest("child", body) == event.digest
            elif event.type == "TimerScheduled" and p.purpose == "sleep":
                assert request_digest("sleep", {"seconds": p.seconds}) == event.digest
            else:
                continue
            checked += 1
    assert checked > 50


def _messages(blobs: dict[str, Any], node: str | None) -> list[Any]:
    chain = []
    while node is not None:
        chain.append(blobs[node]["items"])
        node = blobs[node]["prev"]
    return [blobs[h] for items in reversed(chain) for h in items]


# -- the 0.1 databases --------------------------------------------------------------------


def _restore_pg_dump(url: str, tmp_path: Path) -> None:
    psql = shutil.which("psql")
    if psql is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true requires psql to restore the 0.1 PostgreSQL dump")
        pytest.skip("psql is not installed")
    # pg_dump >= 15.14 brackets the dump in \restrict / \unrestrict, which older psql
    # clients do not know; they are psql session guards, not data.
    text = (FIXTURES / "toren-0.1.pg.sql").read_text("utf-8")
    kept = [ln for ln in text.splitlines() if not ln.startswith(("\\restrict", "\\unrestrict"))]
    dump = tmp_path / "toren-0.1.pg.sql"
    dump.write_text("\n".join(kept) + "\n", "utf-8")
    subprocess.run(
        [psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", str(dump)],
        check=True,
        capture_output=True,
        timeout=60,
    )


@pytest.fixture(params=["sqlite", "postgres"])
def v0_1_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(backend, URL) of a private copy of the 0.1 database, not yet opened by today's
    code."""
    if request.param == "sqlite":
        path = tmp_path / "toren-0.1.sqlite"
        shutil.copy(FIXTURES / "toren-0.1.sqlite", path)
        yield "sqlite", f"sqlite:///{path}"
        return
    require_pg()
    name = create_pg_database("toren_v0_1")
    try:
        url = pg_url(name)
        _restore_pg_dump(url, tmp_path)
        yield "postgres", url
    finally:
        drop_pg_database(name)


class Raw:
    """A plain DB-API connection (no Toren code): for the 0.1 queries, frozen as text."""

    def __init__(self, backend: str, url: str) -> None:
        self.backend = backend
        if backend == "sqlite":
            self.conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        else:
            import psycopg

            self.conn = psycopg.connect(url, autocommit=True)

    def x(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        if self.backend == "postgres":
            sql = sql.replace("?", "%s")
        return self.conn.execute(sql, params)

    def all(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.x(sql, params).fetchall()]

    def columns(self, table: str) -> set[str]:
        if self.backend == "sqlite":
            return {r[1] for r in self.all(f"PRAGMA table_info({table})")}
        return {
            r[0]
            for r in self.all(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                (table,),
            )
        }

    def close(self) -> None:
        self.conn.close()


def _ids(backend: str) -> dict[str, str]:
    return {s: r["ids"][backend] for s, r in RUNS.items()}


# The 0.1 columns of each table, in the order 0.1 selects them.
V0_1_SNAPSHOT = {
    "runs": "SELECT id, agent, process, status, input, output, error, idempotency_key, "
    "created_at, updated_at, lease_owner, lease_epoch, lease_expires_at, not_before, "
    "cancel_requested, waiting_for, input_tokens, output_tokens, cost_nanousd, saved_nanousd, "
    "steps, code_version, lease_recoveries, invalidations FROM runs ORDER BY id",
    "events": "SELECT seq, run_id, stream, position, generation, slot, type, digest, "
    "code_version, worker_id, created_at, format_version, payload FROM events ORDER BY seq",
    "blobs": "SELECT hash, body, size FROM blobs ORDER BY hash",
    "inbox": "SELECT id, run_id, name, payload, created_at, consumed_seq FROM inbox ORDER BY id",
    "workers": "SELECT id, code_version, started_at, heartbeat_at, draining, hostname, pid "
    "FROM workers ORDER BY id",
}


async def test_the_0_1_database_upgrades_in_place(v0_1_db: tuple[str, str]) -> None:
    """A normal start (``toren.connect``) migrates the 0.1 database in place: every 0.1 row
    and value intact, today's columns all present, and today's code reads every run and
    event as 0.1 wrote them."""
    backend, url = v0_1_db
    raw = Raw(backend, url)
    before = {t: raw.all(sql) for t, sql in V0_1_SNAPSHOT.items()}
    raw.close()
    assert len(before["runs"]) == len(RUNS)

    store = await toren.connect(url)
    await store.migrate()  # and again: idempotent
    try:
        raw = Raw(backend, url)
        try:
            assert {t: raw.all(sql) for t, sql in V0_1_SNAPSHOT.items()} == before
            for entry in SCHEMA:
                if isinstance(entry, CreateTable):
                    want = {c.name for c in entry.columns}
                    assert want <= raw.columns(entry.table)
                elif isinstance(entry, AddColumn) and entry.dialect in (None, backend):
                    assert entry.column.name in raw.columns(entry.table)
        finally:
            raw.close()
        for scenario, run_id in _ids(backend).items():
            m = RUNS[scenario]
            run = await store.get_run(run_id)
            assert run is not None, scenario
            got = (run.agent, run.process, run.status, run.input, run.output, run.error)
            assert got == (
                m["agent"],
                m["process"],
                m["status"],
                m["input"],
                m["output"],
                m["error"],
            )
            assert (run.lease_owner, run.lease_expires_at) == (
                m["lease_owner"],
                m["lease_expires_at"],
            ), scenario
            assert run.idempotency_key == m["idempotency_key"]
            if m["waits_for"] is not None:
                assert run.waiting_for == m["waits_for"]["messages"]
                assert run.not_before == m["waits_for"]["not_before"]
            events = await store.load_events(run_id)
            assert [e.type for e in events] == m["events"], scenario
            assert not any(isinstance(e.payload, UnknownEvent) for e in events)
        # The dead workers' leases lie in the past of the resume clock.
        for scenario in IN_FLIGHT:
            if RUNS[scenario]["lease_owner"] is not None:
                assert RUNS[scenario]["lease_expires_at"] < RESUME_AT
    finally:
        await store.close()


# -- resuming the in-flight runs ----------------------------------------------------------


class Resume:
    """A LocalWorkerRuntime over the 0.1 database, with today's agents, on a manual clock
    at the manifest's ``resume_at``; counts paid model calls (the scripted provider's
    ledger), sent emails (``SUPPORT_AGENT_OUTBOX``) and notes (``FIXTURE_AGENT_NOTES``)."""

    def __init__(self, store: Store, tmp_path: Path, agent_dirs: list[Path]) -> None:
        self.store = store
        self.tmp = tmp_path
        self.clock = toren.ManualClock(RESUME_AT)
        self.resolver = DirectoryResolver(agent_dirs)
        self.deps = toren.TickDeps(
            store=store,
            agents=self.resolver,
            providers={"scripted": ScriptedProvider()},
            clock=self.clock,
            settings=toren.Settings(poll_interval=0.02),
        )

    @staticmethod
    def environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
        """Set before any provider is built: every scripted provider reads the ledger path
        when it is constructed."""
        monkeypatch.setenv("TOREN_SCRIPTED_LEDGER", str(tmp_path / "ledger.jsonl"))
        monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(tmp_path / "outbox.jsonl"))
        monkeypatch.setenv("FIXTURE_AGENT_NOTES", str(tmp_path / "notes.jsonl"))

    def paid(self) -> int:
        return len(read_ledger(self.tmp / "ledger.jsonl"))

    def emails(self) -> int:
        return len(read_ledger(self.tmp / "outbox.jsonl"))

    def notes(self) -> int:
        return len(read_ledger(self.tmp / "notes.jsonl"))

    def settled(self, run: RunRecord) -> bool:
        """Finished, or parked with nothing due (a timer or message not there yet)."""
        if run.terminal:
            return True
        not_due = run.not_before is None or run.not_before > self.clock.now()
        return run.status == "waiting" and run.lease_owner is None and not_due

    async def until(self, ids: list[str], check: Callable[[Any], bool], what: str) -> None:
        deadline = time.monotonic() + 20
        while True:
            runs = [await self.store.get_run(i) for i in ids]
            if all(r is not None and check(r) for r in runs):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {runs}")
            await asyncio.sleep(0.02)

    async def approve_waiting(self, ids: list[str]) -> list[str]:
        sent = []
        for run_id in ids:
            run = await self.store.get_run(run_id)
            assert run is not None
            if not run.terminal and APPROVAL["name"] in (run.waiting_for or []):
                await self.store.send_message(
                    run_id, APPROVAL["name"], APPROVAL["payload"], now=self.clock.now()
                )
                sent.append(run_id)
        return sent

    async def run_all(self, ids: list[str], after_first_pass: Any = None) -> None:
        """The resume protocol: let the worker take everything that is due; answer the
        runs waiting for 'approve'; move the clock past every timer; answer again; until
        every run is finished."""
        async with toren.LocalWorkerRuntime(self.deps, concurrency=32):
            await self.until(ids, self.settled, "the first pass")
            if after_first_pass is not None:
                await after_first_pass()
            await self.approve_waiting(ids)
            await self.until(ids, self.settled, "the approved runs")
            await self.clock.advance(TIMER_ADVANCE)
            await self.until(ids, self.settled, "the timers")
            await self.approve_waiting(ids)
            await self.until(ids, lambda r: r.terminal, "every run to finish")


@pytest.fixture
def agent_dirs(tmp_path: Path) -> list[Path]:
    """Today's example agent (the real directory) and a copy of the frozen fixture agent."""
    fixture_agent = tmp_path / "agents" / "fixture-agent"
    shutil.copytree(FIXTURES / "agents" / "fixture-agent", fixture_agent)
    return [SUPPORT, fixture_agent]


async def test_in_flight_runs_resume_without_paying_twice(
    v0_1_db: tuple[str, str],
    tmp_path: Path,
    agent_dirs: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every in-flight 0.1 run completes under today's code with the output 0.1 itself
    produced on resume; only the model calls beyond each run's recorded prefix are paid;
    no email (or other side effect) recorded by 0.1 happens again; waiting runs wait for
    their message, and timers fire when due, not before."""
    backend, url = v0_1_db
    ids = _ids(backend)
    flying = [ids[s] for s in IN_FLIGHT]
    Resume.environment(monkeypatch, tmp_path)
    store = await toren.connect(url)
    try:
        before = {s: await store.load_events(ids[s]) for s in IN_FLIGHT}
        resume = Resume(store, tmp_path, agent_dirs)

        async def first_pass() -> None:
            # Nothing was due for the runs parked on a timer; the message run waits.
            timer = await store.get_run(ids["fixture_waiting_timer"])
            assert timer is not None and timer.status == "waiting"
            assert len(await store.load_events(timer.id)) == len(before["fixture_waiting_timer"])
            message = await store.get_run(ids["fixture_waiting_message"])
            assert message is not None and message.status == "waiting"
            assert message.waiting_for == [APPROVAL["name"]]
            for s in (
                "support_queued",
                "support_crashed_after_lookup",
                "fixture_crashed_after_message",
            ):
                run = await store.get_run(ids[s])
                assert run is not None and run.status == "completed", s

        await resume.run_all(flying, first_pass)

        for scenario in IN_FLIGHT:
            m, expected = RUNS[scenario], RUNS[scenario]["resume"]
            run = await store.get_run(ids[scenario])
            assert run is not None
            assert (run.status, run.output) == ("completed", expected["expected_output"]), scenario
            events = await store.load_events(ids[scenario])
            old = before[scenario]
            # The recorded prefix is untouched and replayed, not written again.
            assert [(e.seq, e.type, e.digest) for e in events[: len(old)]] == [
                (e.seq, e.type, e.digest) for e in old
            ]
            new = events[len(old) :]
            assert not any(e.type == "StreamInvalidated" for e in new), scenario
            calls = [e for e in events if e.type == "ModelCallRecorded"]
            assert len(calls) == m["model_calls_recorded"] + expected["model_calls_on_resume"]
            slots = [(e.stream, e.position) for e in calls]
            assert len(slots) == len(set(slots)), f"{scenario}: a model call was recorded twice"
            if m["lease_owner"] is not None:
                assert run.lease_recoveries >= 1  # taken over from the dead worker
            # verify: what 0.1 wrote is not covered by the chain or response digests;
            # what today's code added is, the chain starting after the 0.1 prefix.
            report = await toren.verify_run(store, ids[scenario])
            assert report.ok, (scenario, report.to_dict())
            chain = report.chain
            assert (chain.not_covered, chain.linked) == (len(old), len(new)), scenario
            old_seqs = {e.seq for e in old}
            for check in report.checks:
                if check.kind in ("model", "tool"):
                    covered = "not covered" if check.seq in old_seqs else "verified"
                    assert check.response == covered, (scenario, check)
        assert resume.paid() == sum(RUNS[s]["resume"]["model_calls_on_resume"] for s in IN_FLIGHT)
        assert resume.emails() == sum(RUNS[s]["resume"]["emails_on_resume"] for s in IN_FLIGHT)
        assert resume.notes() == sum(RUNS[s]["resume"]["notes_on_resume"] for s in IN_FLIGHT)
        # The run whose email 0.1 already sent: nothing sent again, one call paid.
        assert RUNS["support_drained_then_crashed"]["emails_recorded"] == 1
        assert RUNS["support_drained_then_crashed"]["resume"]["emails_on_resume"] == 0
        # The finished runs are left alone.
        for scenario, m in RUNS.items():
            if scenario not in IN_FLIGHT:
                run = await store.get_run(ids[scenario])
                assert run is not None and run.status == m["status"]
                assert [e.type for e in await store.load_events(ids[scenario])] == m["events"]
    finally:
        await store.close()
        resume.resolver.close()


# -- the replay plan ----------------------------------------------------------------------


def _edited_support(tmp_path: Path) -> Path:
    """A copy of today's example agent with its prompt edited (the manifest's edit)."""
    edited = tmp_path / "edited" / "support-agent"
    shutil.copytree(SUPPORT, edited, ignore=shutil.ignore_patterns("__pycache__"))
    edit = MANIFEST["prompt_edit"]
    with open(edited / edit["file"], "a", encoding="utf-8") as fh:
        fh.write(edit["appended"])
    return edited


async def test_plan_is_clean_then_predicts_the_prompt_edit_exactly(
    v0_1_db: tuple[str, str],
    tmp_path: Path,
    agent_dirs: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    backend, url = v0_1_db
    ids = _ids(backend)
    Resume.environment(monkeypatch, tmp_path)
    store = await toren.connect(url)
    resolvers: list[DirectoryResolver] = []
    try:
        # Today's agents: every in-flight run replays cleanly, and planning pays nothing.
        current = DirectoryResolver(agent_dirs)
        resolvers.append(current)
        plans = await plan_runs(store, current)
        assert sorted(p.run_id for p in plans) == sorted(ids[s] for s in IN_FLIGHT)
        for plan in plans:
            assert plan.clean, plan.to_dict()
        # An edited prompt: the plan names the streams and positions to invalidate.
        edited = DirectoryResolver([_edited_support(tmp_path), agent_dirs[1]])
        resolvers.append(edited)
        plans = {p.run_id: p for p in await plan_runs(store, edited)}
        predicted: dict[str, set[tuple[Any, ...]]] = {}
        for scenario in IN_FLIGHT:
            plan = plans[ids[scenario]]
            assert plan.problem is None
            findings = [
                {"stream": f.stream, "from_pos": f.from_pos, "cause": f.cause}
                for f in plan.findings
            ]
            assert findings == RUNS[scenario]["plan_after_prompt_edit"], scenario
            predicted[scenario] = {
                (f.stream, f.from_pos, f.expected_digest, f.actual_digest) for f in plan.findings
            }
        assert any(predicted.values()) and not all(predicted.values())
        assert not os.path.exists(tmp_path / "ledger.jsonl")  # nothing was executed

        # The real resume under the edited prompt writes exactly those invalidations.
        before = {s: len(await store.load_events(ids[s])) for s in IN_FLIGHT}
        resume = Resume(store, tmp_path, [])
        resume.deps.agents = edited
        await resume.run_all([ids[s] for s in IN_FLIGHT])
        for scenario in IN_FLIGHT:
            run = await store.get_run(ids[scenario])
            assert run is not None and run.status == "completed", scenario
            new = (await store.load_events(ids[scenario]))[before[scenario] :]
            written = {
                (e.stream, e.payload.from_pos, e.payload.expected_digest, e.payload.actual_digest)  # type: ignore[attr-defined]
                for e in new
                if e.type == "StreamInvalidated"
            }
            assert written == predicted[scenario], scenario
        # A prompt edit never re-sends an email 0.1 sent: the same emails as a clean resume.
        assert resume.emails() == sum(RUNS[s]["resume"]["emails_on_resume"] for s in IN_FLIGHT)
    finally:
        await store.close()
        for r in resolvers:
            r.close()


# -- rollback safety: the 0.1 queries, frozen -------------------------------------------
#
# Copied as text from src/toren/store/sql.py, sqlite.py and postgres.py of release 0.1.0.
# NEVER EDIT: they are what a 0.1 worker sends. They must keep working against every
# later schema, so that stepping back to 0.1 after an upgrade leaves the data usable.

Q01_RUN_COLUMNS = (
    "id, agent, process, status, input, output, error, idempotency_key, created_at, "
    "updated_at, lease_owner, lease_epoch, lease_expires_at, not_before, cancel_requested, "
    "waiting_for, input_tokens, output_tokens, cost_nanousd, saved_nanousd, steps, "
    "code_version, lease_recoveries, invalidations"
)
Q01_SELECT_RUN = f"SELECT {Q01_RUN_COLUMNS} FROM runs WHERE id = ?"
Q01_SELECT_RUN_BY_KEY = f"SELECT {Q01_RUN_COLUMNS} FROM runs WHERE idempotency_key = ?"
Q01_LIST_RUNS = f"SELECT {Q01_RUN_COLUMNS} FROM runs WHERE status = ? ORDER BY id DESC LIMIT ?"
Q01_INSERT_RUN = (
    "INSERT INTO runs (id, agent, process, status, input, idempotency_key, "
    "created_at, updated_at) VALUES (?, ?, ?, 'queued', ?, ?, ?, ?)"
)
Q01_STATS_BY_STATUS = "SELECT status, COUNT(id) FROM runs GROUP BY status"
Q01_STATS_TOTALS = (
    "SELECT COALESCE(SUM(steps), 0), COALESCE(SUM(input_tokens), 0), "
    "COALESCE(SUM(output_tokens), 0), COALESCE(SUM(cost_nanousd), 0), "
    "COALESCE(SUM(saved_nanousd), 0), COALESCE(SUM(lease_recoveries), 0), "
    "COALESCE(SUM(invalidations), 0) FROM runs"
)
Q01_EVENT_COLUMNS = (
    "seq, run_id, stream, position, generation, slot, type, digest, code_version, "
    "worker_id, created_at, format_version, payload"
)
Q01_LOAD_EVENTS = (
    f"SELECT {Q01_EVENT_COLUMNS} FROM events WHERE run_id = ? AND seq > ? ORDER BY seq"
)
Q01_INSERT_EVENT = (
    "INSERT INTO events (run_id, stream, position, generation, slot, type, digest, "
    "code_version, worker_id, created_at, format_version, payload) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING seq"
)
Q01_INSERT_BLOBS = (
    "INSERT INTO blobs (hash, body, size) VALUES (?, ?, ?) ON CONFLICT (hash) DO NOTHING"
)
Q01_GET_BLOBS = "SELECT hash, body FROM blobs WHERE hash IN (?)"
Q01_CLAIMABLE = (
    "((status IN ('queued', 'running') AND (not_before IS NULL OR not_before <= ?)) "
    "OR (status = 'waiting' AND not_before IS NOT NULL AND not_before <= ?)) "
    "AND (lease_owner IS NULL OR lease_expires_at IS NULL OR lease_expires_at < ?)"
)
Q01_CLAIM_SELECT_SQLITE = (
    f"SELECT id, lease_owner, lease_epoch, status FROM runs WHERE {Q01_CLAIMABLE} "
    "AND id = ? ORDER BY COALESCE(not_before, created_at) LIMIT ?"
)
Q01_CLAIM_UPDATE_SQLITE = (
    "UPDATE runs SET lease_owner = ?, lease_epoch = ?, lease_expires_at = ?, "
    "status = 'running', "
    "lease_recoveries = lease_recoveries + ? WHERE id = ?"
)
Q01_CLAIM_POSTGRES = (
    "UPDATE runs SET lease_owner = ?, lease_epoch = runs.lease_epoch + 1, "
    "lease_expires_at = ?, "
    "status = 'running', "
    "lease_recoveries = runs.lease_recoveries + "
    "CASE WHEN c.lease_owner IS NULL THEN 0 ELSE 1 END "
    f"FROM (SELECT id, lease_owner, status FROM runs WHERE {Q01_CLAIMABLE} "
    "AND id = ? ORDER BY COALESCE(not_before, created_at) LIMIT ? "
    "FOR UPDATE SKIP LOCKED) c "
    "WHERE runs.id = c.id RETURNING runs.id, runs.lease_epoch, c.lease_owner, c.status"
)
Q01_FENCE_CHECK = "SELECT lease_owner, lease_epoch FROM runs WHERE id = ?"
Q01_FENCE_UPDATE = (
    "UPDATE runs SET updated_at = ?, input_tokens = input_tokens + ?, "
    "output_tokens = output_tokens + ?, cost_nanousd = cost_nanousd + ?, "
    "saved_nanousd = saved_nanousd + ?, steps = steps + ?, "
    "invalidations = invalidations + ?, code_version = COALESCE(?, code_version) "
    "WHERE id = ? AND lease_owner = ? AND lease_epoch = ?"
)
Q01_RENEW_UPDATE = "UPDATE runs SET lease_expires_at = ? WHERE lease_owner = ? AND id IN (?)"
Q01_RENEW_SELECT = "SELECT id, cancel_requested FROM runs WHERE lease_owner = ? AND id IN (?)"
Q01_EXPIRE_LEASES = "UPDATE runs SET lease_expires_at = ? WHERE lease_owner = ?"
Q01_RELEASE = (
    "UPDATE runs SET status = ?, not_before = ?, waiting_for = ?, output = ?, "
    "error = ?, lease_owner = NULL, lease_expires_at = NULL, updated_at = ? "
    "WHERE id = ?"
)
Q01_RELEASE_WAKE = (
    "UPDATE runs SET not_before = ? WHERE id = ? AND EXISTS (SELECT 1 FROM "
    "inbox WHERE inbox.run_id = ? AND inbox.consumed_seq IS NULL AND "
    "inbox.name IN (?))"
)
Q01_CONSUME_INBOX = "UPDATE inbox SET consumed_seq = ? WHERE id = ? AND consumed_seq IS NULL"
Q01_SEND_STATUS = "SELECT status FROM runs WHERE id = ?"
Q01_SEND_INSERT = (
    "INSERT INTO inbox (run_id, name, payload, created_at) VALUES (?, ?, ?, ?) RETURNING id"
)
Q01_SEND_WAKE = "UPDATE runs SET not_before = ? WHERE id = ? AND status = 'waiting'"
Q01_NEXT_MESSAGE = (
    "SELECT id, run_id, name, payload, created_at FROM inbox WHERE run_id = ? "
    "AND consumed_seq IS NULL AND name IN (?) ORDER BY id LIMIT 1"
)
Q01_REQUEST_CANCEL = (
    "UPDATE runs SET cancel_requested = 1, updated_at = ?, "
    "not_before = CASE WHEN lease_owner IS NULL THEN ? ELSE not_before END "
    "WHERE id = ? AND status NOT IN ('completed', 'failed', 'cancelled')"
)
Q01_REGISTER_WORKER = (
    "INSERT INTO workers (id, code_version, started_at, heartbeat_at, draining, "
    "hostname, pid) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET "
    "code_version = excluded.code_version, started_at = excluded.started_at, "
    "heartbeat_at = excluded.heartbeat_at, draining = excluded.draining, "
    "hostname = excluded.hostname, pid = excluded.pid"
)
Q01_HEARTBEAT = "UPDATE workers SET heartbeat_at = ?, draining = ? WHERE id = ?"
Q01_LIVE_WORKERS = (
    "SELECT id, code_version, started_at, heartbeat_at, draining, hostname, pid "
    "FROM workers WHERE heartbeat_at >= ? ORDER BY started_at"
)


def _claim_0_1(raw: Raw, worker: str, run_id: str, now: float) -> list[tuple[Any, ...]]:
    """A 0.1 worker's claim of one run: (run id, new epoch, previous owner, status)."""
    if raw.backend == "postgres":
        return raw.all(Q01_CLAIM_POSTGRES, (worker, now + 30, now, now, now, run_id, 1))
    out = []
    raw.x("BEGIN IMMEDIATE")
    for rid, owner, epoch, status in raw.all(Q01_CLAIM_SELECT_SQLITE, (now, now, now, run_id, 1)):
        raw.x(Q01_CLAIM_UPDATE_SQLITE, (worker, epoch + 1, now + 30, int(owner is not None), rid))
        out.append((rid, epoch + 1, owner, status))
    raw.x("COMMIT")
    return out


async def test_0_1_queries_run_against_todays_schema(v0_1_db: tuple[str, str]) -> None:
    """Rollback safety: after today's code has migrated the 0.1 database, a 0.1 worker's
    queries (frozen text above) still read every row and drive a run through its whole
    life: create, claim, record, park, receive a message, finish. Today's code then reads
    what the old queries wrote."""
    backend, url = v0_1_db
    store = await toren.connect(url)  # today's migration
    await store.close()
    raw = Raw(backend, url)
    now = RESUME_AT + 10_000
    try:
        # Reads of 0.1 rows.
        for scenario, run_id in _ids(backend).items():
            row = raw.all(Q01_SELECT_RUN, (run_id,))[0]
            assert (row[0], row[1], row[2], row[3]) == (
                run_id,
                RUNS[scenario]["agent"],
                RUNS[scenario]["process"],
                RUNS[scenario]["status"],
            )
            events = raw.all(Q01_LOAD_EVENTS, (run_id, 0))
            assert [e[6] for e in events] == RUNS[scenario]["events"]
            key = raw.all(Q01_SELECT_RUN_BY_KEY, (RUNS[scenario]["idempotency_key"],))
            assert key[0][0] == run_id
        by_status = dict(raw.all(Q01_STATS_BY_STATUS))
        assert sum(by_status.values()) == len(RUNS)
        assert raw.all(Q01_STATS_TOTALS)[0][0] > 0
        waiting = raw.all(Q01_LIST_RUNS, ("waiting", 50))
        assert len(waiting) == by_status["waiting"]
        some_hash = _lines("blobs.jsonl")[0]["hash"]
        assert raw.all(Q01_GET_BLOBS, (some_hash,))[0][0] == some_hash

        # A whole run, written by 0.1's queries.
        rid, worker = "run_written_by_0_1_queries", "w-0.1-rollback"
        raw.x(Q01_REGISTER_WORKER, (worker, "v0.1", now, now, 0, "host", 1))
        raw.x(Q01_HEARTBEAT, (now, 0, worker))
        assert [w[0] for w in raw.all(Q01_LIVE_WORKERS, (now - 30,))] == [worker]
        raw.x(Q01_INSERT_RUN, (rid, "fixture-agent", "main", '{"task":"rb"}', "rb-key", now, now))
        started = '{"agent":"fixture-agent","process":"main","input":{"task":"rb"}}'
        ev = ("", None, 0, "run:start", "RunStarted", None, "v0.1", "", now, 1, started)
        raw.all(Q01_INSERT_EVENT, (rid, *ev))
        ((_, epoch, owner, status),) = _claim_0_1(raw, worker, rid, now)
        assert (owner, status) == (None, "queued")
        assert raw.all(Q01_FENCE_CHECK, (rid,))[0] == (worker, epoch)
        raw.x(Q01_INSERT_BLOBS, ("h-0.1", '{"role":"user","content":"hi"}', 30))
        raw.x(Q01_INSERT_BLOBS, ("h-0.1", '{"role":"user","content":"hi"}', 30))  # idempotent
        value = request_digest("value", {"what": "now"})
        step = ("main", 0, 0, "main#0:0", "ValueRecorded", value, "v0.1", worker, now, 1)
        (seq,) = raw.all(Q01_INSERT_EVENT, (rid, *step, json.dumps({"what": "now", "value": now})))[
            0
        ]
        cur = raw.x(Q01_FENCE_UPDATE, (now, 0, 0, 0, 0, 1, 0, "v0.1", rid, worker, epoch))
        assert cur.rowcount == 1
        raw.x(Q01_RENEW_UPDATE, (now + 30, worker, rid))
        assert raw.all(Q01_RENEW_SELECT, (worker, rid)) == [(rid, 0)]
        waiting_ev = ("", None, 0, None, "RunWaiting", None, "v0.1", worker, now, 1)
        raw.all(Q01_INSERT_EVENT, (rid, *waiting_ev, '{"not_before":null,"messages":["go"]}'))
        raw.x(Q01_RELEASE, ("waiting", None, '["go"]', None, None, now, rid))
        raw.x(Q01_RELEASE_WAKE, (now, rid, rid, "go"))
        assert raw.all(Q01_SEND_STATUS, (rid,)) == [("waiting",)]
        ((msg_id,),) = raw.all(Q01_SEND_INSERT, (rid, "go", '{"ok":true}', now + 1))
        raw.x(Q01_SEND_WAKE, (now + 1, rid))
        ((_, epoch, _, status),) = _claim_0_1(raw, worker, rid, now + 2)
        assert status == "waiting"
        assert raw.all(Q01_NEXT_MESSAGE, (rid, "go"))[0][:3] == (msg_id, rid, "go")
        got = ("main", 1, 0, "main#0:1", "MessageReceived", None, "v0.1", worker, now + 2, 1)
        payload = json.dumps({"name": "go", "payload": {"ok": True}, "inbox_id": msg_id})
        ((got_seq,),) = raw.all(Q01_INSERT_EVENT, (rid, *got, payload))
        assert raw.x(Q01_CONSUME_INBOX, (got_seq, msg_id)).rowcount == 1
        done = ("", None, 0, "run:end", "RunCompleted", None, "v0.1", worker, now + 3, 1)
        raw.all(Q01_INSERT_EVENT, (rid, *done, '{"output":{"ok":true}}'))
        raw.x(Q01_RELEASE, ("completed", None, None, '{"ok":true}', None, now + 3, rid))
        assert raw.x(Q01_EXPIRE_LEASES, (now, worker)).rowcount == 0  # nothing still held
        # Cancelling a 0.1 run that is still queued.
        queued = _ids(backend)["fixture_queued"]
        assert raw.x(Q01_REQUEST_CANCEL, (now, now, queued)).rowcount == 1
        assert seq < got_seq
    finally:
        raw.close()

    # Today's code reads what the 0.1 queries wrote.
    store = await toren.connect(url)
    try:
        run = await store.get_run(rid)
        assert run is not None
        assert (run.status, run.output, run.process, run.steps) == (
            "completed",
            {"ok": True},
            "main",
            1,
        )
        assert run.idempotency_key == "rb-key" and run.lease_owner is None
        events = await store.load_events(rid)
        assert [e.type for e in events] == [
            "RunStarted",
            "ValueRecorded",
            "RunWaiting",
            "MessageReceived",
            "RunCompleted",
        ]
        assert await store.next_message(rid, ["go"]) is None  # consumed
        cancelled = await store.get_run(_ids(backend)["fixture_queued"])
        assert cancelled is not None and cancelled.cancel_requested
    finally:
        await store.close()


def test_toren_plan_cli_on_the_0_1_database(tmp_path: Path) -> None:
    """`toren plan` itself (the command a deploy pipeline runs) against a copy of the 0.1
    SQLite database with today's example agents: clean, then, after the manifest's prompt
    edit, the invalidations the real resume produces (see the test above) and exit 6."""
    from click.testing import CliRunner

    from toren.cli.main import cli

    db = tmp_path / "toren-0.1.sqlite"
    shutil.copy(FIXTURES / "toren-0.1.sqlite", db)
    agents = tmp_path / "agents"
    shutil.copytree(SUPPORT, agents / "support-agent", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(FIXTURES / "agents" / "fixture-agent", agents / "fixture-agent")
    args = ["plan", "--agents", str(agents), "--database-url", f"sqlite:///{db}"]
    in_flight = sum(1 for r in MANIFEST["runs"] if r["status"] in ("queued", "running", "waiting"))

    clean = CliRunner().invoke(cli, [*args, "--fail-on-invalidation"])
    assert clean.exit_code == 0, clean.output
    assert (
        f"{in_flight} runs in flight: {in_flight} replay cleanly, 0 would be invalidated"
        in clean.output
    )

    edit = MANIFEST["prompt_edit"]
    with open(agents / "support-agent" / edit["file"], "a", encoding="utf-8") as fh:
        fh.write(edit["appended"])
    report = CliRunner().invoke(cli, [*args, "--json"])
    data = json.loads(report.stdout)
    found = {
        p["run_id"]: [
            {"stream": f["stream"], "from_pos": f["from_pos"], "cause": f["cause"]}
            for f in p["findings"]
        ]
        for p in data["plans"]
    }
    expected = {
        r["ids"]["sqlite"]: r["plan_after_prompt_edit"]
        for r in MANIFEST["runs"]
        if r["status"] in ("queued", "running", "waiting")
    }
    assert found == expected  # exactly what the real resume invalidates (test above)
    gate = CliRunner().invoke(cli, [*args, "--fail-on-invalidation"])
    assert gate.exit_code == 6
