"""Provider rate limits across a fleet (issue 37): N runs, one model call each, through a
Toren limit of R requests per minute, against a loopback OpenAI server that enforces the
SAME limit in a sliding window and answers 429 above it (tests.providers.fakes
.ProviderLimit).

    python -m bench.rate_limits [--backend sqlite|postgres|both] [--runs 1000]
                                [--rpm 600] [--period 60] [--baseline]

SQLite runs one worker process, PostgreSQL three (16 runs each at once). Measured:

- **over**: requests the provider refused for being over its limit (must be 0: Toren's
  limit equals the provider's here, so this is "0 over the limit");
- **peak**: the most calls the provider served in one sliding window (<= the limit);
- **rate used**: a sliding window of R per period lets call k + R go no earlier than
  one period after call k. How much later each call past the first R went (``late``:
  p50, max; negative would be over the limit) is what pacing cost; the paced calls'
  rate against the limit is period / (period + mean lateness). (The first R go as fast
  as the workers start them: that burst is the workers' speed, not the limit's.)
- **N calls took**: first to last request, next to the fastest a sliding window allows
  with infinitely fast workers (``floor((N - 1) / R)`` periods);
- **worker CPU**: user+system CPU seconds of the worker processes over the whole run,
  per run and per paced run (a run that had to wait for its slot at least once; from
  ``toren_rate_limit_paced_total``).

``--baseline`` also runs the same runs with no Toren limit: the provider's 429s (each
call retries on its own) are the baseline. Prints a table; ``--out`` writes JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.core.ratelimit_worker import spawn
from tests.providers.fakes import ProviderLimit, serve_fake_models

from bench.common import Backend

KEY = "openai:gpt-4o-mini"
CONCURRENCY = 16


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime + stime


def start_worker(url: str, openai_url: str, limits: dict[str, Any]) -> subprocess.Popen[str]:
    return spawn(url, openai_url, limits, CONCURRENCY)


async def drive(
    url: str, openai_url: str, limits: dict[str, Any], runs: int, size: int
) -> dict[str, Any]:
    from tests.core.ratelimit_worker import registry

    import toren

    store = await toren.connect(url)
    try:
        reg = registry()
        # The workers start (imports, registration) before the runs exist: their CPU is
        # then the runs' alone, and every worker takes part from the first run.
        workers = [start_worker(url, openai_url, limits) for _ in range(size)]
        await asyncio.sleep(2.0)
        cpu_before = sum(cpu_seconds(w.pid) for w in workers)
        ids = []
        try:
            ids = [(await toren.start_run(store, reg, "ask", {"i": i})).id for i in range(runs)]
            while True:
                stats = await store.stats()
                by_status = stats["runs_by_status"]
                assert isinstance(by_status, dict)
                done = sum(int(by_status.get(s, 0)) for s in ("completed", "failed"))
                if done >= runs:
                    break
                await asyncio.sleep(1.0)
            cpu = sum(cpu_seconds(w.pid) for w in workers) - cpu_before
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(timeout=120)
        rows = list(stats.get("rate_limits", ()))  # type: ignore[call-overload]
        paced = sum(int(r[2]) for r in rows)
        statuses = {s: int(n) for s, n in by_status.items()}
        completed = 0
        for i in ids:
            run = await store.get_run(i)
            completed += run is not None and run.status == "completed"
        return {"cpu_s": cpu, "paced": paced, "statuses": statuses, "completed": completed}
    finally:
        await store.close()


def scenario(kind: str, runs: int, rpm: int, period: float, limited: bool) -> dict[str, Any]:
    backend = Backend.fresh(kind, f"rate_{runs}_{int(limited)}")
    url = backend.sqlalchemy_url
    size = 1 if kind == "sqlite" else 3
    provider = ProviderLimit(rpm=rpm, period=period)
    limits = {KEY: {"rpm": rpm, "period": period}} if limited else {}
    try:
        with serve_fake_models() as fake:
            fake.openai.responder = provider
            started = time.monotonic()
            got = asyncio.run(drive(url, fake.openai_url, limits, runs, size))
            wall = time.monotonic() - started
    finally:
        backend.drop()
    served = sorted(provider.arrivals)  # arrivals, 429s included
    span = served[-1] - served[0] if len(served) > 1 else 0.0
    ideal = math.floor((runs - 1) / rpm) * period
    # Pacing delay: call k (k > R) may go no earlier than call k - R plus one period (a
    # sliding window of R); how much later it went is what pacing cost. Negative: over.
    late = [served[k] - (served[k - rpm] + period) for k in range(rpm, len(served))]
    late_sorted = sorted(late)
    mean_late = sum(late) / len(late) if late else 0.0
    result = {
        "backend": kind,
        "workers": size,
        "limited": limited,
        "runs": runs,
        "rpm": rpm,
        "period_s": period,
        "over": provider.over,
        "served": provider.served,
        "requests": len(served),
        "peak": provider.peak,
        "span_s": round(span, 2),
        "ideal_s": ideal,
        "paced_calls": len(late),
        "late_mean_s": round(mean_late, 3),
        "late_p50_s": round(late_sorted[len(late) // 2], 3) if late else None,
        "late_max_s": round(late_sorted[-1], 3) if late else None,
        "late_min_s": round(late_sorted[0], 3) if late else None,
        # the rate the paced calls achieved against the limit: R per (period + mean delay)
        "rate_used": round(period / (period + mean_late), 4) if late else None,
        "wall_s": round(wall, 1),
        "cpu_s": round(got["cpu_s"], 2),
        "cpu_ms_per_run": round(1000 * got["cpu_s"] / runs, 2),
        "paced_runs": got["paced"],
        "cpu_ms_per_paced": round(1000 * got["cpu_s"] / got["paced"], 2) if got["paced"] else None,
        "completed": got["completed"],
        "statuses": got["statuses"],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--rpm", type=int, default=600)
    parser.add_argument("--period", type=float, default=60.0)
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    kinds = ("sqlite", "postgres") if args.backend == "both" else (args.backend,)
    results = []
    for kind in kinds:
        for limited in (True, False) if args.baseline else (True,):
            result = scenario(kind, args.runs, args.rpm, args.period, limited)
            results.append(result)
            print(json.dumps(result), flush=True)
    print()
    print(
        "| backend | limit | over | peak/window | rate used | paced call late p50/max | "
        "N calls took (ideal) | worker CPU/run | CPU/paced run | completed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        used = f"{100 * r['rate_used']:.1f}%" if r["rate_used"] else "-"
        print(
            f"| {r['backend']} ({r['workers']}w) | {'yes' if r['limited'] else 'none'} | "
            f"{r['over']} | {r['peak']}/{r['rpm']} | {used} | {r['late_p50_s']}/"
            f"{r['late_max_s']} s | {r['span_s']} s ({r['ideal_s']:g} s) | "
            f"{r['cpu_ms_per_run']} ms | {r['cpu_ms_per_paced']} ms | "
            f"{r['completed']}/{r['runs']} |"
        )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
