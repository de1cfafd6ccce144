"""Waking a parked run for one step, with and without the sticky cache (issue 39).

    python -m bench.sticky [--runs 300] [--steps 20] [--backend sqlite|postgres|both]
                           [--wake message|timer]

Each run records ``--steps`` model steps (scripted, no network), then waits for a message
in a loop: every message is one more model step and a park (``--wake timer``: sleeps a
minute in a loop instead, on a manual clock the bench moves; every timer that fires is one
more model step and a park). The bench parks every run
once, then measures rounds of wakes: send each run a message and tick it once (on this
event loop, one run after another: the CPU of a wake, not a fleet's throughput). With the
cache off every wake loads the log and replays every earlier step; with it on, the tick
kept at the park continues in place. Printed per wake: CPU (process time) and steps
replayed; and the memory the cache holds per kept run (tracemalloc) next to the
estimate the cache bounds itself by (``StickyRuns.weight``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import tracemalloc
from typing import Any

import toren
from toren.core.drivers.sticky import StickyRuns
from toren.providers.scripted import ScriptedProvider


def registry(steps: int, wake: str = "message") -> toren.Registry:
    async def agent(ctx: toren.Context, input: Any) -> Any:
        messages: list[dict[str, Any]] = [{"role": "system", "content": "bench"}]
        for i in range(steps):
            messages.append({"role": "user", "content": f"step {i}"})
            messages.append((await ctx.model("scripted:echo", messages)).message())
        while True:
            if wake == "timer":
                await ctx.sleep(60)
                text: object = "a minute later"
            else:
                text = await ctx.wait_for_message("next")
            if text == "stop":
                return {"steps": len(messages)}
            messages.append({"role": "user", "content": str(text)})
            messages.append((await ctx.model("scripted:echo", messages)).message())

    reg = toren.Registry()
    reg.add("bench", agent, code_version="b")
    return reg


async def measure(
    url: str, runs: int, steps: int, rounds: int, cached: bool, wake: str = "message"
) -> dict[str, Any]:
    store = await toren.connect(url)
    # Timers on a clock the bench moves: a round's timers are all due at once.
    clock = toren.ManualClock(time.time()) if wake == "timer" else toren.SystemClock()
    try:
        reg = registry(steps, wake)
        sticky = StickyRuns(10**10) if cached else None
        settings = toren.Settings(pause_gc_on_replay=True)
        deps = toren.TickDeps(
            store=store,
            agents=reg,
            providers={"scripted": ScriptedProvider()},
            settings=settings,
            sticky=sticky,
            clock=clock,
        )
        ids = [
            (await toren.start_run(store, reg, "bench", {}, clock=clock)).id for _ in range(runs)
        ]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for run_id in ids:
            assert (await toren.tick(run_id, deps)).status == "waiting"
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        cpu = wall = 0.0
        replayed = 0
        for r in range(rounds):
            if isinstance(clock, toren.ManualClock):
                await clock.advance(60)
            else:
                for run_id in ids:
                    await toren.send_message(store, run_id, "next", f"round {r}")
            t0, c0 = time.perf_counter(), time.process_time()
            for run_id in ids:
                result = await toren.tick(run_id, deps)
                assert result.status == "waiting", result
                replayed += result.replayed
            cpu += time.process_time() - c0
            wall += time.perf_counter() - t0
        wakes = runs * rounds
        estimate = (
            sum(StickyRuns.weight(r) for r, _ in sticky._kept.values()) / runs
            if sticky is not None
            else 0.0
        )
        if sticky is not None:
            assert sticky.continued == wakes, (sticky.continued, wakes)
            sticky.clear()
        return {
            "cpu_ms_per_wake": 1000 * cpu / wakes,
            "wall_ms_per_wake": 1000 * wall / wakes,
            "replayed_per_wake": replayed / wakes,
            "kept_kb_per_run": held / runs / 1000 if cached else 0.0,
            "estimate_kb_per_run": estimate / 1000,
        }
    finally:
        await store.close()


def database(backend: str, tmp: str, name: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{os.path.join(tmp, name + '.db')}"
    import psycopg

    base = os.environ.get("TOREN_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    db = f"toren_bench_sticky_{name}_{os.getpid()}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{db}"')
        conn.execute(f'CREATE DATABASE "{db}"')
    return base.rsplit("/", 1)[0] + "/" + db


def drop(url: str) -> None:
    """Drop a PostgreSQL database :func:`database` made (a SQLite file goes with its
    temporary directory)."""
    if url.startswith("sqlite"):
        return
    import psycopg

    base = os.environ.get("TOREN_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{url.rsplit("/", 1)[1]}" WITH (FORCE)')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="sqlite")
    parser.add_argument("--wake", choices=("message", "timer"), default="message")
    args = parser.parse_args()
    backends = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    print(
        f"{args.runs} runs x {args.steps} recorded steps, {args.rounds} rounds of one wake "
        f"per run ({args.wake} -> one model step -> park)"
    )
    print(
        "| backend | cache | CPU ms/wake | wall ms/wake | steps replayed/wake "
        "| kept KB/run (measured) | KB/run (estimate) |"
    )
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for backend in backends:
            # Alternate off, on, off, on: the two conditions in the same run.
            for i, cached in enumerate((False, True, False, True)):
                url = database(backend, tmp, f"{backend}{i}")
                try:
                    got = asyncio.run(
                        measure(url, args.runs, args.steps, args.rounds, cached, args.wake)
                    )
                finally:
                    drop(url)
                print(
                    f"| {backend} | {'on' if cached else 'off'} | {got['cpu_ms_per_wake']:.2f} "
                    f"| {got['wall_ms_per_wake']:.2f} | {got['replayed_per_wake']:.1f} "
                    f"| {got['kept_kb_per_run']:.0f} | {got['estimate_kb_per_run']:.0f} |"
                )


if __name__ == "__main__":
    main()
