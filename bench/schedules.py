"""Schedules at fleet scale (issue 38): N schedules firing every minute, all at the same
instant (the top of each minute), and one worker with default settings.

    python -m bench.schedules [--backend sqlite|postgres|both] [--schedules 1000]
                              [--minutes 2] [--workers 1]

Each schedule is ``every: 60`` (so every one of them is due at the same second) with
``overlap: allow_all``; its run is one clock read, which the same worker(s) execute. The
worker processes are started, left to register and idle, then measured over ``--minutes``
top-of-minute firings:

- **lateness**: per run, the moment its row became visible to a reader (the commit of
  the firing's transaction, seen by a poller in this process that counts each nominal
  time's runs every 10 ms from just before the nominal time until all N are there)
  minus its nominal time: p50, p99 and max. Also reported, as ``decided``: the row's
  ``created_at`` (the clock read at the start of the look that fired it) minus its
  nominal time, which leaves out the look's own transaction;
- **fired**: runs started per nominal time (must be exactly N each; a second run for one
  nominal time would be a bug, and so would a missing one);
- **worker CPU**: the worker processes' user+system CPU seconds over the measured minutes,
  per minute and per firing (``/proc/PID/stat``), the runs' own execution included.

Prints a table; ``--out`` writes the figures as JSON. Summarised in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import Backend
from toren.core.contract.clock import SystemClock
from toren.core.contract.schedule import ScheduleDef, ScheduleSpec
from toren.store import connect

ROOT = Path(__file__).parents[1]
AGENT = "tick"


def worker_main(url: str) -> None:
    """A worker process: the `tick` agent, default settings, until SIGTERM."""
    import toren

    async def tick(ctx: toren.Context, input: Any) -> Any:
        return {"at": await ctx.now()}

    async def go() -> None:
        reg = toren.Registry()
        reg.add(AGENT, tick, code_version="bench")
        store = await toren.connect(url)
        worker = toren.LocalWorkerRuntime(toren.TickDeps(store=store, agents=reg))
        await worker.start()
        worker.install_signal_handlers()
        print("ready", flush=True)
        await worker.wait_stopped()
        await store.close()

    asyncio.run(go())


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


async def create(url: str, n: int) -> None:
    store = await connect(url)
    try:
        spec = ScheduleSpec(every=60, overlap="allow_all")
        now = SystemClock().now()
        for i in range(n):
            await store.schedules.create(ScheduleDef(AGENT, f"s{i:05d}", spec), now=now)
    finally:
        await store.close()


POLL = 0.01  # s between the poller's counts


def _counter(kind: str, url: str, sqlite_path: str | None) -> Any:
    """A function returning how many runs a nominal time has, on its own connection."""
    if kind == "sqlite":
        assert sqlite_path is not None
        conn = sqlite3.connect(sqlite_path, isolation_level=None)
        sql = "SELECT COUNT(id) FROM runs WHERE scheduled_for = ?"
    else:
        import psycopg

        conn = psycopg.connect(url, autocommit=True)
        sql = "SELECT COUNT(id) FROM runs WHERE scheduled_for = %s"

    def count(nominal: float) -> int:
        return int(conn.execute(sql, (nominal,)).fetchone()[0])

    return count, conn


def watch(
    kind: str,
    url: str,
    path: str | None,
    nominals: list[float],
    n: int,
    out: dict[float, list[float]],
) -> None:
    """Per nominal time: from 0.2 s before it, count its runs every POLL s until all ``n``
    are visible (or 30 s passed); each newly visible run's lateness is the count's time
    minus the nominal time (at most POLL plus one count late)."""
    count, conn = _counter(kind, url, path)
    try:
        _watch(count, nominals, n, out)
    finally:
        conn.close()


def _watch(count: Any, nominals: list[float], n: int, out: dict[float, list[float]]) -> None:
    for nominal in nominals:
        time.sleep(max(0.0, nominal - 0.2 - time.time()))
        seen: list[float] = []
        while len(seen) < n and time.time() < nominal + 30:
            found = count(nominal)
            at = time.time()
            seen += [at - nominal] * (found - len(seen))
            time.sleep(POLL)
        out[nominal] = seen


async def lateness(url: str, n: int) -> dict[float, list[float]]:
    """Per nominal time, each run's commit minus its nominal time."""
    store = await connect(url)
    try:
        found: dict[float, list[float]] = {}
        for i in range(n):
            for run_id, _, at in await store.schedules.runs_of(f"{AGENT}/s{i:05d}", limit=100):
                run = await store.get_run(run_id)
                assert run is not None and at is not None
                found.setdefault(at, []).append(run.created_at - at)
        return found
    finally:
        await store.close()


