"""Running a corpus scenario against a store, and writing down what it left in the database.

A :class:`Harness` drives one scenario script (start runs, tick them under a code version,
send messages, move the clock, cancel, retry, fork, register workers) and records every
tick's outcome and, before every tick, the replay plan of the run under the version the
tick runs (``plan_report``, the API ``toren plan`` uses). :func:`snapshot` then reads the
database directly (its own connection, named columns: the rows exactly as stored) and
normalises what is not deterministic (see ``README.md`` and :data:`NORMALISED`).

:func:`load_log` does the reverse for the replay test: it writes a fixture's log into a
fresh database with plain SQL, the seq references in its payloads pointing at the rows
as they are inserted there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import toren
from toren.core.contract.audit import RESPONSE_FIELDS, response_digest
from toren.core.drivers.plan import plan_report
from toren.core.drivers.runs import new_run_id
from toren.core.drivers.sticky import StickyRuns
from toren.providers.base import Usage
from toren.providers.scripted import ScriptedProvider
from toren.store import Store, WorkerInfo

FORMAT = 1
ROOT = Path(__file__).resolve().parents[2]  # the repository (worktree) root
FIXTURES = ROOT / "tests" / "fixtures" / "corpus"
START = 1_700_000_000.0  # the ManualClock's start: payload times are relative to it
WORKER = "corpus-worker"

# The model every scenario talks to: echoes the last user message, fails on "[fail]",
# asks for a tool on "[call]". Deterministic: the reply depends only on the request.
SCRIPT: Mapping[str, Any] = {
    "rules": [
        {"when": {"last_user_contains": "[fail]"}, "reply": {"error": "overloaded", "status": 503}},
        {
            "when": {"last_user_contains": "[call]"},
            "reply": {
                "text": "calling",
                "tool_calls": [{"id": "c1", "name": "lookup", "arguments": {"key": "k1"}}],
            },
        },
    ],
    "default": {"text": "echo: {last_user}"},
}


def price(_model: str, usage: Usage) -> Decimal:
    return Decimal("0.0001") * (usage.input_tokens + usage.output_tokens)


class World:
    """What the scenario's tools did (their side effects), counted across code versions."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.sent: list[dict[str, Any]] = []
        self.hanging: asyncio.Event | None = None  # set by a tool that hangs (a crash)


Build = Callable[[World], toren.Registry]


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    features: tuple[str, ...]
    versions: Mapping[str, Build]
    script: Callable[[Harness], Awaitable[None]]


@dataclass
class RunRef:
    name: str
    id: str


