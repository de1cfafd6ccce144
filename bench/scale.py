"""A month of production traffic (issue 24): a big database, its queries, and retention.

    python -m bench.scale [--backend postgres|sqlite|both] [--runs 100000]
                          [--events-per-run 50] [--in-flight 1000] [--prune]
                          [--live-runs 1000]

1. **Fill** a fresh database quickly: ``--runs`` runs (all but ``--in-flight`` of them
   finished, their finish times spread over the last 60 days), each a tool-calling
   conversation of ``--events-per-run`` events (RunStarted, alternating model and tool
   calls, the end event) written by bulk insert (PostgreSQL COPY, SQLite executemany):
   real event payloads, real request digests, message bodies and list nodes stored as the
   engine stores them (one body per new message, one node per call; the agent's system
   prompt and tool spec shared by every run of the agent). The ``--in-flight`` runs are
   written by the engine itself (real ticks with the scripted model, the same agent code
   and shapes), parked waiting for a message: what ``toren plan`` replays.
   ``--phases plan``: ``toren plan --json`` as a command (a new process, the agents as
   directories, see ``write_agents_dir``) with each ``--plan-jobs`` value.
2. **Queries**: ``GET /v1/runs`` through the HTTP app (every documented filter: none,
   status, agent, process and their combinations; the first page, the 10th page by
   cursor, and a deep page near the oldest runs), p50/p95 of 30 requests each; a run's
   first page of events (``GET /v1/runs/{id}/events``); ``toren plan`` over the in-flight
   runs (``plan_report``).
3. **Prune** (``--prune``, PostgreSQL): 2 worker processes step ``--live-runs`` live runs
   (200-step conversations with the scripted model) while ``prune`` deletes every run that
   finished before 5 days ago in batches of 200, in 10 s windows alternating with 10 s
   without it; live steps/s is sampled each second before, in both kinds of window and
   after; then the database size before and after ``VACUUM``.

4. **Parked runs** (``--parked N [--kept K]``, PostgreSQL, instead of the rest): N runs
   parked on a message beside one worker: its RSS and idle CPU, and message-to-next-step
   latency. The worker first runs K runs of its own to their park (20 model steps of a
   growing conversation each, then a wait for a message), so its sticky cache is as full
   as its bound lets it be (default settings: 64 MB by its estimate) while it is measured.
5. **Timers** (``--timers N [--workers 2] [--concurrency 100]``, instead of the rest): N
   runs parked on ``ctx.sleep(1)`` (copies of one engine-written run), every timer due at
   the same instant, and worker processes with default settings: every timer fires? how
   late (``TimerFired.fired_at``, and the next step's commit), the workers' peak RSS.

Results go to ``bench/scale-results.json`` (``--out``) and are summarised in ``bench/RESULTS.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

import toren
from bench.common import Backend
from toren.api.app import create_app
from toren.config import LeaseSettings
from toren.core.contract.digest import canonical_json, message_hash, request_digest, tool_spec_hash
from toren.core.contract.digest import message_list_node as list_node
from toren.core.contract.events import (
    ModelCallRecorded,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCallRecorded,
    make_event,
)
from toren.core.contract.replay import step_slot
from toren.core.contract.values import TERMINAL_STATUSES
from toren.core.drivers.plan import plan_report
from toren.core.drivers.runs import new_run_id
from toren.providers.base import ModelResponse, ToolSpec, Usage
from toren.providers.scripted import ScriptedProvider
from toren.store.retention import PruneResult, prune_batch, sweep_blobs

REPO = Path(__file__).parents[1]
AGENTS = ("support", "triage", "research", "billing", "summarize")
MODEL = "scripted:bench"
DAY = 86400.0
_FILLER = (
    "Answer precisely and briefly. Use the lookup tool for any order, customer or "
    "document id the user mentions; never invent one. Quote amounts with their currency. "
)
SYSTEM = {
    a: {"role": "system", "content": f"You are the {a} agent. " + _FILLER * 3} for a in AGENTS
}
LOOKUP = ToolSpec(
    "lookup",
    "Look up an order, a customer or a document by id.",
    {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
)
REPLY = (
    "I looked the record up: the order shipped on the 3rd from the Leeds warehouse and is "
    "due on the 6th; the customer was charged 41.20 EUR including VAT. Next I check the "
    "refund policy for damaged items before answering."
)


def lookup(id: str) -> dict[str, Any]:
    return {"id": id, "status": "shipped", "amount": "41.20", "currency": "EUR", "items": 3}


# -- the agent (engine-written runs) -------------------------------------------------------


def make_agent(name: str) -> Any:
    async def agent(ctx: toren.Context, input: Any) -> Any:
        messages: list[Any] = [SYSTEM[name], {"role": "user", "content": input["question"]}]
        reply = None
        for k in range(int(input["turns"])):
            reply = await ctx.model(MODEL, messages, tools=[LOOKUP])
            messages.append(reply.message())
            result = await ctx.tool("lookup", {"id": f"{input['n']}-{k}"})
            messages.append(
                {"role": "tool", "tool_call_id": f"call_{k}", "content": json.dumps(result)}
            )
        if input.get("park"):
            await ctx.wait_for_message("approval")
        return {"answer": reply.text[:60] if reply else ""}

    return agent


def registry() -> toren.Registry:
    reg = toren.Registry()
    for name in AGENTS:
        reg.add(
            name,
            make_agent(name),
            tools={"lookup": toren.ToolDef("lookup", lookup, LOOKUP)},
            code_version="bench-v1",
        )
    return reg


def provider() -> ScriptedProvider:
    # Every reply differs (the run's question, the turn), as real ones do.
    return ScriptedProvider({"default": {"text": REPLY + " [{turn}] {last_user}"}})


def settings() -> toren.Settings:
    return toren.Settings(lease=LeaseSettings(ttl=30, heartbeat=5), poll_interval=0.1)


def write_agents_dir(root: Path) -> Path:
    """The bench's agents as an agent directory each (``entry:`` the very code of
    :func:`make_agent`, imported from this module: the process needs the repository on
    ``PYTHONPATH``), so ``toren plan --agents ROOT`` replays the engine-written runs as a
    user's project would."""
    for name in AGENTS:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "agent.yaml").write_text(f"name: {name}\nentry: agent:main\ntools: [lookup]\n")
        (d / "tools.py").write_text(
            "from bench import scale\n\n\n"
            "def lookup(id: str) -> dict:\n"
            '    """Look up an order, a customer or a document by id."""\n'
            "    return scale.lookup(id)\n"
        )
        (d / "agent.py").write_text(
            f"from bench.scale import make_agent\n\nmain = make_agent({name!r})\n"
        )
    return root


