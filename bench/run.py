"""The benchmark harness: the raw commit floor, then every scenario for every available
system on every backend, each scenario in a fresh worker process with a fresh database.

    python -m bench.run                      # full sizes, all systems, sqlite+postgres
    python -m bench.run --quick              # smaller N
    python -m bench.run --systems toren --merge   # add Toren to an existing results.json
    python -m bench.run --systems dbos,langgraph --backends postgres --scenarios sequential

Prints one table (rich) with each peer's figure and Toren's ratio to it, and writes the raw
results to bench/results.json. A system is skipped (its column left empty) when its module
is missing or raises ImportError: Toren's module is bench/toren_bench.py.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib
import json
import os
import platform
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from bench.common import ModelClient, ensure_main_pg_db, pg_available, pg_dsn
from bench.floor import run_floor
from bench.scenarios import HEADLINE, PARAMS, REPO, SCENARIO_NAMES

SYSTEM_MODULES = {
    "toren": "bench.toren_bench",
    "dbos": "bench.peers.dbos_bench",
    "langgraph": "bench.peers.langgraph_bench",
}
LABELS = {"toren": "Toren", "dbos": "DBOS", "langgraph": "LangGraph"}
PRIMARY = {
    "sequential": "steps_per_s",
    "conversation": "steps_per_s",
    "concurrency": "steps_per_s",
    "recovery": "resume_s",
}
RESULTS_PATH = os.path.join(REPO, "bench", "results.json")
console = Console(width=max(shutil.get_terminal_size((170, 40)).columns, 170))


# --------------------------------------------------------------------------- helpers


def load_system(name: str) -> tuple[Any, dict[str, Any]] | None:
    try:
        mod = importlib.import_module(SYSTEM_MODULES[name])
    except ImportError as e:
        console.print(f"[yellow]{name}: not available ({e})[/]")
        return None
    info = mod.info() if hasattr(mod, "info") else {}
    return mod, info


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_model_server(latency: float) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    p = subprocess.Popen(
        [
            sys.executable,
            os.path.join(REPO, "bench", "model_server.py"),
            "--port",
            str(port),
            "--latency",
            str(latency),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return p, url
        except OSError:
            time.sleep(0.05)
    p.kill()
    raise RuntimeError("model server did not start")


def concurrency_ceiling(url: str, runs: int, steps: int) -> dict[str, Any]:
    """The same requests with no runtime and no persistence: the harness's own ceiling."""

    async def main() -> float:
        c = ModelClient(url)

        async def one(r: int) -> None:
            for i in range(steps):
                await c.complete(f"run {r} step {i}")

        t0 = time.perf_counter()
        await asyncio.gather(*(one(r) for r in range(runs)))
        d = time.perf_counter() - t0
        await c.aclose()
        return d

    d = asyncio.run(main())
    return {
        "runs": runs,
        "steps_per_run": steps,
        "seconds": round(d, 3),
        "steps_per_s": round(runs * steps / d, 1),
    }


def run_worker(
    system: str, scenario: str, backend: str, kwargs: dict[str, Any], timeout: float
) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    cmd = [
        sys.executable,
        "-m",
        "bench.worker",
        "run",
        "--module",
        SYSTEM_MODULES[system],
        "--scenario",
        scenario,
        "--backend",
        backend,
        "--tag",
        f"{system}_{scenario}_{backend}",
        "--kwargs",
        json.dumps(kwargs),
        "--out",
        out,
    ]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, cwd=REPO, timeout=timeout, capture_output=True, text=True)
        with open(out) as f:
            res: dict[str, Any] = json.load(f)
        if not res.get("ok"):
            res["stderr_tail"] = p.stderr[-2000:]
    except subprocess.TimeoutExpired:
        res = {"ok": False, "error": f"timeout after {timeout}s"}
    except (OSError, json.JSONDecodeError) as e:
        res = {"ok": False, "error": f"worker failed: {e}"}
    finally:
        if os.path.exists(out):
            os.unlink(out)
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    return res


def run_repeated(
    system: str, scenario: str, backend: str, kwargs: dict[str, Any], repeat: int, timeout: float
) -> dict[str, Any]:
    """Run ``repeat`` times; keep the run with the median primary figure, list all."""
    runs = [run_worker(system, scenario, backend, kwargs, timeout) for _ in range(repeat)]
    good = [r for r in runs if r.get("ok")]
    if not good:
        return runs[-1]
    key = PRIMARY[scenario]
    good.sort(key=lambda r: r.get(key, 0))
    chosen = dict(good[(len(good) - 1) // 2])
    if repeat > 1:
        chosen["repeats"] = [r.get(key) for r in runs]
    return chosen


def machine_info() -> dict[str, Any]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            mem = f.readline().split(":", 1)[1].strip()
    except OSError:
        pass
    pg = ""
    if pg_available():
        import psycopg

        with psycopg.connect(pg_dsn("postgres")) as c:
            pg = c.execute("SHOW server_version").fetchone()[0]
            pg += ", synchronous_commit=" + c.execute("SHOW synchronous_commit").fetchone()[0]
            pg += ", fsync=" + c.execute("SHOW fsync").fetchone()[0]
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem": mem,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "postgres": pg,
    }


# --------------------------------------------------------------------------- table


def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.2f}".rstrip("0").rstrip(".")
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _ratio(toren: Any, peer: Any, higher_better: bool) -> str:
    if not isinstance(toren, (int, float)) or not isinstance(peer, (int, float)):
        return ""
    num, den = (toren, peer) if higher_better else (peer, toren)
    if den == 0:
        return "=" if num == 0 else "∞"
    return f"{num / den:.2f}×"


