"""Toren's own engine benchmarks (issue 2), one table: durable step overhead next to the
raw commit floor on both backends, replay time of 1,000- and 10,000-step runs, and the
time from ``start_run`` to the first step on an idle worker.

    python -m bench.core            # full
    python -m bench.core --quick

Durability: SQLite WAL with synchronous=FULL (the floor uses the same), PostgreSQL with
synchronous_commit=on. Figures are measured, never asserted: see bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import toren
from bench import floor as raw_floor
from bench import toren_bench as tb
from bench.common import Backend, fake_model, pg_available
from toren.config import LeaseSettings
from toren.core.contract.digest import canonical_json, message_hash, message_list_node
from toren.core.contract.events import Event, ModelCallRecorded, make_event
from toren.core.contract.replay import step_slot
from toren.core.drivers.fencing import lease_clock
from toren.core.drivers.tick import TickRunner
from toren.providers.base import ModelRequest, ModelResponse, Usage


class InstantModel:
    """Zero latency; records when each call started (first-step latency)."""

    name = "bench"

    def __init__(self) -> None:
        self.started: list[float] = []

    async def complete(self, request: ModelRequest, *, on_delta: Any = None) -> ModelResponse:
        self.started.append(time.perf_counter())
        return ModelResponse(text="ok", usage=Usage(5, 1))


async def parked_agent(ctx: toren.Context, input: Any) -> Any:
    for i in range(input["steps"]):
        await ctx.model("bench:fake", [{"role": "user", "content": f"step {i}"}], step=i)
    return await ctx.wait_for_message("go")


async def one_step(ctx: toren.Context, input: Any) -> Any:
    await ctx.model("bench:fake", [{"role": "user", "content": "first"}])
    return 1


def registry() -> toren.Registry:
    reg = tb.registry()
    reg.add("parked", parked_agent)
    reg.add("one", one_step)
    return reg


async def replay_time(backend: Backend, steps: int, repeats: int = 3) -> dict[str, Any]:
    """Record a run of ``steps`` model calls that then waits; time ticks that replay it
    all (load the log, fold it, re-execute the agent resolving every step) and park."""
    store = await toren.connect(tb.store_url(backend))
    reg = registry()
    deps = toren.TickDeps(store=store, agents=reg, providers={"bench": tb.FakeModel()})
    run = await toren.start_run(store, reg, "parked", {"steps": steps})
    assert (await toren.tick(run.id, deps)).status == "waiting"
    times = []
    for _ in range(repeats):
        await store._run(  # type: ignore[attr-defined]
            lambda cur: store._x(cur, "UPDATE runs SET not_before = 0 WHERE id = ?", (run.id,))  # type: ignore[attr-defined]
        )
        granted_at = lease_clock()
        lease = (await store.claim("bench", 1, now=time.time(), ttl=60, only=run.id))[0]
        t0 = time.perf_counter()
        result = await TickRunner(deps, lease, granted_at=granted_at).run()
        times.append(time.perf_counter() - t0)
        assert result.status == "waiting" and result.replayed == steps and result.executed == 0
    await store.close()
    return {
        "steps": steps,
        "replay_s": round(min(times), 3),
        "replay_s_median": round(statistics.median(times), 3),
    }


def step_writes(run_id: str, start: int, n: int) -> list[tuple[list[Event], dict[str, str]]]:
    """What sequential steps ``start`` .. ``start + n - 1`` write, built ahead: each its
    ModelCallRecorded event with a 2 KB response, and its blobs (the message body and the
    message-list node)."""
    writes = []
    for i in range(start, start + n):
        message = {"role": "user", "content": f"step {i}"}
        key = message_hash(message)
        node, node_body = message_list_node(None, [key])
        payload = ModelCallRecorded(
            provider="bench",
            model="fake",
            message_list=node,
            message_count=1,
            params={"step": i},
            response=ModelResponse(text=fake_model(i), usage=Usage(10, 500)).to_dict(),
            input_tokens=10,
            output_tokens=500,
        )
        event = make_event(
            run_id,
            payload,
            stream="main",
            position=i,
            slot=step_slot("main", 0, i),
            digest=f"{i:064x}",
            created_at=time.time(),
        )
        writes.append(([event], {key: canonical_json(message).decode(), node: node_body}))
    return writes


async def store_append_rate(backend: Backend, steps: int) -> dict[str, Any]:
    """The store alone: ``steps`` appends of exactly what a sequential step writes (its
    ModelCallRecorded event with a 2 KB response, the message blob and the list node),
    built beforehand, through Toren's store API: the transaction a step costs with no
    engine around it. Between the raw floor (one plain row) and the engine's steps/s."""
    store = await toren.connect(tb.store_url(backend))
    reg = registry()
    run = await toren.start_run(store, reg, "one")
    lease = (await store.claim("bench", 1, now=time.time(), ttl=600))[0]
    writes = step_writes(run.id, 0, steps)
    t0 = time.perf_counter()
    for events, blobs in writes:
        await store.append(lease, events, blobs=blobs, now=time.time())
    elapsed = time.perf_counter() - t0
    await store.close()
    return {"steps": steps, "appends_per_s": round(steps / elapsed, 1)}


