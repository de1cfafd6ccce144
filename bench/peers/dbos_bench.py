"""DBOS Transact (PyPI ``dbos``) on the bench scenarios.

Idiomatic DBOS: ``@DBOS.workflow()`` functions calling ``@DBOS.step()`` functions; each
step's output is checkpointed in the system database before the workflow continues.
Sequential, conversation and recovery use synchronous workflows (DBOS's fastest path for
one run); concurrency uses async workflows started with ``DBOS.start_workflow_async``.

SQLite durability is forced to the bench setting (WAL, synchronous=FULL) with a
SQLAlchemy connect hook on every engine; DBOS itself sets only busy_timeout and
foreign_keys, leaving the rollback journal (DELETE) by default.
"""

from __future__ import annotations

import asyncio
import time
from importlib.metadata import version
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig, SetWorkflowID
from sqlalchemy import event

from bench.common import (
    SQLITE_SYNCHRONOUS,
    Backend,
    CrashCounter,
    ModelClient,
    StepClock,
    apply_sqlite_durability,
    fake_model,
)

NAME = "dbos"


@event.listens_for(sa.engine.Engine, "connect")
def _sqlite_durability(dbapi_conn: Any, _rec: Any) -> None:
    if (
        "sqlite" in type(dbapi_conn).__module__.lower()
        or "sqlite" in type(dbapi_conn).__name__.lower()
    ):
        apply_sqlite_durability(dbapi_conn)


def info() -> dict[str, Any]:
    return {
        "version": version("dbos"),
        "sqlalchemy": version("sqlalchemy"),
        "sqlite_durability": f"WAL, synchronous={SQLITE_SYNCHRONOUS} (forced by a connect hook)",
        "postgres_durability": "synchronous_commit=on (server default)",
        "api": "sync workflows/steps; async for concurrency",
    }


# --------------------------------------------------------------------------- workflows

_clock = StepClock()
_counter: CrashCounter | None = None
_client: ModelClient | None = None


@DBOS.step()
def model_step(i: int) -> str:
    _clock.tick()
    return fake_model(i)


@DBOS.workflow()
def sequential_wf(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += len(model_step(i))
    return total


@DBOS.step()
def chat_step(i: int, history: list[str]) -> str:
    _clock.tick()
    return fake_model(i, history)


@DBOS.workflow()
def conversation_wf(steps: int) -> int:
    history: list[str] = []
    for i in range(steps):
        history.append(chat_step(i, history))
    return len(history)


@DBOS.step()
async def http_step(i: int, prompt: str) -> str:
    assert _client is not None
    return await _client.complete(prompt)


@DBOS.workflow()
async def http_wf(run: int, steps: int) -> int:
    n = 0
    for i in range(steps):
        n += len(await http_step(i, f"run {run} step {i}"))
    return n


@DBOS.step()
def recovery_step(i: int) -> str:
    assert _counter is not None
    _counter.hit(i)
    return fake_model(i)


@DBOS.workflow()
def recovery_wf(steps: int) -> int:
    total = 0
    for i in range(steps):
        total += len(recovery_step(i))
    return total


# --------------------------------------------------------------------------- scenarios


def _launch(backend: Backend, **extra: Any) -> None:
    config: DBOSConfig = {
        "name": "toren-bench",
        "system_database_url": backend.sqlalchemy_url,
        "log_level": "WARNING",
        **extra,  # type: ignore[typeddict-item]
    }
    DBOS(config=config)
    DBOS.launch()


def _run_one(backend: Backend, wf: Any, steps: int) -> dict[str, Any]:
    global _clock
    _launch(backend)
    try:
        size0 = backend.size_bytes()
        _clock = StepClock()
        t0 = time.perf_counter()
        with SetWorkflowID(f"bench-{wf.__name__}"):
            wf(steps)
        dt = time.perf_counter() - t0
        size1 = backend.size_bytes()
    finally:
        DBOS.destroy()
    out = {
        "steps": steps,
        "seconds": round(dt, 3),
        "steps_per_s": round(steps / dt, 1),
        "bytes_per_step": round((size1 - size0) / steps),
        "db_bytes_growth": size1 - size0,
    }
    out.update(_clock.rates())
    return out


def sequential(backend: Backend, steps: int) -> dict[str, Any]:
    return _run_one(backend, sequential_wf, steps)


def conversation(backend: Backend, steps: int) -> dict[str, Any]:
    return _run_one(backend, conversation_wf, steps)


def concurrency(backend: Backend, runs: int, steps: int, model_url: str) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        global _client
        _client = ModelClient(model_url)
        _launch(backend)
        try:
            t0 = time.perf_counter()
            handles = await asyncio.gather(
                *(DBOS.start_workflow_async(http_wf, r, steps) for r in range(runs))
            )
            t_started = time.perf_counter() - t0
            results = await asyncio.gather(*(h.get_result() for h in handles))
            dt = time.perf_counter() - t0
        finally:
            DBOS.destroy()
            await _client.aclose()
        assert len(results) == runs
        total = runs * steps
        return {
            "runs": runs,
            "steps_per_run": steps,
            "total_steps": total,
            "seconds": round(dt, 3),
            "all_started_s": round(t_started, 3),
            "steps_per_s": round(total / dt, 1),
        }

    return asyncio.run(main())


def recovery_child(backend: Backend, steps: int, counter_path: str, hang_at: int) -> None:
    global _counter
    _counter = CrashCounter(counter_path, hang_at)
    _launch(backend)  # launch() recovers this executor's PENDING workflows in the background
    if hang_at:
        with SetWorkflowID("bench-recovery"):
            recovery_wf(steps)
    else:
        # poll every 10 ms, not the 1 s default, so polling granularity is not counted
        DBOS.retrieve_workflow("bench-recovery").get_result(polling_interval_sec=0.01)
    # No DBOS.destroy(): the run is complete and durable; the worker exits at once with
    # os._exit, so shutdown cost is not counted (the same for every system).