def print_table(data: dict[str, Any]) -> None:
    results = data.get("results", {})
    systems = [s for s in ("dbos", "langgraph") if s in results] + [
        s for s in results if s not in ("dbos", "langgraph", "toren")
    ]
    peers = systems
    t = Table(
        title=f"Toren vs peers — {data['meta'].get('mode', '')} — {data['meta'].get('date', '')}",
        caption="Toren vs X: how many times better Toren is (>1 = Toren better; "
        "lower-is-better rows inverted). SQLite: WAL+synchronous=FULL; "
        "PostgreSQL: synchronous_commit=on.",
    )
    t.add_column("backend", no_wrap=True)
    t.add_column("metric", no_wrap=True)
    t.add_column("floor / ceiling", justify="right")
    for s in peers:
        t.add_column(LABELS.get(s, s), justify="right")
    t.add_column("Toren", justify="right", style="bold")
    for s in peers:
        t.add_column(f"Toren vs {LABELS.get(s, s)}", justify="right")

    floor = data.get("floor", {})
    ceil = data.get("ceiling", {})
    backends = data["meta"].get("backends", ["sqlite", "postgres"])
    for be in backends:
        if be == "sqlite":
            for k, lab in (
                ("sqlite_wal_full", "floor: INSERT+COMMIT/s, WAL FULL"),
                ("sqlite_wal_normal", "floor: INSERT+COMMIT/s, WAL NORMAL"),
            ):
                if k in floor:
                    t.add_row(
                        be, lab, _fmt(floor[k]["commits_per_s"]), *[""] * (2 * len(peers) + 1)
                    )
        elif "postgres_autocommit" in floor:
            t.add_row(
                be,
                "floor: INSERT+COMMIT/s, autocommit",
                _fmt(floor["postgres_autocommit"]["commits_per_s"]),
                *[""] * (2 * len(peers) + 1),
            )
        for scen, key, label, hib in HEADLINE:
            ref = ""
            if scen == "concurrency" and key == "steps_per_s" and ceil:
                ref = _fmt(ceil.get("steps_per_s")) + " (no runtime)"
            vals = []
            for s in peers:
                r = results.get(s, {}).get(be, {}).get(scen, {})
                vals.append(r.get(key) if r.get("ok") else ("error" if r else None))
            tr = results.get("toren", {}).get(be, {}).get(scen, {})
            tv = tr.get(key) if tr.get("ok") else ("error" if tr else None)
            if all(v is None for v in vals) and tv is None:
                continue
            t.add_row(
                be,
                label,
                ref,
                *[_fmt(v) for v in vals],
                _fmt(tv),
                *[_ratio(tv, v, hib) for v in vals],
            )
        t.add_section()
    console.print(t)