@dataclass
class Harness:
    """One scenario on one store. Scripts call its methods; it records as it goes."""

    scenario: Scenario
    store: Store
    url: str
    world: World = field(default_factory=World)
    clock: toren.ManualClock = field(default_factory=lambda: toren.ManualClock(START))
    provider: ScriptedProvider = field(default_factory=lambda: ScriptedProvider(SCRIPT))
    runs: dict[str, RunRef] = field(default_factory=dict)
    ticks: list[dict[str, Any]] = field(default_factory=list)
    plans: list[dict[str, Any]] = field(default_factory=list)
    last_version: dict[str, str] = field(default_factory=dict)
    messages: dict[int, str] = field(default_factory=dict)  # inbox id -> "m<k>"
    started_at: dict[str, float] = field(default_factory=dict)  # version -> worker start
    workers: dict[str, WorkerInfo] = field(default_factory=dict)
    _registries: dict[str, toren.Registry] = field(default_factory=dict)
    # A sticky cache (toren.core.drivers.sticky): parked runs continue in place when the
    # next tick runs the same code under the same deps, as on one long-lived worker.
    sticky: StickyRuns | None = None
    _deps: dict[tuple[str, float | None], toren.TickDeps] = field(default_factory=dict)

    def registry(self, version: str) -> toren.Registry:
        if version not in self._registries:
            self._registries[version] = self.scenario.versions[version](self.world)
        return self._registries[version]

    def deps(self, version: str) -> toren.TickDeps:
        key = (version, self.started_at.get(version))
        if key not in self._deps:
            self._deps[key] = toren.TickDeps(
                store=self.store,
                agents=self.registry(version),
                providers={"scripted": self.provider},
                clock=self.clock,
                worker_id=WORKER,
                worker_started_at=self.started_at.get(version),
                pricing=price,
                sticky=self.sticky,
            )
        return self._deps[key]

    async def start(
        self, version: str, input: Any = None, *, name: str = "r1", process: str = "main"
    ) -> RunRef:
        record = await toren.start_run(
            self.store, self.registry(version), "corpus", input, process=process, clock=self.clock
        )
        return self._add(name, _run_id(record))

    def _add(self, name: str, run_id: str) -> RunRef:
        assert name not in self.runs, f"run name {name!r} used twice"
        ref = self.runs[name] = RunRef(name, run_id)
        return ref

    async def tick(self, run: RunRef, version: str, *, plan: bool = True) -> toren.TickResult:
        """One tick of ``run`` under ``version``. Before it, the replay plan of the run
        under that version, and after it the invalidations the tick wrote: the two are
        compared by the corpus test (``plan=False``: a tick the plan cannot foresee, such
        as one the invalidation-storm guard stops)."""
        await self._heartbeats()
        before = await self._seq_count(run)
        predicted = await self._plan(run, version) if plan else None
        served, calls = self.provider.served, len(self.world.calls)
        result = await toren.tick(run.id, self.deps(version))
        self.last_version[run.name] = version
        self.ticks.append(
            {
                "run": run.name,
                "version": version,
                # What the tick paid for and did outside the log (a step in flight at a
                # crash runs again without a trace in the log, for instance).
                "model_calls": self.provider.served - served,
                "tool_calls": self.world.calls[calls:],
                "status": result.status,
                "output": result.output,
                "error": result.error,
                "not_before": result.not_before,
                "replayed": result.replayed,
                "executed": result.executed,
                "invalidations": result.invalidations,
            }
        )
        if predicted is not None:
            events = (await self.store.load_events(run.id))[before:]
            written = [
                _inv(e.stream, e.payload.to_dict())
                for e in events
                if e.type == "StreamInvalidated" and e.payload.cause != "parent_invalidated"  # type: ignore[attr-defined]
            ]
            self.plans.append(
                {
                    "tick": len(self.ticks) - 1,
                    "run": run.name,
                    "version": version,
                    "plan": predicted,
                    "written": written,
                }
            )
        return result

    async def _heartbeats(self) -> None:
        for info in self.workers.values():  # live: a heartbeat before every tick
            await self.store.register_worker(replace(info, heartbeat_at=self.clock.now()))

    async def _seq_count(self, run: RunRef) -> int:
        return len(await self.store.load_events(run.id))

    async def _plan(self, run: RunRef, version: str) -> dict[str, Any] | None:
        record = await self.store.get_run(run.id)
        if record is None or record.status not in ("queued", "running", "waiting"):
            return None
        report = await plan_report(self.store, self.registry(version))
        (found,) = [p for p in report["plans"] if p["run_id"] == run.id]
        keep = ("clean", "code_version", "replayed_steps", "findings", "problem", "streams")
        return {k: found[k] for k in keep}

    async def crash(self, run: RunRef, version: str) -> None:
        """A tick whose worker dies while a tool runs (the tool awaits ``world.hanging``,
        which the script's tool sets): nothing of that step is written; the lease is
        left to expire, and the clock moved past it."""
        self.world.hanging = asyncio.Event()
        await self._heartbeats()
        served, calls = self.provider.served, len(self.world.calls)
        task = asyncio.ensure_future(toren.tick(run.id, self.deps(version)))
        await self.world.hanging.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.world.hanging = None
        self.ticks.append(
            {
                "run": run.name,
                "version": version,
                "model_calls": self.provider.served - served,
                "tool_calls": self.world.calls[calls:],
                "status": "crashed",
            }
        )
        self.last_version[run.name] = version
        await self.clock.advance(toren.Settings().lease.ttl + 1)

    def inject(self, run: RunRef, type_: str, payload: str, stream: str = "") -> None:
        """An event of a type this release does not know, as a newer one would write it."""
        sql = (
            "INSERT INTO events (run_id, stream, type, created_at, payload) VALUES (?, ?, ?, ?, ?)"
        )
        db = RawDB(self.url)
        try:
            db.write([(sql, (run.id, stream, type_, self.clock.now(), payload))])
        finally:
            db.close()

    async def send(self, run: RunRef, name: str, payload: Any = None) -> None:
        inbox_id = await self.store.send_message(run.id, name, payload, now=self.clock.now())
        self.messages[inbox_id] = f"m{len(self.messages) + 1}"

    async def advance(self, seconds: float) -> None:
        await self.clock.advance(seconds)

    async def cancel(self, run: RunRef) -> None:
        await self.store.request_cancel(run.id, now=self.clock.now())

    async def retry(self, run: RunRef, version: str, **limits: Any) -> None:
        await toren.retry_run(
            self.store, self.registry(version), run.id, clock=self.clock, **limits
        )

    async def fork(self, run: RunRef, version: str, at: str, name: str, **kw: Any) -> RunRef:
        record = await toren.fork_run(
            self.store, self.registry(version), run.id, at=at, clock=self.clock, **kw
        )
        return self._add(name, _run_id(record))

    async def worker(self, worker_id: str, version: str, started_at: float) -> None:
        """A live worker of ``version`` (the invalidation-storm guard reads them)."""
        now = self.clock.now()
        info = WorkerInfo(worker_id, version, started_at=started_at, heartbeat_at=now)
        self.workers[worker_id] = info
        await self.store.register_worker(info)
        self.started_at[version] = max(started_at, self.started_at.get(version, started_at))