def plan_cli(url: str, jobs: tuple[int, ...] = (1, 2), repeat: int = 3) -> dict[str, Any]:
    """``toren plan --json`` as a user runs it (a new process each time, the bench's
    agents as directories), with ``--jobs`` each of ``jobs``: wall time per run of the
    command, best and median of ``repeat``."""
    import tempfile

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = write_agents_dir(Path(tmp) / "agents")
        for n in jobs:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-m", "toren.cli.main", "plan", "--json"]
                    + ["--agents", str(root), "--database-url", url, "--jobs", str(n)],
                    capture_output=True,
                    text=True,
                    check=False,
                    env={
                        **os.environ,
                        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "src")]),
                    },
                )
                times.append(time.perf_counter() - t)
                assert done.returncode == 0, done.stderr[-2000:]
                report = json.loads(done.stdout)
                assert report["problems"] == 0, [p["problem"] for p in report["plans"]][:3]
            out[f"jobs_{n}"] = {
                "best_s": round(min(times), 2),
                "median_s": round(statistics.median(times), 2),
                "runs": report["runs"],
                "invalidated": report["invalidated"],
                "replayed_steps": sum(p["replayed_steps"] for p in report["plans"]),
                "load_average": round(os.getloadavg()[0], 2),
            }
    return out


# -- the generator (bulk-inserted runs) ----------------------------------------------------


def _question(n: int) -> str:
    return f"Customer {n} asks where order A-{n:07d} is and whether it can be refunded."