def markdown_table(data: dict[str, Any]) -> str:
    """The same rows as :func:`print_table`, as Markdown (for RESULTS.md), with the
    per-repeat primary figures when --repeat > 1."""
    results = data.get("results", {})
    peers = [s for s in results if s != "toren"]
    cols = [
        "backend",
        "metric",
        "floor / ceiling",
        *[LABELS.get(s, s) for s in peers],
        "Toren",
        *[f"Toren vs {LABELS.get(s, s)}" for s in peers],
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    floor, ceil = data.get("floor", {}), data.get("ceiling", {})
    blank = [""] * (2 * len(peers) + 1)
    for be in data["meta"].get("backends", []):
        fl = {
            "sqlite": [
                ("sqlite_wal_full", "floor: INSERT+COMMIT/s, WAL FULL"),
                ("sqlite_wal_normal", "floor: INSERT+COMMIT/s, WAL NORMAL"),
            ],
            "postgres": [("postgres_autocommit", "floor: INSERT+COMMIT/s, autocommit")],
        }[be]
        for k, lab in fl:
            if k in floor:
                lines.append(
                    "| " + " | ".join([be, lab, _fmt(floor[k]["commits_per_s"]), *blank]) + " |"
                )
        for scen, key, label, hib in HEADLINE:
            ref = (
                _fmt(ceil.get("steps_per_s")) + " (no runtime)"
                if (scen == "concurrency" and key == "steps_per_s" and ceil)
                else ""
            )
            vals, cells = [], []
            for s in [*peers, "toren"]:
                r = results.get(s, {}).get(be, {}).get(scen, {})
                v = r.get(key) if r.get("ok") else None
                cell = _fmt(v)
                if v is not None and key == PRIMARY[scen] and r.get("repeats"):
                    cell += " (" + " / ".join(_fmt(x) for x in r["repeats"]) + ")"
                vals.append(v)
                cells.append(cell)
            if all(v is None for v in vals):
                continue
            tv = vals[-1]
            lines.append(
                "| "
                + " | ".join([be, label, ref, *cells, *[_ratio(tv, v, hib) for v in vals[:-1]]])
                + " |"
            )
    return "\n".join(lines)


# --------------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--systems", default="toren,dbos,langgraph")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--scenarios", default=",".join(SCENARIO_NAMES))
    ap.add_argument("--quick", action="store_true", help="smaller N (see scenarios.PARAMS)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per cell; the median is kept")
    ap.add_argument("--floor-n", type=int, default=0, help="commits per floor measurement")
    ap.add_argument("--no-floor", action="store_true")
    ap.add_argument("--latency", type=float, default=0.2, help="model server latency, s")
    ap.add_argument("--timeout", type=float, default=900, help="per scenario run, s")
    ap.add_argument("--out", default=RESULTS_PATH)
    ap.add_argument("--merge", action="store_true", help="update the existing --out file")
    ap.add_argument("--table-only", action="store_true", help="print the table of --out")
    ap.add_argument("--markdown", action="store_true", help="with --table-only: Markdown")
    a = ap.parse_args()

    if a.table_only:
        with open(a.out) as f:
            d = json.load(f)
        print(markdown_table(d)) if a.markdown else print_table(d)
        return 0

    mode = "quick" if a.quick else "full"
    params = PARAMS[mode]
    backends = [b for b in a.backends.split(",") if b]
    if "postgres" in backends:
        if pg_available():
            ensure_main_pg_db()
        else:
            console.print("[yellow]PostgreSQL not reachable on 127.0.0.1:5432: skipping it[/]")
            backends.remove("postgres")
    scenarios = [s for s in a.scenarios.split(",") if s]

    data: dict[str, Any] = {"meta": {}, "floor": {}, "ceiling": {}, "systems": {}, "results": {}}
    if a.merge and os.path.exists(a.out):
        with open(a.out) as f:
            data = json.load(f)
    data["meta"].update(
        {
            "date": dt.datetime.now().astimezone().isoformat(timespec="seconds"),
            "mode": mode,
            "params": params,
            "repeat": a.repeat,
            "backends": sorted(
                set(data["meta"].get("backends", [])) | set(backends),
                key=["sqlite", "postgres"].index,
            )
            if a.merge
            else backends,
            "machine": machine_info(),
            "durability": {
                "sqlite": "journal_mode=WAL, synchronous=FULL",
                "postgres": "synchronous_commit=on, fsync=on (server defaults)",
            },
            "model_server_latency_s": a.latency,
            "loadavg_at_start": os.getloadavg(),
        }
    )

    systems = {}
    for name in [s for s in a.systems.split(",") if s]:
        loaded = load_system(name)
        if loaded is not None:
            systems[name] = loaded[0]
            data["systems"][name] = loaded[1]

    if not a.no_floor:
        n = a.floor_n or (1000 if a.quick else 5000)
        console.print(f"[bold]floor[/] ({n} commits)…")
        data["floor"].update(run_floor(n, tuple(backends)))

    server, url = start_model_server(a.latency)
    try:
        if "concurrency" in scenarios:
            c = params["concurrency"]
            console.print("[bold]concurrency ceiling[/] (no runtime)…")
            data["ceiling"] = concurrency_ceiling(url, c["runs"], c["steps"])
        for be in backends:
            for scen in scenarios:
                for name in systems:
                    kwargs: dict[str, Any] = dict(params[scen])
                    if scen == "concurrency":
                        kwargs["model_url"] = url
                    console.print(f"[bold]{name}[/] {be} {scen} {kwargs}…", end=" ")
                    res = run_repeated(name, scen, be, kwargs, a.repeat, a.timeout)
                    data["results"].setdefault(name, {}).setdefault(be, {})[scen] = res
                    ok = res.get("ok")
                    console.print(
                        ("[green]" if ok else "[red]")
                        + (
                            f"{PRIMARY[scen]}={res.get(PRIMARY[scen])}"
                            if ok
                            else res.get("error", "")
                        )
                        + f" ({res['wall_s']}s)[/]"
                    )
                    with open(a.out, "w") as f:  # save as we go
                        json.dump(data, f, indent=2, sort_keys=True)
    finally:
        server.kill()
        server.wait()

    data["meta"]["loadavg_at_end"] = os.getloadavg()
    with open(a.out, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
    print_table(data)
    console.print(f"raw results: {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
