"""An OpenAI Agents SDK agent three ways: the SDK's plain ``Runner`` (no durability, the
floor), DBOS's integration (``dbos-openai-agents``: ``DBOSRunner`` in a
``@DBOS.workflow``), and Toren (``entry:`` naming the same ``Agent``, run by an
in-process worker). Steps per second, where a run is three steps: a model call asking
for a tool, the tool call, and the final model call.

All three run the same agent code (model ``gpt-4.1`` by name, the SDK's default
``OpenAIResponsesModel``) against the same loopback Responses server
(``tests/providers/fakes.py``, answers at once), with SQLite as the durable store of DBOS
and Toren, on one event loop, ``--runs`` runs at ``--concurrency`` at a time.

    python bench/openai_agents_bench.py [--runs 60] [--concurrency 10] [--only toren]

Needs ``toren-run[openai-agents]`` and, for the DBOS column, ``dbos-openai-agents``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tests.providers.fakes import FAKE_KEY, Completion, FakeToolCall, serve_fake_models

STEPS_PER_RUN = 3

AGENT_CODE = '''\
from agents import Agent, function_tool


@function_tool
def lookup_order(order_id: str) -> dict:
    """Look an order up."""
    return {"order": order_id, "status": "shipped"}


agent = Agent(
    name="bench",
    instructions="Look the order up, then answer in one sentence.",
    model="gpt-4.1",
    tools=[lookup_order],
)
'''


def answer(body: dict[str, Any]) -> Completion:
    done = any(item.get("type") == "function_call_output" for item in body.get("input", []))
    if done:
        return Completion(text="Your order A-17 has shipped.")
    return Completion(tool_calls=(FakeToolCall("c1", "lookup_order", {"order_id": "A-17"}),))


def load_agent(directory: Path) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile((directory / "app.py").read_text(), str(directory / "app.py"), "exec"), namespace)
    return namespace["agent"]


async def bounded(runs: int, concurrency: int, one: Callable[[int], Awaitable[Any]]) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def run(i: int) -> None:
        async with gate:
            await one(i)

    await asyncio.gather(*(run(i) for i in range(runs)))


async def plain(directory: Path, runs: int, concurrency: int) -> float:
    from agents import RunConfig, Runner

    agent = load_agent(directory)
    config = RunConfig(tracing_disabled=True)

    async def one(i: int) -> None:
        result = await Runner.run(agent, f"Where is A-17? ({i})", run_config=config)
        assert "shipped" in result.final_output

    started = time.perf_counter()
    await bounded(runs, concurrency, one)
    return time.perf_counter() - started


async def dbos(directory: Path, runs: int, concurrency: int) -> float:
    from dbos import DBOS
    from dbos_openai_agents import DBOSRunner

    from agents import RunConfig

    agent = load_agent(directory)
    config = RunConfig(tracing_disabled=True)

    @DBOS.workflow()
    async def run_agent(prompt: str) -> str:
        result = await DBOSRunner.run(agent, prompt, run_config=config)
        return str(result.final_output)

    DBOS(
        config={
            "name": "oa-bench",
            "system_database_url": f"sqlite:///{directory / 'dbos.sqlite'}",
            "run_admin_server": False,
        }
    )
    DBOS.launch()
    try:

        async def one(i: int) -> None:
            assert "shipped" in await run_agent(f"Where is A-17? ({i})")

        started = time.perf_counter()
        await bounded(runs, concurrency, one)
        return time.perf_counter() - started
    finally:
        DBOS.destroy()


async def toren_run(directory: Path, runs: int, concurrency: int) -> float:
    import toren
    from toren.runtime import close_runtime, open_runtime

    agents = directory / "agents" / "bench"
    agents.mkdir(parents=True)
    (agents / "app.py").write_text(AGENT_CODE)
    (agents / "agent.yaml").write_text("name: bench\nentry: app:agent\n")
    url = f"sqlite:///{directory / 'toren.db'}"
    runtime = await open_runtime(directory / "agents", url, toren.Settings(poll_interval=0.01))
    try:
        started = time.perf_counter()
        ids = [
            (
                await toren.start_run(
                    runtime.store, runtime.resolver, "bench", f"Where is A-17? ({i})"
                )
            ).id
            for i in range(runs)
        ]
        async with toren.LocalWorkerRuntime(runtime.deps, concurrency=concurrency):
            for run_id in ids:
                final = await toren.wait_for_run(runtime.store, run_id, timeout=600)
                assert final.status == "completed", final.error
        return time.perf_counter() - started
    finally:
        await close_runtime(runtime)


# DBOS last: DBOS.destroy() shuts down the event loop's default executor.
MODES: dict[str, Callable[[Path, int, int], Awaitable[float]]] = {
    "plain": plain,
    "toren": toren_run,
    "dbos": dbos,
}


def installed(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


async def run_all(args: argparse.Namespace, results: dict[str, Any]) -> None:
    # One event loop for every mode: the SDK's default OpenAI client is shared process-wide.
    with serve_fake_models() as fake:
        os.environ["OPENAI_BASE_URL"] = fake.openai_url
        os.environ["OPENAI_API_KEY"] = FAKE_KEY
        for name in args.only or list(MODES):
            if name == "dbos" and installed("dbos-openai-agents") is None:
                results[name] = "skipped: dbos-openai-agents is not installed"
                continue
            with tempfile.TemporaryDirectory(prefix=f"oa-bench-{name}-") as tmp:
                directory = Path(tmp)
                (directory / "app.py").write_text(AGENT_CODE)
                fake.responses.reset()
                fake.responses.responder = answer
                elapsed = await MODES[name](directory, args.runs, args.concurrency)
                served = fake.responses.served
            results[name] = {
                "seconds": round(elapsed, 3),
                "steps_per_s": round(args.runs * STEPS_PER_RUN / elapsed, 1),
                "model_requests": served,
            }
            print(name, json.dumps(results[name]), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--concurrency", type=int, default=10)
    ap.add_argument("--only", choices=sorted(MODES), action="append")
    args = ap.parse_args()
    results: dict[str, Any] = {
        "runs": args.runs,
        "concurrency": args.concurrency,
        "steps_per_run": STEPS_PER_RUN,
        "versions": {p: installed(p) for p in ("openai-agents", "dbos-openai-agents", "dbos")},
    }
    asyncio.run(run_all(args, results))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
