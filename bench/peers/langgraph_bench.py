"""LangGraph (PyPI ``langgraph``) with its SQLite and Postgres checkpointers on the bench
scenarios.

Idiomatic LangGraph: a ``StateGraph`` whose one node calls the model and loops back to
itself until the step count is reached, so every model call is one super-step with one
checkpoint. All invocations use ``durability="sync"`` (the checkpoint of step i is
committed before step i+1 starts — the same guarantee as DBOS and Toren; LangGraph's
default, ``"async"``, writes it concurrently with the next step).

SqliteSaver/AsyncSqliteSaver set journal_mode=WAL themselves; the bench adds
synchronous=FULL (also the sqlite3 default) explicitly. Postgres: PostgresSaver /
AsyncPostgresSaver on autocommit connections (server default synchronous_commit=on).
"""

from __future__ import annotations

import asyncio
import operator
import sqlite3
import time
from importlib.metadata import version
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph

from bench.common import (
    SQLITE_SYNCHRONOUS,
    Backend,
    CrashCounter,
    ModelClient,
    StepClock,
    apply_sqlite_durability,
    fake_model,
)

NAME = "langgraph"
DURABILITY = "sync"


def info() -> dict[str, Any]:
    return {
        "version": version("langgraph"),
        "langgraph-checkpoint": version("langgraph-checkpoint"),
        "langgraph-checkpoint-sqlite": version("langgraph-checkpoint-sqlite"),
        "langgraph-checkpoint-postgres": version("langgraph-checkpoint-postgres"),
        "durability": DURABILITY,
        "sqlite_durability": f"WAL, synchronous={SQLITE_SYNCHRONOUS}",
        "postgres_durability": "synchronous_commit=on (server default)",
    }


# --------------------------------------------------------------------------- graphs

_clock = StepClock()
_counter: CrashCounter | None = None
_client: ModelClient | None = None


class SeqState(TypedDict):
    i: int
    steps: int
    last: str


class ChatState(TypedDict):
    i: int
    steps: int
    messages: Annotated[list[str], operator.add]


def _route(state: Any) -> str:
    return END if state["i"] >= state["steps"] else "model"


def seq_node(state: SeqState) -> dict[str, Any]:
    _clock.tick()
    i = state["i"]
    return {"i": i + 1, "last": fake_model(i)}


def chat_node(state: ChatState) -> dict[str, Any]:
    _clock.tick()
    i = state["i"]
    return {"i": i + 1, "messages": [fake_model(i, state["messages"])]}


def recovery_node(state: SeqState) -> dict[str, Any]:
    assert _counter is not None
    i = state["i"]
    _counter.hit(i)
    return {"i": i + 1, "last": fake_model(i)}


async def http_node(state: SeqState) -> dict[str, Any]:
    assert _client is not None
    i = state["i"]
    return {"i": i + 1, "last": await _client.complete(f"{state['last'][:32]} step {i}")}


def _graph(state_type: Any, node: Any, checkpointer: Any) -> Any:
    g = StateGraph(state_type)
    g.add_node("model", node)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", _route, ["model", END])
    return g.compile(checkpointer=checkpointer)


def _config(thread: str, steps: int) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}, "recursion_limit": steps + 50}


class _SyncSaver:
    """A sync checkpointer for the backend, set up, as a context manager."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def __enter__(self) -> Any:
        if self.backend.kind == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            self.conn: Any = sqlite3.connect(self.backend.sqlite_path, check_same_thread=False)
            apply_sqlite_durability(self.conn)
            saver = SqliteSaver(self.conn)
        else:
            from langgraph.checkpoint.postgres import PostgresSaver
            from psycopg import Connection
            from psycopg.rows import dict_row

            self.conn = Connection.connect(
                self.backend.pg_dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
            saver = PostgresSaver(self.conn)
        saver.setup()
        return saver

    def __exit__(self, *exc: Any) -> None:
        self.conn.close()


# --------------------------------------------------------------------------- scenarios


def _run_one(
    backend: Backend, state_type: Any, node: Any, init: dict[str, Any], steps: int
) -> dict[str, Any]:
    global _clock
    with _SyncSaver(backend) as saver:
        graph = _graph(state_type, node, saver)
        size0 = backend.size_bytes()
        _clock = StepClock()
        t0 = time.perf_counter()
        out = graph.invoke(init, _config("bench", steps), durability=DURABILITY)
        dt = time.perf_counter() - t0
        size1 = backend.size_bytes()
    assert out["i"] == steps
    res = {
        "steps": steps,
        "seconds": round(dt, 3),
        "steps_per_s": round(steps / dt, 1),
        "bytes_per_step": round((size1 - size0) / steps),
        "db_bytes_growth": size1 - size0,
    }
    res.update(_clock.rates())
    return res


def sequential(backend: Backend, steps: int) -> dict[str, Any]:
    return _run_one(backend, SeqState, seq_node, {"i": 0, "steps": steps, "last": ""}, steps)


def conversation(backend: Backend, steps: int) -> dict[str, Any]:
    return _run_one(backend, ChatState, chat_node, {"i": 0, "steps": steps, "messages": []}, steps)


def concurrency(backend: Backend, runs: int, steps: int, model_url: str) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        global _client
        _client = ModelClient(model_url)
        if backend.kind == "sqlite":
            import aiosqlite
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            conn: Any = await aiosqlite.connect(backend.sqlite_path)
            await conn.execute("PRAGMA journal_mode=WAL")
            await conn.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
            saver: Any = AsyncSqliteSaver(conn)
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
            from psycopg.rows import dict_row
            from psycopg_pool import AsyncConnectionPool

            conn = AsyncConnectionPool(
                backend.pg_dsn,
                min_size=4,
                max_size=20,
                open=False,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
            )
            await conn.open()
            saver = AsyncPostgresSaver(conn)
        try:
            await saver.setup()
            graph = _graph(SeqState, http_node, saver)
            t0 = time.perf_counter()
            outs = await asyncio.gather(
                *(
                    graph.ainvoke(
                        {"i": 0, "steps": steps, "last": ""},
                        _config(f"run-{r}", steps),
                        durability=DURABILITY,
                    )
                    for r in range(runs)
                )
            )
            dt = time.perf_counter() - t0
        finally:
            await conn.close()
            await _client.aclose()
        assert all(o["i"] == steps for o in outs)
        total = runs * steps
        return {
            "runs": runs,
            "steps_per_run": steps,
            "total_steps": total,
            "seconds": round(dt, 3),
            "steps_per_s": round(total / dt, 1),
            "pg_pool_max": 20 if backend.kind == "postgres" else None,
        }

    return asyncio.run(main())


def recovery_child(backend: Backend, steps: int, counter_path: str, hang_at: int) -> None:
    global _counter
    _counter = CrashCounter(counter_path, hang_at)
    with _SyncSaver(backend) as saver:
        graph = _graph(SeqState, recovery_node, saver)
        cfg = _config("bench-recovery", steps)
        if hang_at:
            out = graph.invoke({"i": 0, "steps": steps, "last": ""}, cfg, durability=DURABILITY)
        else:
            out = graph.invoke(None, cfg, durability=DURABILITY)  # resume from the last checkpoint
        assert out["i"] == steps, out["i"]