class Generator:
    """Builds a run's rows exactly as the engine writes them (see make_agent): the same
    payload types, digests, body and node hashes. Shared bodies (system prompts, the tool
    spec) are stored once, first written by the first run of each agent."""

    def __init__(self, seed: int = 24) -> None:
        self.rng = random.Random(seed)
        self.tool_hash = tool_spec_hash(LOOKUP)
        self.tool_body = canonical_json(LOOKUP.to_dict()).decode()
        self.shared: dict[str, tuple[str, str]] = {}  # hash -> (body, first writer)
        self.shares: dict[str, int] = {}

    def run(
        self, n: int, agent: str, turns: int, created: float, status: str
    ) -> tuple[tuple[Any, ...], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        run_id = new_run_id(created) if n >= 0 else ""
        question = _question(n)
        input_ = {"n": n, "question": question, "turns": turns}
        t = created
        events: list[tuple[Any, ...]] = []
        blobs: list[tuple[Any, ...]] = []

        def add(payload: Any, **env: Any) -> None:
            ev = make_event(
                run_id, payload, code_version="bench-v1", worker_id="gen", created_at=t, **env
            )
            events.append(
                (
                    ev.run_id,
                    ev.stream,
                    ev.position,
                    ev.generation,
                    ev.slot,
                    ev.type,
                    ev.digest,
                    ev.code_version,
                    ev.worker_id,
                    ev.created_at,
                    ev.format_version,
                    ev.payload_json(),
                )
            )

        def share(h: str, body: str) -> None:
            if h not in self.shared:
                self.shared[h] = (body, run_id)
                self.shares[h] = 0
            else:
                self.shares[h] += 1

        add(RunStarted(agent=agent, process="main", input=input_), slot="run:start")
        system, user = SYSTEM[agent], {"role": "user", "content": question}
        sys_hash = message_hash(system)
        share(sys_hash, canonical_json(system).decode())
        share(self.tool_hash, self.tool_body)
        hashes = [sys_hash]
        new = [(message_hash(user), canonical_json(user).decode())]
        prev = None
        tokens_in = tokens_out = 0
        for k in range(turns):
            pos = 2 * k
            hashes += [h for h, _ in new]
            blobs += [(h, b, len(b), run_id) for h, b in new]
            node, node_body = list_node(
                prev, [sys_hash, *(h for h, _ in new)] if k == 0 else [h for h, _ in new]
            )
            blobs.append((node, node_body, len(node_body), run_id))
            prev = node
            usage = Usage(input_tokens=180 + 95 * k, output_tokens=60)
            tokens_in += usage.input_tokens
            tokens_out += usage.output_tokens
            text = f"{REPLY} [{k}] {question}"  # as the scripted reply in provider()
            response = ModelResponse(text=text, usage=usage, model=MODEL.split(":")[1])
            body = {
                "messages": list(hashes),
                "model": "bench",
                "params": {},
                "provider": "scripted",
                "tools": [self.tool_hash],
            }
            t += self.rng.uniform(0.4, 2.5)
            add(
                ModelCallRecorded(
                    provider="scripted",
                    model="bench",
                    message_list=node,
                    message_count=len(hashes),
                    tools=[self.tool_hash],
                    params={},
                    response=response.to_dict(),
                    input_tokens=usage.input_tokens,
                    output_tokens=usage.output_tokens,
                    cost_usd="0",
                    latency_ms=round(self.rng.uniform(300, 2500), 3),
                ),
                stream="main",
                position=pos,
                slot=step_slot("main", 0, pos),
                digest=request_digest("model", body),
            )
            args = {"id": f"{n}-{k}"}
            t += self.rng.uniform(0.01, 0.2)
            add(
                ToolCallRecorded(name="lookup", args=args, result=lookup(**args), latency_ms=12.5),
                stream="main",
                position=pos + 1,
                slot=step_slot("main", 0, pos + 1),
                digest=request_digest("tool", {"name": "lookup", "args": args}),
            )
            assistant = response.message()
            tool_msg = {
                "role": "tool",
                "tool_call_id": f"call_{k}",
                "content": json.dumps(lookup(**args)),
            }
            new = [
                (message_hash(assistant), canonical_json(assistant).decode()),
                (message_hash(tool_msg), canonical_json(tool_msg).decode()),
            ]
        t += 0.01
        if status == "failed":
            add(
                RunFailed(
                    error={
                        "type": "ToolFailed",
                        "code": "tool_failed",
                        "message": "lookup timed out",
                    }
                ),
                slot="run:end",
            )
        else:
            add(RunCompleted(output={"answer": REPLY[:60]}), slot="run:end")
        output = None if status == "failed" else json.dumps({"answer": REPLY[:60]})
        error = (
            json.dumps({"type": "ToolFailed", "code": "tool_failed", "message": "lookup timed out"})
            if status == "failed"
            else None
        )
        row = (
            run_id,
            agent,
            "main",
            status,
            json.dumps(input_),
            output,
            error,
            created,
            t,
            0,
            None,
            2 * turns,
            tokens_in,
            tokens_out,
            "bench-v1",
        )
        return row, events, blobs


RUN_INSERT_COLS = (
    "id, agent, process, status, input, output, error, created_at, updated_at, "
    "lease_epoch, not_before, steps, input_tokens, output_tokens, code_version"
)
EVENT_INSERT_COLS = (
    "run_id, stream, position, generation, slot, type, digest, code_version, worker_id, "
    "created_at, format_version, payload"
)
BLOB_COLS = "hash, body, size, run_id, shares"


def plan_rows(runs: int, in_flight: int, seed: int = 7) -> Iterator[tuple[int, str, float, str]]:
    """(n, agent, created_at, status) of the bulk runs, oldest first."""
    rng = random.Random(seed)
    now = time.time()
    start = now - 60 * DAY
    bulk = runs - in_flight
    for n in range(bulk):
        created = start + (now - 2 * 3600 - start) * n / max(bulk, 1)
        agent = AGENTS[rng.randrange(len(AGENTS))] if rng.random() < 0.8 else AGENTS[0]
        status = rng.choices(("completed", "failed", "cancelled"), (90, 8, 2))[0]
        yield n, agent, created, status


def fill(url: str, runs: int, events_per_run: int, in_flight: int) -> dict[str, Any]:
    """Bulk-insert the finished runs; the engine writes the in-flight ones."""
    turns = max(1, (events_per_run - 2) // 2)
    asyncio.run(_migrate(url))
    gen = Generator()
    t0 = time.perf_counter()
    if url.startswith("postgresql"):
        counts = _fill_pg(url, gen, runs, turns, in_flight)
    else:
        counts = _fill_sqlite(url, gen, runs, turns, in_flight)
    bulk_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    asyncio.run(_engine_runs(url, in_flight, turns))
    return {
        **counts,
        "turns": turns,
        "bulk_seconds": round(bulk_s, 1),
        "engine_seconds": round(time.perf_counter() - t1, 1),
    }


def _shared_rows(gen: Generator) -> list[tuple[Any, ...]]:
    return [(h, b, len(b), owner, gen.shares[h]) for h, (b, owner) in gen.shared.items()]


def _fill_pg(url: str, gen: Generator, runs: int, turns: int, in_flight: int) -> dict[str, int]:
    import psycopg

    n_events = n_blobs = 0
    with psycopg.connect(url, autocommit=False) as conn:
        batch: list[Any] = []
        for item in plan_rows(runs, in_flight):
            batch.append(gen.run(item[0], item[1], turns, item[2], item[3]))
            if len(batch) >= 500:
                n_events, n_blobs = _copy_pg(conn, batch, n_events, n_blobs)
                batch = []
        n_events, n_blobs = _copy_pg(conn, batch, n_events, n_blobs)
        with conn.cursor().copy(f"COPY blobs ({BLOB_COLS}) FROM STDIN") as copy:
            for row in _shared_rows(gen):
                copy.write_row(row)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE")
    return {
        "bulk_runs": runs - in_flight,
        "bulk_events": n_events,
        "bulk_blobs": n_blobs + len(gen.shared),
    }


def _copy_pg(conn: Any, batch: list[Any], n_events: int, n_blobs: int) -> tuple[int, int]:
    cur = conn.cursor()
    with cur.copy(f"COPY runs ({RUN_INSERT_COLS}) FROM STDIN") as copy:
        for row, _, _ in batch:
            copy.write_row(row)
    with cur.copy(f"COPY events ({EVENT_INSERT_COLS}) FROM STDIN") as copy:
        for _, events, _ in batch:
            for ev in events:
                copy.write_row(ev)
            n_events += len(events)
    with cur.copy("COPY blobs (hash, body, size, run_id) FROM STDIN") as copy:
        for _, _, blobs in batch:
            for b in blobs:
                copy.write_row(b)
            n_blobs += len(blobs)
    conn.commit()
    return n_events, n_blobs


def _fill_sqlite(url: str, gen: Generator, runs: int, turns: int, in_flight: int) -> dict[str, int]:
    import sqlite3

    from toren.store.sqlite import parse_sqlite_url

    path, _ = parse_sqlite_url(url)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA synchronous=NORMAL")
    n_events = n_blobs = 0
    marks = lambda cols: ", ".join("?" for _ in cols.split(","))  # noqa: E731
    conn.execute("BEGIN")
    for i, item in enumerate(plan_rows(runs, in_flight)):
        row, events, blobs = gen.run(item[0], item[1], turns, item[2], item[3])
        conn.execute(f"INSERT INTO runs ({RUN_INSERT_COLS}) VALUES ({marks(RUN_INSERT_COLS)})", row)
        conn.executemany(
            f"INSERT INTO events ({EVENT_INSERT_COLS}) VALUES ({marks(EVENT_INSERT_COLS)})", events
        )
        conn.executemany("INSERT INTO blobs (hash, body, size, run_id) VALUES (?, ?, ?, ?)", blobs)
        n_events += len(events)
        n_blobs += len(blobs)
        if i % 2000 == 1999:
            conn.execute("COMMIT")
            conn.execute("BEGIN")
    conn.executemany(f"INSERT INTO blobs ({BLOB_COLS}) VALUES (?, ?, ?, ?, ?)", _shared_rows(gen))
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.close()
    return {
        "bulk_runs": runs - in_flight,
        "bulk_events": n_events,
        "bulk_blobs": n_blobs + len(gen.shared),
    }


async def _migrate(url: str) -> None:
    store = await toren.connect(url)
    await store.close()


async def _engine_runs(url: str, count: int, turns: int) -> None:
    """``count`` runs written by the engine, parked on a message (in flight)."""
    store = await toren.connect(url)
    reg = registry()
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": provider()}, settings=settings()
    )
    try:
        async with toren.LocalWorkerRuntime(deps, concurrency=100):
            ids = [
                (
                    await toren.start_run(
                        store,
                        reg,
                        AGENTS[i % len(AGENTS)],
                        {
                            "n": 10_000_000 + i,
                            "question": _question(10_000_000 + i),
                            "turns": turns,
                            "park": True,
                        },
                    )
                ).id
                for i in range(count)
            ]
            for run_id in ids:
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    run = await store.get_run(run_id)
                    if run is not None and run.status == "waiting" and run.lease_owner is None:
                        break
                    await asyncio.sleep(0.05)
    finally:
        await store.close()


# -- queries -------------------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


LIST_FILTERS: dict[str, dict[str, Any]] = {
    "none": {},
    "status=completed": {"status": "completed"},
    "status=failed": {"status": "failed"},
    "status=waiting": {"status": "waiting"},
    "agent=billing": {"agent": "billing"},
    "agent=billing&status=failed": {"agent": "billing", "status": "failed"},
    "agent=support&status=waiting": {"agent": "support", "status": "waiting"},
    "process=main": {"process": "main"},
    "agent=triage&process=main&status=completed": {
        "agent": "triage",
        "process": "main",
        "status": "completed",
    },
}


async def queries(url: str, repeat: int = 30) -> dict[str, Any]:
    store = await toren.connect(url)
    app = create_app(store, registry(), console=False)
    out: dict[str, Any] = {"list": {}}
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:

            async def get(path: str, params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
                t = time.perf_counter()
                r = await client.get(path, params=params)
                elapsed = (time.perf_counter() - t) * 1000
                assert r.status_code == 200, r.text
                return elapsed, r.json()

            filters = LIST_FILTERS
            for name, params in filters.items():
                base = {**params, "limit": 50}
                first = [(await get("/v1/runs", base))[0] for _ in range(repeat)]
                # The 10th page, by following cursors.
                cursor = None
                for _ in range(9):
                    _, page = await get(
                        "/v1/runs", {**base, **({"cursor": cursor} if cursor else {})}
                    )
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
                tenth = (
                    [(await get("/v1/runs", {**base, "cursor": cursor}))[0] for _ in range(repeat)]
                    if cursor
                    else []
                )
                # A deep page: the cursor near the oldest matching runs.
                deep_cursor = await _deep_cursor(store, params)
                deep = (
                    [
                        (await get("/v1/runs", {**base, "cursor": deep_cursor}))[0]
                        for _ in range(repeat)
                    ]
                    if deep_cursor
                    else []
                )
                out["list"][name] = {
                    page: {
                        "p50_ms": round(_pct(xs, 0.5), 2),
                        "p95_ms": round(_pct(xs, 0.95), 2),
                        "max_ms": round(max(xs), 2),
                    }
                    for page, xs in (("first", first), ("10th", tenth), ("deep", deep))
                    if xs
                }
            # A run's first page of events: a finished bulk run and an engine-written one.
            some = (await store.list_runs(status="completed", limit=1))[0].id
            parked = (await store.list_runs(status="waiting", limit=1))[0].id
            for label, run_id in (("finished", some), ("in_flight", parked)):
                xs = [
                    (await get(f"/v1/runs/{run_id}/events", {"limit": 100}))[0]
                    for _ in range(repeat)
                ]
                out[f"events_first_page_{label}"] = {
                    "p50_ms": round(_pct(xs, 0.5), 2),
                    "p95_ms": round(_pct(xs, 0.95), 2),
                }
        # Client CPU beside wall time: the plan replays every run in this process (the
        # database works on another core), so CPU is what load on the machine distorts least.
        load = os.getloadavg()[0]
        t, cpu = time.perf_counter(), time.process_time()
        report = await plan_report(store, registry(), code_version="bench-v1", limit=100_000)
        out["plan"] = {
            "seconds": round(time.perf_counter() - t, 2),
            "cpu_seconds": round(time.process_time() - cpu, 2),
            "load_average": round(load, 2),
            "runs": report["runs"],
            "replayed_steps": sum(p["replayed_steps"] for p in report["plans"]),
            "invalidated": report["invalidated"],
            "problems": report["problems"],
        }
    finally:
        await store.close()
    return out


def explain_lists(url: str) -> dict[str, Any]:
    """PostgreSQL's own execution time and plan of each listing's query (first and deep
    page): what the database spends, apart from the HTTP app's serialisation."""
    import psycopg

    from toren.store.sql import RUN_COLUMNS

    out: dict[str, Any] = {}
    with psycopg.connect(url, autocommit=True) as conn:
        for name, params in LIST_FILTERS.items():
            where = [f"{k} = %s" for k in params]
            values: list[Any] = list(params.values())
            deep = conn.execute(
                f"SELECT id FROM runs {'WHERE ' + ' AND '.join(where) if where else ''} "
                "ORDER BY id LIMIT 1 OFFSET 100",
                values,
            ).fetchone()
            for page, cursor in (("first", None), ("deep", deep[0] if deep else None)):
                cond = where + (["id < %s"] if cursor else [])
                sql = (
                    f"EXPLAIN (ANALYZE, FORMAT JSON) SELECT {RUN_COLUMNS} FROM runs "
                    f"{'WHERE ' + ' AND '.join(cond) if cond else ''} ORDER BY id DESC LIMIT 51"
                )
                times, node = [], ""
                for _ in range(5):
                    plan = conn.execute(sql, [*values, *([cursor] if cursor else [])]).fetchone()[
                        0
                    ][0]
                    times.append(plan["Execution Time"])
                    inner = plan["Plan"].get("Plans", [plan["Plan"]])[0]
                    node = f"{inner['Node Type']} {inner.get('Index Name', '')}".strip()
                out[f"{name} {page}"] = {
                    "db_ms_median": round(statistics.median(times), 3),
                    "plan": node,
                }
    return out


async def _deep_cursor(store: Any, params: dict[str, Any]) -> str | None:
    """The id of a matching run with ~100 older matching runs behind it."""
    sql_store: Any = store
    where = " AND ".join(f"{k} = ?" for k in params) or "1 = 1"

    def tx(cur: Any) -> str | None:
        row = sql_store._x(
            cur,
            f"SELECT id FROM runs WHERE {where} ORDER BY id LIMIT 1 OFFSET 100",
            tuple(params.values()),
        ).fetchone()
        return None if row is None else str(row[0])

    result: str | None = await sql_store._run(tx, write=False)
    return result


# -- prune with live workers ---------------------------------------------------------------


async def serve_worker(url: str) -> None:
    store = await toren.connect(url)
    deps = toren.TickDeps(
        store=store, agents=registry(), providers={"scripted": provider()}, settings=settings()
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=500)
    await worker.start()
    worker.install_signal_handlers()
    await worker.wait_stopped()
    await store.close()


def _db_size(url: str) -> int:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_database_size(current_database())").fetchone()[0])


def _vacuum(url: str, full: bool = False) -> None:
    """Plain VACUUM makes the pruned rows' space reusable (new rows fill it; the files keep
    their size); VACUUM FULL rewrites the tables and gives it back to the file system
    (it locks them: an operator runs it in a quiet hour, the bench after the workers stop)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM FULL" if full else "VACUUM")


async def _live_rate(
    url: str, seconds: float, live_ids: list[str], rates: list[float] | None = None
) -> list[float]:
    """Live steps per second, sampled each second (events of the live runs), appended to
    ``rates`` as they come (so a cancelled sampler keeps what it measured)."""
    import psycopg

    rates = [] if rates is None else rates
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:

        async def count() -> int:
            cur = await conn.execute(
                "SELECT COUNT(seq) FROM events WHERE run_id = ANY(%s)", (live_ids,)
            )
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        last, t_last = await count(), time.perf_counter()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            await asyncio.sleep(1.0)
            now_count, now = await count(), time.perf_counter()
            rates.append((now_count - last) / (now - t_last))
            last, t_last = now_count, now
    return rates


PRUNE_WINDOW = 10.0  # seconds


async def _finished(store: Any, run_ids: list[str]) -> int:
    """How many of ``run_ids`` have ended."""
    runs = [await store.get_run(i) for i in run_ids]
    return sum(1 for r in runs if r is not None and r.status in TERMINAL_STATUSES)


async def prune_under_load(url: str, live_runs: int, pause: float = 0.0) -> dict[str, Any]:
    """``pause``: seconds between batches (``toren runs prune --pause``; 0: full speed)."""
    store = await toren.connect(url)
    reg = registry()
    # Runs finished more than 5 days ago: about 90,000 of the 99,000 finished runs the fill
    # spreads over 60 days at the size (100,000 runs).
    cutoff = time.time() - 5 * DAY
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.scale", "worker", url],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"},
        )
        for _ in range(2)
    ]
    try:
        size_before = _db_size(url)
        live_ids = [
            (
                await toren.start_run(
                    store,
                    reg,
                    AGENTS[i % len(AGENTS)],
                    # Long enough to outlast the prune: a live run that ends during it
                    # would read as a drop in throughput.
                    {"n": 20_000_000 + i, "question": _question(20_000_000 + i), "turns": 300},
                )
            ).id
            for i in range(live_runs)
        ]
        await asyncio.sleep(10.0)  # the workers claim and reach a steady state
        baseline = await _live_rate(url, 20.0, live_ids)
        # The prune in 10 s windows alternating with 10 s without it, sampled alike: the
        # live workload's own rate drifts (its conversations grow), so the prune's effect
        # is the windows with it against the windows around them, not against a baseline
        # taken minutes before.
        during: list[float] = []
        between: list[float] = []
        result = PruneResult()
        prune_s = 0.0
        while True:
            await _live_rate(url, PRUNE_WINDOW, live_ids, between)
            sampler = asyncio.ensure_future(_live_rate(url, PRUNE_WINDOW, live_ids, during))
            t = time.perf_counter()
            empty = False
            while not sampler.done():
                done = await prune_batch(store, before=cutoff, limit=200)
                result.add(done)
                if not done.runs:
                    empty = True
                    break
                if pause:
                    await asyncio.sleep(pause)
            prune_s += time.perf_counter() - t
            if empty:
                sampler.cancel()
            with contextlib.suppress(BaseException):
                await sampler
            if empty:
                break
        live_done = await _finished(store, live_ids)
        t = time.perf_counter()
        swept = await sweep_blobs(store)
        sweep_s = time.perf_counter() - t
        after = await _live_rate(url, 15.0, live_ids)
        touched = [r for r in [await store.get_run(i) for i in live_ids] if r is None]
        parked = (await store.stats())["runs_by_status"].get("waiting", 0)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
        size_pruned = _db_size(url)
        _vacuum(url)
        size_vacuumed = _db_size(url)
        _vacuum(url, full=True)
        size_full = _db_size(url)
        return {
            "pruned": result.to_dict(),
            "pause_between_batches_s": pause,
            "prune_seconds": round(prune_s, 1),
            "sweep_seconds": round(sweep_s, 1),
            "swept_blobs": swept,
            "live_steps_per_s_before": _spread(baseline),
            "live_steps_per_s_during": _spread(during),
            "live_steps_per_s_between": _spread(between),
            "live_drop_during_vs_between": round(
                1 - statistics.median(during) / statistics.median(between), 3
            ),
            "live_steps_per_s_after": _spread(after),
            "live_runs_finished_during_prune": live_done,
            "live_runs_lost": len(touched),
            "parked_runs_left": parked,
            "db_bytes": {
                "before": size_before,
                "after_prune": size_pruned,
                "after_vacuum": size_vacuumed,
                "after_vacuum_full": size_full,
            },
        }
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        await store.close()


def _spread(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {}
    return {
        "median": round(statistics.median(xs), 1),
        "min": round(min(xs), 1),
        "max": round(max(xs), 1),
        "samples": len(xs),
    }


# -- parked runs ---------------------------------------------------------------------------


async def approval_agent(ctx: toren.Context, input: Any) -> Any:
    answer = await ctx.wait_for_message("approval")
    reply = await ctx.model(MODEL, [{"role": "user", "content": f"approved: {answer}"}])
    return {"answer": reply.text[:40]}


KEPT_STEPS = 20


async def keeper_agent(ctx: toren.Context, input: Any) -> Any:
    """A run the worker itself steps to its park, and keeps (sticky cache)."""
    messages: list[dict[str, Any]] = []
    for i in range(KEPT_STEPS):
        messages.append({"role": "user", "content": f"step {i}"})
        messages.append((await ctx.model(MODEL, messages)).message())
    return await ctx.wait_for_message("approval")


class TimedProvider(ScriptedProvider):
    """The scripted model, noting when each run's first model call starts."""

    def __init__(self) -> None:
        super().__init__({"default": {"text": "ok"}})
        self.started: dict[str, float] = {}

    async def complete(self, request: Any, *, on_delta: Any = None) -> Any:
        text = str(request.messages[-1].get("content", ""))
        self.started.setdefault(text.removeprefix("approved: "), time.perf_counter())
        return await super().complete(request, on_delta=on_delta)


def _fill_parked(url: str, count: int) -> None:
    """``count`` runs parked on a message, as the engine leaves them: the run row waiting
    (no lease, no not_before) and its log (RunStarted, RunWaiting)."""
    import psycopg

    from toren.core.contract.events import RunWaiting

    now = time.time()
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        for start in range(0, count, 5000):
            rows, events = [], []
            for i in range(start, min(count, start + 5000)):
                run_id = new_run_id(now - count + i)
                rows.append((run_id, "approval", "main", "waiting", "{}", now, now, '["approval"]'))
                for payload, slot in (
                    (RunStarted(agent="approval", process="main", input={}), "run:start"),
                    (RunWaiting(messages=["approval"]), None),
                ):
                    ev = make_event(
                        run_id, payload, slot=slot, code_version="bench-v1", created_at=now
                    )
                    events.append(
                        (
                            run_id,
                            "",
                            None,
                            0,
                            slot,
                            ev.type,
                            None,
                            "bench-v1",
                            "gen",
                            now,
                            1,
                            ev.payload_json(),
                        )
                    )
            with cur.copy(
                "COPY runs (id, agent, process, status, input, created_at, updated_at, "
                "waiting_for) FROM STDIN"
            ) as copy:
                for row in rows:
                    copy.write_row(row)
            with cur.copy(f"COPY events ({EVENT_INSERT_COLS}) FROM STDIN") as copy:
                for ev_row in events:
                    copy.write_row(ev_row)
            conn.commit()
        conn.execute("ANALYZE")


async def parked(url: str, count: int, kept: int = 0, messages: int = 200) -> dict[str, Any]:
    """A worker beside ``count`` parked runs: its RSS and CPU while idle, then the time
    from sending a message to one of them to its next step (the model call) starting.
    First the worker runs ``kept`` runs of its own to their park, filling its sticky
    cache."""
    import resource

    await _migrate(url)
    t = time.perf_counter()
    _fill_parked(url, count)
    fill_s = time.perf_counter() - t
    store = await toren.connect(url)
    sender = await toren.connect(url)
    reg = toren.Registry()
    reg.add("approval", approval_agent, code_version="bench-v1")
    reg.add("keeper", keeper_agent, code_version="bench-v1")
    model = TimedProvider()
    # Default settings: the worker as `toren worker` runs it (poll 0.25 s as the safety
    # net beside LISTEN/NOTIFY and the next timer), not the bench's faster poll.
    deps = toren.TickDeps(
        store=store, agents=reg, providers={"scripted": model}, settings=toren.Settings()
    )
    try:
        async with toren.LocalWorkerRuntime(deps, concurrency=100) as worker:
            keepers = [await toren.start_run(sender, reg, "keeper", None) for _ in range(kept)]
            for run in keepers:
                while (row := await sender.get_run(run.id)) is None or row.status != "waiting":
                    await asyncio.sleep(0.05)
            await asyncio.sleep(3.0)
            cpu0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            await asyncio.sleep(10.0)
            cpu1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            idle_cpu = (cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime) / (t1 - t0)
            rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            cache = deps.sticky
            kept_now = len(cache) if cache is not None else 0
            kept_mb = cache.bytes / 1e6 if cache is not None else 0.0
            waiting = await sender.list_runs(status="waiting", agent="approval", limit=messages)
            ids = [r.id for r in waiting]
            latencies = []
            for n, run_id in enumerate(ids):
                sent = time.perf_counter()
                await sender.send_message(run_id, "approval", f"m{n}", now=time.time())
                deadline = time.monotonic() + 30
                while f"m{n}" not in model.started and time.monotonic() < deadline:
                    await asyncio.sleep(0.001)
                latencies.append((model.started.get(f"m{n}", float("inf")) - sent) * 1000)
                await asyncio.sleep(0.02)
            held = len(worker.active_runs)
    finally:
        await sender.close()
        await store.close()
    return {
        "parked_runs": count,
        "fill_seconds": round(fill_s, 1),
        "worker_idle_cpu_fraction_of_one_core": round(idle_cpu, 4),
        "process_max_rss_mb": round(rss_mb, 1),
        "message_to_next_step_ms": {
            "p50": round(_pct(latencies, 0.5), 1),
            "p99": round(_pct(latencies, 0.99), 1),
            "max": round(max(latencies), 1),
            "samples": len(latencies),
        },
        "runs_held_by_the_worker_after": held,
        "kept_runs_started": kept,
        "sticky_cache_runs_when_measured": kept_now,
        "sticky_cache_estimate_mb_when_measured": round(kept_mb, 1),
    }


# -- timers at scale -----------------------------------------------------------------------


async def sleeper_agent(ctx: toren.Context, input: Any) -> Any:
    await ctx.sleep(1)
    reply = await ctx.model(MODEL, [{"role": "user", "content": "awake"}])
    return {"answer": reply.text[:20]}


def timer_registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("sleeper", sleeper_agent, code_version="bench-v1")
    return reg


def _vm_hwm_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def timer_worker(url: str, concurrency: int) -> None:
    """A worker process of the timer scenario: default settings (poll interval 0.25 s,
    timers tracked by ``store.next_due``); on SIGTERM it drains and prints its peak RSS and
    wake-up counters as one JSON line."""
    store = await toren.connect(url)
    deps = toren.TickDeps(
        store=store,
        agents=timer_registry(),
        providers={"scripted": ScriptedProvider({"default": {"text": "ok"}})},
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=concurrency)
    await worker.start()
    worker.install_signal_handlers()
    print("ready", flush=True)
    await worker.wait_stopped()
    await store.close()
    m = worker.metrics
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(
        json.dumps(
            {
                "vm_hwm_mb": round(_vm_hwm_mb(), 1),
                "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
                "wakes": dict(m.wakes),
                "claimed": dict(m.claimed),
                "ticks": dict(m.ticks),
            }
        ),
        flush=True,
    )


async def _timer_template(url: str) -> tuple[Any, list[Any]]:
    """One run written by the engine up to its park on ``ctx.sleep(1)`` (inline waits off,
    so the 1 s timer parks): its row and its log, the shape every generated run copies."""
    store = await toren.connect(url)
    reg = timer_registry()
    deps = toren.TickDeps(
        store=store,
        agents=reg,
        providers={"scripted": ScriptedProvider({"default": {"text": "ok"}})},
        settings=toren.Settings(inline_wait=0.0),
    )
    try:
        run = await toren.start_run(store, reg, "sleeper", {})
        async with toren.LocalWorkerRuntime(deps, concurrency=1) as worker:
            for _ in range(3000):
                row = await store.get_run(run.id)
                if row is not None and row.status == "waiting" and not worker.active_runs:
                    break
                await asyncio.sleep(0.01)
        row = await store.get_run(run.id)
        events = await store.load_events(run.id)
        assert row is not None and row.status == "waiting", row
        return row, events
    finally:
        await store.close()


def _fill_timers(
    url: str, count: int, due: float, row: Any, events: list[Any], spread: float = 0.0
) -> None:
    """``count`` copies of the template run, every timer due at ``due`` (with ``spread``,
    the i-th at ``due + spread * i / count``)."""
    from toren.core.contract.jsontext import dumps

    run_cols = "id, agent, process, status, input, created_at, updated_at, not_before, steps"
    runs, rows = [], []
    now = time.time()
    for i in range(count):
        run_id = new_run_id(now - count + i)
        at = due + spread * i / count
        runs.append((run_id, row.agent, row.process, "waiting", "{}", now, now, at, row.steps))
        for ev in events:
            payload = ev.payload_json()
            if ev.type == "TimerScheduled":
                body = json.loads(payload)
                body["fire_at"] = at
                payload = dumps(body)
            rows.append(
                (
                    run_id,
                    ev.stream,
                    ev.position,
                    ev.generation,
                    ev.slot,
                    ev.type,
                    ev.digest,
                    ev.code_version,
                    ev.worker_id,
                    now,
                    ev.format_version,
                    payload,
                )
            )
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as conn, conn.cursor() as cur:
            with cur.copy(f"COPY runs ({run_cols}) FROM STDIN") as copy:
                for r in runs:
                    copy.write_row(r)
            with cur.copy(f"COPY events ({EVENT_INSERT_COLS}) FROM STDIN") as copy:
                for e in rows:
                    copy.write_row(e)
            conn.commit()
            conn.execute("ANALYZE")
            conn.commit()
            # As the engine's park of each run would have: the workers look again.
            conn.execute("NOTIFY toren_work")
            conn.commit()
        return
    import sqlite3

    from toren.store.sqlite import parse_sqlite_url

    conn2 = sqlite3.connect(parse_sqlite_url(url)[0], isolation_level=None, timeout=30)
    marks = lambda cols: ", ".join("?" for _ in cols.split(","))  # noqa: E731
    conn2.execute("BEGIN")
    conn2.executemany(f"INSERT INTO runs ({run_cols}) VALUES ({marks(run_cols)})", runs)
    conn2.executemany(
        f"INSERT INTO events ({EVENT_INSERT_COLS}) VALUES ({marks(EVENT_INSERT_COLS)})", rows
    )
    conn2.execute("COMMIT")
    conn2.execute("ANALYZE")
    conn2.close()


def _timer_outcome(url: str, template: str) -> dict[str, Any]:
    """Per run: when its timer fired (TimerFired.fired_at) and when its next step was
    committed (the ModelCallRecorded row's created_at), and its lease epoch."""
    sql = (
        "SELECT r.id, r.status, r.lease_epoch, e.type, e.payload, e.created_at FROM runs r "
        "JOIN events e ON e.run_id = r.id WHERE r.agent = 'sleeper' "
        "AND e.type IN ('TimerScheduled', 'TimerFired', 'ModelCallRecorded')"
    )
    # The template run (written first, by the engine) is not one of the N.
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as conn:
            found = conn.execute(sql).fetchall()
            statuses = dict(
                conn.execute(
                    "SELECT status, COUNT(id) FROM runs WHERE agent = 'sleeper' GROUP BY status"
                ).fetchall()
            )
            epochs = dict(
                conn.execute(
                    "SELECT lease_epoch, COUNT(id) FROM runs WHERE agent = 'sleeper' "
                    "GROUP BY lease_epoch"
                ).fetchall()
            )
    else:
        import sqlite3

        from toren.store.sqlite import parse_sqlite_url

        with sqlite3.connect(parse_sqlite_url(url)[0], timeout=30) as conn:
            found = conn.execute(sql).fetchall()
            statuses = dict(
                conn.execute(
                    "SELECT status, COUNT(id) FROM runs WHERE agent = 'sleeper' GROUP BY status"
                ).fetchall()
            )
            epochs = dict(
                conn.execute(
                    "SELECT lease_epoch, COUNT(id) FROM runs WHERE agent = 'sleeper' "
                    "GROUP BY lease_epoch"
                ).fetchall()
            )
    found = [f for f in found if f[0] != template]
    due = {r: json.loads(p)["fire_at"] for r, _, _, t, p, _ in found if t == "TimerScheduled"}
    fired = [
        (json.loads(p)["fired_at"] - due[r]) * 1000
        for r, _, _, t, p, _ in found
        if t == "TimerFired"
    ]
    stepped = [(c - due[r]) * 1000 for r, _, _, t, _, c in found if t == "ModelCallRecorded"]

    def spread(xs: list[float]) -> dict[str, float]:
        if not xs:
            return {}
        return {
            "p50": round(_pct(xs, 0.5), 1),
            "p90": round(_pct(xs, 0.9), 1),
            "p99": round(_pct(xs, 0.99), 1),
            "max": round(max(xs), 1),
            "min": round(min(xs), 1),
        }

    return {
        "timers_fired": len(fired),
        "statuses": statuses,
        "lease_epochs": {str(k): v for k, v in epochs.items()},
        "fired_late_ms": spread(fired),
        "next_step_committed_late_ms": spread(stepped),
    }


def timers(
    kind: str,
    count: int,
    workers: int,
    concurrency: int,
    spread: float = 0.0,
    async_commit: bool = False,
) -> dict[str, Any]:
    """``count`` runs parked on ``ctx.sleep(1)``, every timer due at the same instant (or
    spread evenly over ``spread`` seconds), and ``workers`` worker processes: does every
    timer fire, how late, and the workers' peak RSS."""
    backend = Backend.fresh(kind, "timers")
    url = backend.pg_dsn if kind == "postgres" else f"sqlite:///{backend.sqlite_path}"
    procs: list[subprocess.Popen[str]] = []
    try:
        if async_commit and kind == "postgres":
            # Diagnostic only (not a durable configuration): is the herd bound by the
            # disk's commits or by CPU?
            import psycopg

            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(f'ALTER DATABASE "{backend.pg_db}" SET synchronous_commit = off')
        asyncio.run(_migrate(url))
        row, events = asyncio.run(_timer_template(url))
        env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.scale", "timer-worker", url, str(concurrency)],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        t = time.time()
        due = t + 3.0 + count / 4000  # after the fill, which the workers see as parks
        _fill_timers(url, count, due, row, events, spread)
        fill_s = time.time() - t
        assert time.time() < due, "the fill took longer than planned: raise the margin"
        deadline = due + spread + 300
        done = 0
        while time.time() < deadline:
            time.sleep(0.5)
            done = _count_completed(url)
            if done >= count + 1:  # and the template
                break
        drained_s = time.time() - due - spread
        out = []
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            text, _ = p.communicate(timeout=120)
            out.append(json.loads(text.strip().splitlines()[-1]))
        result = {
            "backend": kind,
            "runs": count,
            "workers": workers,
            "concurrency": concurrency,
            "due_spread_s": spread,
            "async_commit_diagnostic": async_commit,
            "fill_seconds": round(fill_s, 2),
            "all_completed_after_last_due_s": round(drained_s, 2),
            **_timer_outcome(url, row.id),
            "worker_stats": out,
        }
        return result
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        backend.drop()


def _count_completed(url: str) -> int:
    sql = "SELECT COUNT(id) FROM runs WHERE agent = 'sleeper' AND status = 'completed'"
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect(url) as conn:
            return int(conn.execute(sql).fetchone()[0])
    import sqlite3

    from toren.store.sqlite import parse_sqlite_url

    with sqlite3.connect(parse_sqlite_url(url)[0], timeout=30) as conn:
        return int(conn.execute(sql).fetchone()[0])


# -- main ----------------------------------------------------------------------------------


def one_backend(kind: str, args: argparse.Namespace) -> dict[str, Any]:
    """The phases asked for (``--phases``) on a fresh database of ``kind``, dropped after;
    or, with ``--database-url``, on that database, kept (fill it once, measure it later on
    a quiet machine: filling the issue's sizes takes many minutes)."""
    kept = args.database_url
    backend = None if kept else Backend.fresh(kind, "scale")
    if kept:
        url = kept
    else:
        assert backend is not None
        url = backend.pg_dsn if kind == "postgres" else f"sqlite:///{backend.sqlite_path}"
    phases = set(args.phases.split(","))
    try:
        result: dict[str, Any] = {
            "backend": kind,
            "runs": args.runs,
            "events_per_run": args.events_per_run,
        }
        if "fill" in phases:
            result["fill"] = fill(url, args.runs, args.events_per_run, args.in_flight)
            print(json.dumps(result["fill"]), flush=True)
        if "queries" in phases:
            result["queries"] = asyncio.run(queries(url))
            if kind == "postgres":
                result["queries"]["explain"] = explain_lists(url)
            print(json.dumps(result["queries"]), flush=True)
        if "plan" in phases:
            result["plan_cli"] = plan_cli(url, tuple(int(j) for j in args.plan_jobs.split(",")))
            print(json.dumps(result["plan_cli"]), flush=True)
        if ("prune" in phases or args.prune) and kind == "postgres":
            result["prune"] = asyncio.run(prune_under_load(url, args.live_runs, args.prune_pause))
            print(json.dumps(result["prune"]), flush=True)
        return result
    finally:
        if backend is not None:
            backend.drop()


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        asyncio.run(serve_worker(sys.argv[2]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "timer-worker":
        asyncio.run(timer_worker(sys.argv[2], int(sys.argv[3])))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="both", choices=("postgres", "sqlite", "both"))
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--events-per-run", type=int, default=50)
    parser.add_argument("--in-flight", type=int, default=1000)
    parser.add_argument("--prune", action="store_true")
    parser.add_argument(
        "--prune-pause",
        type=float,
        default=0.0,
        help="Seconds between prune batches (toren runs prune --pause); 0: full speed.",
    )
    parser.add_argument(
        "--database-url",
        default=None,
        help="Use (and keep) this database instead of a fresh one; with --phases, fill it "
        "once and measure it later.",
    )
    parser.add_argument(
        "--phases",
        default="fill,queries",
        help="Comma-separated: fill, queries, plan (toren plan as a command, see "
        "--plan-jobs), prune (prune: PostgreSQL; also --prune).",
    )
    parser.add_argument(
        "--plan-jobs",
        default="1,2",
        help="With --phases plan: the --jobs values to time toren plan with.",
    )
    parser.add_argument("--live-runs", type=int, default=1000)
    parser.add_argument(
        "--parked",
        type=int,
        default=0,
        help="Instead of the rest: a worker beside this many runs parked on a message "
        "(PostgreSQL): idle RSS and CPU, message-to-next-step latency.",
    )
    parser.add_argument(
        "--kept",
        type=int,
        default=2000,
        help="With --parked: runs the worker first steps to their park itself (20 model "
        "steps each), filling its sticky cache.",
    )
    parser.add_argument(
        "--timers",
        type=int,
        default=0,
        help="Instead of the rest: this many runs parked on ctx.sleep(1), every timer due "
        "at the same instant, and --workers worker processes: lateness and worker RSS.",
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--async-commit",
        action="store_true",
        help="With --timers on PostgreSQL, a diagnostic: the bench database's commits do "
        "not wait for the disk (synchronous_commit off; not a durable configuration).",
    )
    parser.add_argument(
        "--timer-spread",
        type=float,
        default=0.0,
        help="With --timers: spread the due times evenly over this many seconds (0: all "
        "at one instant).",
    )
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--out", default=str(Path(__file__).with_name("scale-results.json")))
    args = parser.parse_args()
    if args.timers:
        kinds = ("postgres", "sqlite") if args.backend == "both" else (args.backend,)
        found = [
            timers(
                k, args.timers, args.workers, args.concurrency, args.timer_spread, args.async_commit
            )
            for k in kinds
        ]
        for item in found:
            print(json.dumps(item), flush=True)
        Path(args.out).write_text(json.dumps(found, indent=2) + "\n")
        return
    if args.parked:
        backend = Backend.fresh("postgres", "parked")
        try:
            result = asyncio.run(parked(backend.pg_dsn, args.parked, args.kept))
        finally:
            backend.drop()
        print(json.dumps(result))
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
        return
    kinds = ("postgres", "sqlite") if args.backend == "both" else (args.backend,)
    if args.database_url:
        kinds = ("postgres",) if args.database_url.startswith("postgres") else ("sqlite",)
    results = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "results": [one_backend(k, args) for k in kinds],
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