def _run_id(started: Any) -> str:
    """The id of a run ``start_run``/``fork_run`` returned: a run record (main), or a
    (record, created) pair (issue 19 plans that shape for ``start_run``)."""
    record = started[0] if isinstance(started, tuple) else started
    return str(record.id)


def _inv(stream: str, payload: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("from_pos", "cause", "expected_digest", "actual_digest", "expected_kind")
    return {"stream": stream, **{k: payload.get(k) for k in (*keys, "actual_kind")}}


# -- reading the database ------------------------------------------------------------------

EVENT_SQL = (
    "SELECT seq, run_id, stream, position, generation, slot, type, digest, code_version, "
    "worker_id, created_at, format_version, payload FROM events ORDER BY seq"
)
BLOB_SQL = "SELECT hash, body FROM blobs ORDER BY hash"


class RawDB:
    """Plain SQL on the scenario's database, beside the store: rows exactly as stored.
    One connection, opened on first use; :meth:`close` it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.pg = url.startswith("postgresql")
        self._conn: Any = None

    def _connection(self) -> Any:
        if self._conn is None:
            if self.pg:
                import psycopg

                self._conn = psycopg.connect(self.url, autocommit=True)
            else:
                path = self.url.removeprefix("sqlite:///")
                self._conn = sqlite3.connect(path, isolation_level=None)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self.pg:
            sql = sql.replace("?", "%s")
        return [tuple(r) for r in self._connection().execute(sql, params).fetchall()]

    def write(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        conn = self._connection()
        if self.pg:
            with conn.transaction():
                for sql, params in statements:
                    conn.execute(sql.replace("?", "%s"), params)
            return
        conn.execute("BEGIN")
        for sql, params in statements:
            conn.execute(sql, params)
        conn.execute("COMMIT")


# -- normalisation -------------------------------------------------------------------------

# What is normalised, and why each is not deterministic (README.md says the same):
NORMALISED = {
    "seq": "physical sequence shared by every run of a database (and PostgreSQL sequences "
    "may skip values): replaced by n, the event's 1-based index in its run's log; payload "
    "fields holding seqs (reused_from_seq, failed_seqs, retried_seqs, failed_seq, "
    "source_seq) become '@n' of the run they point into",
    "run_id": "random (time plus os.urandom): replaced by the scenario's name for the run, "
    "in the envelope and inside every payload string (source_run, error messages)",
    "worker_id": "the worker's identity, not part of the log's meaning: dropped",
    "created_at": "wall-clock time of the write: dropped (payload times come from the "
    "scenario's ManualClock and are kept)",
    "latency_ms": 'measured with time.perf_counter: replaced by "*"',
    "inbox_id": "the inbox row's id (a database sequence): replaced by 'm<k>', the k-th "
    "message the scenario sent",
    "ValueRecorded.value (random, uuid)": "random.random() and uuid4(): replaced by "
    '"<random>" / "<uuid>" (a \'now\' value comes from the ManualClock and is kept)',
    "response_digest": "(since 0.2) a digest over the answer, error and usage, which hold "
    "run ids and tracebacks: checked to re-derive from the payload (docs/digest.md §6), "
    "then left out, so the fixtures recorded before it still pin every other byte",
    "traceback": "absolute paths of the checkout and line numbers of the scenario file: "
    "the checkout root becomes <root> and 'line N' becomes 'line #'",
}

_NUM = r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_LATENCY = re.compile(rf'"latency_ms":{_NUM}')
_ONE_SEQ = re.compile(r'"(reused_from_seq|failed_seq|source_seq)":(\d+)')
_SEQ_LIST = re.compile(r'"(failed_seqs|retried_seqs)":\[([\d,]*)\]')
_INBOX = re.compile(r'"inbox_id":(\d+)')
# A traceback frame in JSON text: File \"<path>\", line 12, in fn
_LINE = re.compile(r'(File \\"[^"\\]*\\", line )\d+')
_RANDOM = re.compile(rf'^\{{"what":"random","value":{_NUM}\}}$')
_UUID = re.compile(r'^\{"what":"uuid","value":"[0-9a-f-]{36}"\}$')


@dataclass
class Names:
    """Run ids to names, seqs to (run, index), inbox ids to message names."""

    runs: dict[str, str]
    seq_at: dict[int, tuple[str, int]]
    messages: dict[int, str]

    def text(self, text: str, *, run: str, type_: str | None = None) -> str:
        """Run ids, the checkout's path and traceback line numbers anywhere; the fields
        of the envelope's own kind (latencies, seq references, inbox ids) only in the
        payload types that have them (``type_``; None: a tick's or run row's value)."""
        for run_id, name in self.runs.items():
            text = text.replace(run_id, run_token(name))
        text = text.replace(str(ROOT), "<root>")
        text = _LINE.sub(r"\1#", text)
        if type_ in ("ModelCallRecorded", "ToolCallRecorded"):
            text = _LATENCY.sub('"latency_ms":"*"', text)
        if type_ in ("ToolCallRecorded", "RunRetried", "RunForked", "RunFailed"):
            text = _ONE_SEQ.sub(lambda m: f'"{m[1]}":"{self.seq(int(m[2]), run)}"', text)
            text = _SEQ_LIST.sub(
                lambda m: (
                    f'"{m[1]}":['
                    + ",".join(f'"{self.seq(int(s), run)}"' for s in m[2].split(",") if s)
                    + "]"
                ),
                text,
            )
        if type_ == "MessageReceived":
            text = _INBOX.sub(lambda m: f'"inbox_id":"{self.messages.get(int(m[1]), "m?")}"', text)
        return text

    def seq(self, seq: int, run: str) -> str:
        where = self.seq_at.get(seq)
        if where is None:
            return "@?"
        name, index = where
        return f"@{index}" if name == run else f"@{name}:{index}"

    def value(self, value: Any, *, run: str) -> Any:
        """A JSON value (a tick's output or error, a run row's) normalised like payloads."""
        return json.loads(self.text(json.dumps(value, sort_keys=True), run=run))


def normalise_payload(type_: str, text: str, names: Names, run: str) -> str:
    if type_ in RESPONSE_FIELDS:
        text = _without_response_digest(type_, text)
    if type_ == "ValueRecorded":
        if _RANDOM.match(text):
            return '{"what":"random","value":"<random>"}'
        if _UUID.match(text):
            return '{"what":"uuid","value":"<uuid>"}'
    return names.text(text, run=run, type_=type_)


_RESPONSE_DIGEST = re.compile(r',"response_digest":"([0-9a-f]{64})"')


def _without_response_digest(type_: str, text: str) -> str:
    found = _RESPONSE_DIGEST.search(text)
    if found is None:  # written from a fixture (b), as an earlier version wrote it
        return text
    assert found[1] == response_digest(type_, json.loads(text)), f"{type_}: {text[:200]}"
    return text[: found.start()] + text[found.end() :]


def normalised_logs(
    db: RawDB, runs: Mapping[str, str], messages: Mapping[int, str]
) -> tuple[dict[str, list[dict[str, Any]]], Names]:
    """Each run's log (``runs``: run id -> name), normalised."""
    per_run: dict[str, list[tuple[Any, ...]]] = {name: [] for name in runs.values()}
    seq_at: dict[int, tuple[str, int]] = {}
    for row in db.rows(EVENT_SQL):
        name = runs[row[1]]
        per_run[name].append(row)
        seq_at[row[0]] = (name, len(per_run[name]))
    names = Names(dict(runs), seq_at, dict(messages))
    logs: dict[str, list[dict[str, Any]]] = {}
    for name, rows in per_run.items():
        logs[name] = []
        for index, row in enumerate(rows, 1):
            _seq, _run, stream, pos, gen, slot, type_, digest, version, _w, _t, fmt, text = row
            logs[name].append(
                {
                    "n": index,
                    "stream": stream,
                    "position": pos,
                    "generation": gen,
                    "slot": slot,
                    "type": type_,
                    "digest": digest,
                    "code_version": version,
                    "format_version": fmt,
                    "payload": normalise_payload(type_, text, names, name),
                }
            )
    return logs, names


def snapshot(db: RawDB, h: Harness) -> dict[str, Any]:
    """The scenario's database as a normalised, deterministic document."""
    ids = {ref.id: ref.name for ref in h.runs.values()}
    logs, names = normalised_logs(db, ids, h.messages)
    runs: dict[str, Any] = {}
    for name, ref in h.runs.items():
        runs[name] = {
            "replay_version": h.last_version.get(name),
            "final": names.value(run_row_fields(db, ref.id), run=name),
            "events": logs[name],
        }
    blobs = {hash_: body for hash_, body in db.rows(BLOB_SQL)}
    ticks = [{**t, **_norm_tick(t, names)} if "output" in t else t for t in h.ticks]
    plans = [names.value(p, run=p["run"]) for p in h.plans]
    return {
        "format": FORMAT,
        "scenario": h.scenario.name,
        "description": h.scenario.description,
        "features": list(h.scenario.features),
        "clock_end": h.clock.now() - START,
        "runs": runs,
        "blobs": blobs,
        "ticks": ticks,
        "plans": plans,
    }


def _norm_tick(tick: Mapping[str, Any], names: Names) -> dict[str, Any]:
    return {
        "output": names.value(tick["output"], run=tick["run"]),
        "error": names.value(tick["error"], run=tick["run"]),
        "not_before": None if tick["not_before"] is None else tick["not_before"] - START,
    }


RUN_FIELDS = (
    "status, output, error, waiting_for, not_before, input_tokens, output_tokens, "
    "cost_nanousd, saved_nanousd, steps, invalidations, retries, code_version, forked_at"
)


def run_row_fields(db: RawDB, run_id: str) -> dict[str, Any]:
    """The run row's state (a cache of the log, but one every surface shows)."""
    (row,) = db.rows(f"SELECT {RUN_FIELDS} FROM runs WHERE id = ?", (run_id,))
    out = dict(zip([c.strip() for c in RUN_FIELDS.split(",")], row, strict=True))
    for key in ("output", "error", "waiting_for"):
        out[key] = None if out[key] is None else json.loads(out[key])
    if out["not_before"] is not None:
        out["not_before"] = out["not_before"] - START
    return out


def dump(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, indent=1, ensure_ascii=False) + "\n"


# -- writing a fixture's log into a fresh database ------------------------------------------

_REF = re.compile(r'"@(?:(\w+):)?(\d+|\?)"')


def denormalise(text: str, run: str, seqs: Mapping[str, int], ids: Mapping[str, str]) -> str:
    """A fixture payload as the store would have written it in this database: seq
    references point at the rows as inserted (``seqs``: each run's first seq), run names
    are run ids, normalised-out values are plain placeholders of the right type."""

    def seq(m: re.Match[str]) -> str:
        target = m[1] or run
        return str(seqs[target] + int(m[2]) - 1)

    text = _REF.sub(seq, text)
    text = text.replace('"latency_ms":"*"', '"latency_ms":0.0')
    text = re.sub(r'"inbox_id":"m(\d+)"', r'"inbox_id":\1', text)
    text = text.replace('"value":"<random>"', '"value":0.5')
    text = text.replace('"value":"<uuid>"', '"value":"00000000-0000-4000-8000-000000000000"')
    for name, run_id in ids.items():
        text = text.replace(run_token(name), run_id)
    return text


def run_token(name: str) -> str:
    """How a run id is spelt in a fixture: ``RUN[r1]`` for the scenario's run ``r1``."""
    return f"RUN[{name}]"


def tail_start(events: Sequence[Mapping[str, Any]]) -> int:
    """The index where the log's trailing run-level events (RunWaiting, RunCompleted,
    RunFailed, RunCancelled) begin: what the replay test strips and expects back."""
    end = len(events)
    while (
        end > 0
        and events[end - 1]["stream"] == ""
        and events[end - 1]["type"]
        in (
            "RunWaiting",
            "RunCompleted",
            "RunFailed",
            "RunCancelled",
        )
    ):
        end -= 1
    return end


def load_log(
    db: RawDB,
    fixture: Mapping[str, Any],
    name: str,
    ids: Mapping[str, str],
    keep: int,
    *,
    blobs: bool,
) -> None:
    """Insert the first ``keep`` fixture events of run ``name`` (and, with ``blobs``,
    every blob) as rows of the database, its run row queued. Seqs are predicted (the
    database's next ones, in insert order) and checked after; references to other runs
    point at runs loaded (and ticked) before, exactly as the recording made them."""
    ((top,),) = db.rows("SELECT MAX(seq) FROM events")
    first = (top or 0) + 1
    seqs = {other: first for other in ids}  # only this run's own rows are new here
    for other, run_id in ids.items():
        rows = db.rows("SELECT MIN(seq) FROM events WHERE run_id = ?", (run_id,))
        if other != name and rows[0][0] is not None:
            seqs[other] = rows[0][0]
    events = fixture["runs"][name]["events"][:keep]
    started = json.loads(events[0]["payload"])
    statements: list[tuple[str, Sequence[Any]]] = [
        (
            "INSERT INTO runs (id, agent, process, status, input, idempotency_key, "
            "created_at, updated_at) VALUES (?, ?, ?, 'queued', ?, NULL, ?, ?)",
            (
                ids[name],
                started["agent"],
                started["process"],
                json.dumps(started.get("input")),
                START,
                START,
            ),
        )
    ]
    for event in events:
        statements.append(
            (
                "INSERT INTO events (run_id, stream, position, generation, slot, type, "
                "digest, code_version, worker_id, created_at, format_version, payload) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    ids[name],
                    event["stream"],
                    event["position"],
                    event["generation"],
                    event["slot"],
                    event["type"],
                    event["digest"],
                    event["code_version"],
                    "corpus-loader",
                    START,
                    event["format_version"],
                    denormalise(event["payload"], name, seqs, ids),
                ),
            )
        )
    for hash_, body in fixture["blobs"].items() if blobs else ():
        statements.append(
            ("INSERT INTO blobs (hash, body, size) VALUES (?, ?, ?)", (hash_, body, len(body)))
        )
    db.write(statements)
    got = db.rows("SELECT MIN(seq), COUNT(*) FROM events WHERE run_id = ?", (ids[name],))
    assert got == [(first, keep)], f"the loaded log of {name} is not at the seqs predicted"


