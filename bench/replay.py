"""The cost of replay (issue 39 item 2), one case per process so a profiler or callgrind
sees only it.

    python -m bench.replay --case long --steps 10000 [--backend sqlite|postgres] [--repeats 5]
    python -m bench.replay --case plan --runs 100 --turns 24 [--backend ...]

* ``long``: a run of ``--steps`` recorded model steps that then waits for a message
  (``bench.core.parked_agent``). The bench records it once, then times ticks that replay it
  all (load the log, fold it, re-run the agent resolving every step from the log) and park
  again: what a message to such a run costs before its next live step.
* ``plan``: ``--runs`` engine-written runs of ``--turns`` model + tool turns each (a growing
  conversation, ``bench.scale``'s agent: 48 recorded steps at 24 turns), parked; then
  ``plan_report`` over them in-process, timed. The figure is CPU per replayed step.

``--setup-only`` / ``--db PATH`` let a callgrind run count only the replay: set up once,
then run the measured part with ``--reuse``. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

import toren
from bench import core as bench_core
from bench import scale
from bench import toren_bench as tb
from bench.common import Backend
from toren.core.drivers.fencing import lease_clock
from toren.core.drivers.plan import plan_report
from toren.core.drivers.tick import TickRunner


async def _replay_long(url: str, steps: int, repeats: int, reuse: bool) -> dict[str, Any]:
    store = await toren.connect(url)
    reg = bench_core.registry()
    deps = toren.TickDeps(store=store, agents=reg, providers={"bench": tb.FakeModel()})
    if reuse:
        run_id = (await store.list_runs(status="waiting", limit=1))[0].id
    else:
        run = await toren.start_run(store, reg, "parked", {"steps": steps})
        assert (await toren.tick(run.id, deps)).status == "waiting"
        run_id = run.id
    walls, cpus = [], []
    for _ in range(repeats):
        await store._run(  # type: ignore[attr-defined]
            lambda cur: store._x(cur, "UPDATE runs SET not_before = 0 WHERE id = ?", (run_id,))  # type: ignore[attr-defined]
        )
        granted_at = lease_clock()
        lease = (await store.claim("bench", 1, now=time.time(), ttl=60, only=run_id))[0]
        t0, c0 = time.perf_counter(), time.process_time()
        result = await TickRunner(deps, lease, granted_at=granted_at).run()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        assert result.status == "waiting" and result.replayed == steps, result
    await store.close()
    return {
        "case": "long",
        "steps": steps,
        "wall_s_min": round(min(walls), 4),
        "wall_s_median": round(statistics.median(walls), 4),
        "cpu_s_median": round(statistics.median(cpus), 4),
        "cpu_us_per_step": round(statistics.median(cpus) / steps * 1e6, 1),
        "cpu_us_per_step_min": round(min(cpus) / steps * 1e6, 1),
    }


async def _plan(url: str, runs: int, turns: int, repeats: int, reuse: bool) -> dict[str, Any]:
    if not reuse:
        await scale._engine_runs(url, runs, turns)
    store = await toren.connect(url)
    walls, cpus, replayed = [], [], 0
    try:
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            report = await plan_report(
                store, scale.registry(), code_version="bench-v1", limit=100_000
            )
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            replayed = sum(p["replayed_steps"] for p in report["plans"])
            assert report["runs"] == runs and not report["problems"], report["problems"]
    finally:
        await store.close()
    return {
        "case": "plan",
        "runs": runs,
        "replayed_steps": replayed,
        "wall_s_median": round(statistics.median(walls), 4),
        "cpu_s_median": round(statistics.median(cpus), 4),
        "cpu_us_per_step": round(statistics.median(cpus) / replayed * 1e6, 1),
        "cpu_us_per_step_min": round(min(cpus) / replayed * 1e6, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--case", choices=("long", "plan"), default="long")
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--db", help="SQLite file to keep (with --reuse: replay it only)")
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--setup-only", action="store_true")
    args = parser.parse_args()
    backend = None
    if args.db:
        url = f"sqlite:///{args.db}"
    else:
        backend = Backend.fresh(args.backend, f"replay_{args.case}")
        url = tb.store_url(backend)
    try:
        repeats = 1 if args.setup_only else args.repeats
        if args.case == "long":
            out = asyncio.run(_replay_long(url, args.steps, repeats, args.reuse))
        else:
            out = asyncio.run(_plan(url, args.runs, args.turns, repeats, args.reuse))
        out["backend"] = args.backend if not args.db else "sqlite"
        out["load_average"] = round(os.getloadavg()[0], 2)
        print(json.dumps(out))
    finally:
        if backend is not None:
            backend.drop()


if __name__ == "__main__":
    main()