def measure(kind: str, n: int, minutes: int, workers: int) -> dict[str, Any]:
    backend = Backend.fresh(kind, f"schedules_{n}")
    url = f"sqlite:///{backend.sqlite_path}" if kind == "sqlite" else backend.pg_dsn
    try:
        asyncio.run(create(url, n))
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "bench.schedules", "--worker", url],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        # Measure from 2 s before a top of minute (B0) to 2 s before the top of the minute
        # after the last measured one: every measured firing and its runs' execution
        # fall inside, and no other firing does.
        now = time.time()
        boundary = (now // 60 + 1) * 60
        if boundary - now < 5:  # too close to register and settle first
            boundary += 60
        visible: dict[float, list[float]] = {}
        nominals = [boundary + 60 * i for i in range(minutes)]
        path = backend.sqlite_path if kind == "sqlite" else None
        poller = threading.Thread(target=watch, args=(kind, url, path, nominals, n, visible))
        poller.start()
        time.sleep(max(0.0, boundary - 2 - time.time()))
        cpu0 = sum(cpu_seconds(p.pid) for p in procs)
        time.sleep(max(0.0, boundary + minutes * 60 - 2 - time.time()))
        cpu1 = sum(cpu_seconds(p.pid) for p in procs)
        poller.join()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=120)
            assert p.stdout is not None
            p.stdout.close()
        by_time = asyncio.run(lateness(url, n))
        first, last = boundary, boundary + (minutes - 1) * 60
        measured = {t: v for t, v in by_time.items() if first <= t <= last}
        decided = sorted(x for v in measured.values() for x in v)
        late = sorted(x for v in visible.values() for x in v)
        fired = sorted(len(v) for v in measured.values())
        assert len(late) == len(decided), "the poller saw another number of runs"
        return {
            "backend": kind,
            "schedules": n,
            "workers": workers,
            "minutes": len(measured),
            "fired_per_time": fired,
            "lateness_p50_s": round(statistics.median(late), 4),
            "lateness_p99_s": round(late[int(len(late) * 0.99) - 1], 4),
            "lateness_max_s": round(late[-1], 4),
            "decided_p50_s": round(statistics.median(decided), 4),
            "decided_p99_s": round(decided[int(len(decided) * 0.99) - 1], 4),
            "worker_cpu_s_per_minute": round((cpu1 - cpu0) / minutes, 3),
            "worker_cpu_ms_per_firing": round((cpu1 - cpu0) * 1000 / max(1, len(late)), 3),
        }
    finally:
        backend.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", default=None)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    kinds = ["sqlite", "postgres"] if args.backend == "both" else [args.backend]
    rows = [measure(k, args.schedules, args.minutes, args.workers) for k in kinds]
    head = (
        f"{'backend':<9} {'schedules':>9} {'workers':>7} {'minutes':>7} {'fired/time':>11} "
        f"{'p50 s':>7} {'p99 s':>7} {'max s':>7} {'CPU s/min':>9} {'CPU ms/fire':>11} "
        f"{'decided p50':>11} {'p99':>7}"
    )
    print(head)
    for r in rows:
        fired = f"{r['fired_per_time'][0]}-{r['fired_per_time'][-1]}"
        print(
            f"{r['backend']:<9} {r['schedules']:>9} {r['workers']:>7} {r['minutes']:>7} "
            f"{fired:>11} {r['lateness_p50_s']:>7} {r['lateness_p99_s']:>7} "
            f"{r['lateness_max_s']:>7} {r['worker_cpu_s_per_minute']:>9} "
            f"{r['worker_cpu_ms_per_firing']:>11} {r['decided_p50_s']:>11} "
            f"{r['decided_p99_s']:>7}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