def iter_fixtures() -> Iterator[Path]:
    return iter(sorted(FIXTURES.glob("*.json")))


# -- the two drives -------------------------------------------------------------------------

SETTLED = ("completed", "failed", "cancelled", "waiting")


async def record(
    scenario: Scenario, url: str, *, sticky: StickyRuns | None = None
) -> dict[str, Any]:
    """Run ``scenario`` on the empty database at ``url``; its normalised snapshot.
    ``sticky``: the ticks keep parked runs in that cache and continue them in place."""
    store = await toren.connect(url)
    try:
        h = Harness(scenario, store, url, sticky=sticky)
        await scenario.script(h)
    finally:
        if sticky is not None:
            sticky.clear()
        await store.close()
    db = RawDB(url)
    try:
        doc = snapshot(db, h)
    finally:
        db.close()
    for name, run in doc["runs"].items():
        status = run["final"]["status"]
        assert status in SETTLED, f"{scenario.name}: run {name} ends {status}, not settled"
    return doc


@dataclass
class Replayed:
    """What driving a fixture's log under the current code did (see :func:`replay`)."""

    live_model_calls: int
    live_tool_calls: list[str]
    logs: dict[str, list[dict[str, Any]]]
    finals: dict[str, dict[str, Any]]
    statuses: dict[str, list[str]]
    # What ``toren plan`` said of each loaded log under that code, before its tick: the
    # findings (an invalidation would be a step that does not replay), or a problem.
    plans: dict[str, Any]