async def first_step_latency(backend: Backend, runs: int = 40) -> dict[str, Any]:
    """An idle worker (polling once a second, so only the wake-up signal is fast): the
    time from calling start_run to the first model call starting."""
    store = await toren.connect(tb.store_url(backend))
    reg = registry()
    model = InstantModel()
    settings = toren.Settings(lease=LeaseSettings(ttl=30, heartbeat=5), poll_interval=1.0)
    deps = toren.TickDeps(store=store, agents=reg, providers={"bench": model}, settings=settings)
    latencies = []
    async with toren.LocalWorkerRuntime(deps):
        await asyncio.sleep(0.3)
        for _ in range(runs):
            await asyncio.sleep(0.05)  # the worker is idle again
            before = len(model.started)
            t0 = time.perf_counter()
            run = await toren.start_run(store, reg, "one")
            while len(model.started) == before:
                await asyncio.sleep(0.0005)
            latencies.append(model.started[before] - t0)
            await toren.wait_for_run(store, run.id, timeout=10)
    await store.close()
    ms = sorted(x * 1000 for x in latencies)
    return {
        "runs": runs,
        "p50_ms": round(statistics.median(ms), 2),
        "p90_ms": round(ms[int(len(ms) * 0.9)], 2),
    }


def paired_ratio(kind: str, steps: int, pairs: int = 5, floor_n: int = 2000) -> dict[str, Any]:
    """Toren's sequential steps/s over the raw floor, measured in alternating pairs (floor,
    then a fresh Toren run, back to back) so that both halves of each ratio see the same
    disk: this machine's commit latency drifts by 2x within minutes, which moves a ratio
    of two figures taken minutes apart more than any change to Toren does."""
    rows = []
    for i in range(pairs):
        if kind == "sqlite":
            floor = raw_floor.sqlite_floor(floor_n, "FULL")["commits_per_s"]
        else:
            floor = raw_floor.postgres_floor(floor_n)["commits_per_s"]
        backend = Backend.fresh(kind, f"core_pair{i}")
        try:
            seq = tb.sequential(backend, steps)["steps_per_s"]
        finally:
            backend.drop()
        rows.append({"floor": floor, "steps_per_s": seq, "ratio": round(seq / floor, 3)})
    ratios = sorted(r["ratio"] for r in rows)
    return {
        "pairs": rows,
        "median_ratio": statistics.median(ratios),
        "range": [ratios[0], ratios[-1]],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--backends", default="sqlite,postgres")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b != "postgres" or pg_available()]
    steps = 200 if args.quick else 500
    results: dict[str, Any] = {"floor": raw_floor.run_floor(2000, tuple(backends))}
    for kind in backends:
        r: dict[str, Any] = {}
        for name, fn in (
            ("sequential", lambda b: tb.sequential(b, steps)),
            ("store_only", lambda b: asyncio.run(store_append_rate(b, steps))),
            ("replay_1k", lambda b: asyncio.run(replay_time(b, 1000))),
            ("replay_10k", lambda b: asyncio.run(replay_time(b, 1000 if args.quick else 10_000))),
            ("first_step", lambda b: asyncio.run(first_step_latency(b, 20 if args.quick else 50))),
        ):
            backend = Backend.fresh(kind, f"core_{name}")
            try:
                r[name] = fn(backend)
            finally:
                backend.drop()
        r["paired"] = paired_ratio(kind, steps, pairs=3 if args.quick else 5)
        results[kind] = r
    Path(__file__).with_name("core-results.json").write_text(json.dumps(results, indent=2))
    table = Table(title="Toren engine (issue 2 targets)")
    for col in ("backend", "metric", "Toren", "reference", "target"):
        table.add_column(col)
    fl = results["floor"]
    for kind in backends:
        r = results[kind]
        floor_key = "sqlite_wal_full" if kind == "sqlite" else "postgres_autocommit"
        floor = fl.get(floor_key, {}).get("commits_per_s")
        seq = r["sequential"]["steps_per_s"]
        table.add_row(
            kind,
            f"durable steps/s ({steps} steps, 2 KB)",
            f"{seq:,.0f}",
            f"floor {floor:,.0f}/s" if floor else "",
            "within 2x of floor",
        )
        paired = r["paired"]
        low, high = paired["range"]
        table.add_row(
            kind,
            f"steps/s ÷ floor, {len(paired['pairs'])} alternating pairs",
            f"{paired['median_ratio']:.2f}×",
            f"range {low:.2f}-{high:.2f}×",
            "≥ 0.5×",
        )
        table.add_row(
            kind,
            "store alone: appends/s (a step's transaction, no engine)",
            f"{r['store_only']['appends_per_s']:,.0f}",
            "",
            "",
        )
        table.add_row(kind, "replay 1,000 steps", f"{r['replay_1k']['replay_s']:.3f} s", "", "")
        table.add_row(
            kind,
            f"replay {r['replay_10k']['steps']:,} steps",
            f"{r['replay_10k']['replay_s']:.3f} s",
            "",
            "< 0.5 s",
        )
        table.add_row(
            kind,
            "start_run → first step, p50",
            f"{r['first_step']['p50_ms']:.1f} ms",
            f"p90 {r['first_step']['p90_ms']:.1f} ms",
            "< 20 ms PG, < 50 ms SQLite",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
