"""One pydantic-ai agent, durable on Toren and on DBOS (``pydantic_ai.durable_exec.dbos``),
both on SQLite (WAL, synchronous=FULL), in the same run: steps per second and CPU per step.

The agent (:func:`make_agent`) is the same object for both: pydantic-ai's ``FunctionModel``
(no network, no latency: what is measured is the engine's cost per step, not a model's)
asks for a tool ``TOOLS`` times, then answers. A run is ``2 * TOOLS + 1`` steps: every
model request and every tool call. On Toren the agent is the ``entry:`` of an agent
directory; on DBOS it carries the ``DBOSDurability`` capability (model requests are DBOS
steps) and its tool is a ``@DBOS.step`` (DBOS does not wrap tools itself), and each run is
a ``@DBOS.workflow`` calling ``agent.run``, as pydantic-ai's DBOS documentation shows.

Two scenarios per system, each in a fresh process on a fresh database:

- ``sequential``: ``RUNS`` runs one after another (the latency of a step);
- ``concurrent``: ``RUNS`` runs started together (throughput).

A third column runs the agent with no durability at all (``plain``): what pydantic-ai
itself costs per step, subtracted to give each engine's own CPU per step.

    python -m bench.pydantic_ai_dbos [--runs 20] [--json bench/pydantic-ai-results.json]

Needs ``pip install -e '.[bench]'`` (pydantic-ai-slim with its dbos extra).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

TOOLS = 10
RUNS = 20


def make_agent(tool_decorator: Any = None, capabilities: list[Any] | None = None) -> Any:
    """The bench agent: ``TOOLS`` tool calls, then a text answer."""
    from pydantic_ai import Agent, ModelMessage, ModelResponse, TextPart, ToolCallPart
    from pydantic_ai.messages import ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done < TOOLS:
            return ModelResponse(
                parts=[ToolCallPart(tool_name="record", args={"i": done}, tool_call_id=f"c{done}")]
            )
        return ModelResponse(parts=[TextPart(content=f"recorded {done}")])

    agent = Agent(
        FunctionModel(model),
        name="bench",
        instructions="Record ten numbers, then say so.",
        capabilities=capabilities or [],
    )

    async def record(i: int) -> int:
        """Record a number."""
        return i * 2

    fn = tool_decorator(record) if tool_decorator is not None else record
    agent.tool_plain(name="record")(fn)
    return agent


def _steps(runs: int) -> int:
    return runs * (2 * TOOLS + 1)


def _result(runs: int, wall: float, cpu: float) -> dict[str, Any]:
    steps = _steps(runs)
    return {
        "runs": runs,
        "steps": steps,
        "seconds": round(wall, 3),
        "steps_per_s": round(steps / wall, 1),
        "cpu_us_per_step": round(cpu / steps * 1e6, 1),
    }


# -- Toren --------------------------------------------------------------------------------

APP = "from bench.pydantic_ai_dbos import make_agent\n\nagent = make_agent()\n"


async def _toren(scenario: str, runs: int, tmp: Path) -> dict[str, Any]:
    import toren
    from toren.runtime import close_runtime, open_runtime

    agent_dir = tmp / "agents" / "bench"
    agent_dir.mkdir(parents=True)
    (agent_dir / "agent.yaml").write_text("name: bench\nentry: app:agent\n")
    (agent_dir / "app.py").write_text(APP)
    runtime = await open_runtime(tmp / "agents", f"sqlite:///{tmp}/toren.db")
    try:
        async with toren.LocalWorkerRuntime(runtime.deps, concurrency=runs):
            # A warm-up run: imports and the first load of the agent are not measured.
            warm = await toren.start_run(runtime.store, runtime.resolver, "bench", "go")
            await toren.wait_for_run(runtime.store, warm.id, timeout=60)
            wall0, cpu0 = time.perf_counter(), time.process_time()
            if scenario == "sequential":
                # The run's end from the live hub (the worker publishes its status), not by
                # polling the store: wait_for_run's backoff would add up to 0.1 s a run.
                ends = runtime.live.subscribe()
                for _ in range(runs):
                    run = await toren.start_run(runtime.store, runtime.resolver, "bench", "go")
                    while True:
                        item = await ends.get()
                        if item["run_id"] == run.id and item.get("type") == "status":
                            break
                    assert item["status"] == "completed", item
            else:
                started = [
                    await toren.start_run(runtime.store, runtime.resolver, "bench", "go")
                    for _ in range(runs)
                ]
                for run in started:
                    final = await toren.wait_for_run(runtime.store, run.id, timeout=120)
                    assert final.status == "completed", final.error
            wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        recorded = 0
        for run in await runtime.store.list_runs(limit=runs + 1):
            events = await runtime.store.load_events(run.id)
            recorded += sum(e.type in ("ModelCallRecorded", "ToolCallRecorded") for e in events)
        assert recorded == _steps(runs + 1), recorded  # every step was a recorded step
    finally:
        await close_runtime(runtime)
    return _result(runs, wall, cpu)


# -- DBOS ---------------------------------------------------------------------------------


def _dbos(scenario: str, runs: int, tmp: Path) -> dict[str, Any]:
    import sqlalchemy as sa
    from dbos import DBOS, DBOSConfig
    from pydantic_ai.durable_exec.dbos import DBOSDurability
    from sqlalchemy import event

    from bench.common import apply_sqlite_durability

    @event.listens_for(sa.engine.Engine, "connect")
    def _wal_full(dbapi_conn: Any, _rec: Any) -> None:
        apply_sqlite_durability(dbapi_conn)

    config: DBOSConfig = {
        "name": "toren-bench-pydantic-ai",
        "system_database_url": f"sqlite:///{tmp}/dbos.sqlite",
        "log_level": "WARNING",
    }
    DBOS(config=config)
    agent = make_agent(tool_decorator=DBOS.step(), capabilities=[DBOSDurability()])

    @DBOS.workflow()
    async def answer(prompt: str) -> str:
        result = await agent.run(prompt)
        return str(result.output)

    DBOS.launch()

    async def main() -> tuple[float, float]:
        await answer("go")  # warm-up
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if scenario == "sequential":
            for _ in range(runs):
                assert (await answer("go")) == f"recorded {TOOLS}"
        else:
            handles = [await DBOS.start_workflow_async(answer, "go") for _ in range(runs)]
            for handle in handles:
                assert (await handle.get_result()) == f"recorded {TOOLS}"
        return time.perf_counter() - wall0, time.process_time() - cpu0

    try:
        wall, cpu = asyncio.run(main())
        steps = sum(len(DBOS.list_workflow_steps(w.workflow_id)) for w in DBOS.list_workflows())
        # Each run: its model requests and tool calls as steps (plus DBOS's own bookkeeping
        # steps, if any, counted here too and reported).
        out = _result(runs, wall, cpu)
        out["dbos_steps_recorded"] = steps
        return out
    finally:
        DBOS.destroy()


# -- pydantic-ai alone ---------------------------------------------------------------------


def _plain(scenario: str, runs: int) -> dict[str, Any]:
    """The same agent with no durability: what pydantic-ai itself costs per step, to
    subtract from both engines' figures."""
    agent = make_agent()

    async def main() -> tuple[float, float]:
        await agent.run("go")  # warm-up
        wall0, cpu0 = time.perf_counter(), time.process_time()
        if scenario == "sequential":
            for _ in range(runs):
                assert (await agent.run("go")).output == f"recorded {TOOLS}"
        else:
            results = await asyncio.gather(*(agent.run("go") for _ in range(runs)))
            assert all(r.output == f"recorded {TOOLS}" for r in results)
        return time.perf_counter() - wall0, time.process_time() - cpu0

    wall, cpu = asyncio.run(main())
    return _result(runs, wall, cpu)