REPLAY_FIELDS = (
    "status",
    "output",
    "error",
    "waiting_for",
    "not_before",
    "input_tokens",
    "output_tokens",
    "cost_nanousd",
    "steps",
    "invalidations",
)


async def replay(scenario: Scenario, fixture: Mapping[str, Any], url: str) -> Replayed:
    """Write the fixture's logs, less their trailing run-level events, into the empty
    database at ``url`` and tick each run under the code version that last ran it: every
    recorded step must replay, and the run end as recorded."""
    store = await toren.connect(url)  # the schema first
    db = RawDB(url)
    runs = fixture["runs"]
    ids = {name: new_run_id(START) for name in runs}
    keep = {name: tail_start(run["events"]) for name, run in runs.items()}
    world, provider = World(), ScriptedProvider(SCRIPT)
    clock = toren.ManualClock(START + fixture["clock_end"])
    statuses: dict[str, list[str]] = {}
    plans: dict[str, Any] = {}
    try:
        for index, (name, run) in enumerate(runs.items()):
            # One run after the other, each loaded then ticked: a later run (a fork)
            # refers to an earlier one's events as they stand after its ticks.
            load_log(db, fixture, name, ids, keep[name], blobs=index == 0)
            version = run["replay_version"]
            statuses[name] = []
            if version is None:
                continue
            agents = scenario.versions[version](world)
            report = await plan_report(store, agents)
            (plan,) = [p for p in report["plans"] if p["run_id"] == ids[name]]
            plans[name] = {"findings": plan["findings"], "problem": plan["problem"]}
            deps = toren.TickDeps(
                store=store,
                agents=agents,
                providers={"scripted": provider},
                clock=clock,
                worker_id=WORKER,
                pricing=price,
            )
            for expected in run["events"][keep[name] :]:
                if expected["type"] == "RunCancelled":
                    await store.request_cancel(ids[name], now=clock.now())
                result = await toren.tick(ids[name], deps)
                statuses[name].append(result.status)
    finally:
        await store.close()
    names_by_id = {run_id: name for name, run_id in ids.items()}
    messages = {k: f"m{k}" for k in range(1, 1000)}
    try:
        logs, names = normalised_logs(db, names_by_id, messages)
        finals = {}
        for name, run_id in ids.items():
            row = names.value(run_row_fields(db, run_id), run=name)
            finals[name] = {k: row[k] for k in REPLAY_FIELDS}
    finally:
        db.close()
    return Replayed(provider.served, list(world.calls), logs, finals, statuses, plans)