# -- driver -------------------------------------------------------------------------------


def child(system: str, scenario: str, runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix=f"pyai-bench-{system}-") as tmp:
        if system == "toren":
            result = asyncio.run(_toren(scenario, runs, Path(tmp)))
        elif system == "plain":
            result = _plain(scenario, runs)
        else:
            result = _dbos(scenario, runs, Path(tmp))
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--child", nargs=2, metavar=("SYSTEM", "SCENARIO"))
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], args.runs)
        return
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "versions": {
            "pydantic-ai-slim": version("pydantic-ai-slim"),
            "dbos": version("dbos"),
            "toren-run": version("toren-run"),
        },
        "steps_per_run": 2 * TOOLS + 1,
        "results": {},
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOREN_")}
    for scenario in ("sequential", "concurrent"):
        for system in ("plain", "toren", "dbos"):
            out = subprocess.run(
                [sys.executable, "-m", "bench.pydantic_ai_dbos", "--runs", str(args.runs)]
                + ["--child", system, scenario],
                capture_output=True,
                text=True,
                check=True,
                env=env,
            )
            row = json.loads(out.stdout.strip().splitlines()[-1])
            results["results"][f"{system}/{scenario}"] = row
            print(f"{system:6} {scenario:11} {json.dumps(row)}", flush=True)
        toren_rate = results["results"][f"toren/{scenario}"]["steps_per_s"]
        dbos_rate = results["results"][f"dbos/{scenario}"]["steps_per_s"]
        results["results"][f"ratio/{scenario}"] = round(toren_rate / dbos_rate, 2)
        plain = results["results"][f"plain/{scenario}"]["cpu_us_per_step"]
        over = {
            system: round(results["results"][f"{system}/{scenario}"]["cpu_us_per_step"] - plain, 1)
            for system in ("toren", "dbos")
        }
        results["results"][f"engine_cpu_us_per_step/{scenario}"] = over
        print(
            f"toren/dbos {scenario}: {toren_rate / dbos_rate:.2f}x steps/s; engine CPU per "
            f"step over pydantic-ai alone: toren {over['toren']} us, dbos {over['dbos']} us",
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
