"""SIGKILL mid-run: a `toren worker` process running a 10-step pydantic-ai agent (five
model calls, each asking for a side-effecting tool, then the final answer) is killed at
random (seeded) points while a model call is in flight, and restarted each time. The run
completes with the uninterrupted run's output; the server's ledger shows no recorded
model call requested again (only the call in flight at a kill is sent again), and the
side-effecting tool ran exactly once per call."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.integrations.pyai_agent import OUTPUT_TOOL, outbox_lines, write_agent
from tests.providers.fakes import Completion, FakeToolCall, serve_fake_models
from toren.runtime import close_runtime, open_runtime

pytest.importorskip("pydantic_ai")

EMAILS = 5  # five model calls asking for send_email, five tool steps: 10 steps, then the answer
KILLS = 3
DELAY = 0.4  # each model call's latency: the window the kills land in


def answer(body: dict[str, Any]) -> Completion:
    """The model: the n-th call asks for email n, the last one gives the ticket."""
    n = step_of(body)
    if n < EMAILS:
        args = {"to": f"user{n}@example.com", "body": f"update {n}"}
        return Completion(tool_calls=(FakeToolCall(f"c{n}", "send_email", args),), delay=DELAY)
    ticket = {"order": "A-17", "status": "shipped", "notes": [f"{EMAILS} emails"]}
    return Completion(tool_calls=(FakeToolCall("fin", OUTPUT_TOOL, ticket),), delay=DELAY)


def step_of(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m.get("role") == "tool")


def worker(agents: Path, db_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOREN_")}
    env["TOREN_DATABASE_URL"] = db_url
    with log.open("ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from toren.cli.main import main; main()",
                "worker",
                "--agents",
                str(agents),
                "--worker-id",
                "pyai-crash-worker",  # the same id: a restart takes the lease back at once
                "--log-level",
                "warning",
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


async def until(predicate: Any, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert proc.poll() is None, f"worker exited early: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the worker made no progress"
        await asyncio.sleep(0.01)


@pytest.mark.slow
async def test_sigkill_mid_run_pays_no_call_twice_and_runs_no_tool_twice(
    db_url: str, tmp_path: Path
) -> None:
    rng = random.Random(20261204)
    outbox, log = tmp_path / "outbox.jsonl", tmp_path / "worker.log"
    agents = tmp_path / "agents"
    with serve_fake_models() as fake:
        fake.openai.responder = answer
        write_agent(agents, "openai", fake.openai_url, outbox)
        runtime = await open_runtime(agents, db_url)
        try:
            run = await toren.start_run(runtime.store, runtime.resolver, "support", "Go")
            targets = sorted(rng.sample(range(1, EMAILS + 1), KILLS))
            for target in targets:
                proc = worker(agents, db_url, log)
                # Model call number `target` has reached the server: kill inside its latency.
                await until(lambda t=target: fake.openai.served >= t, proc, log)
                await asyncio.sleep(rng.uniform(0, DELAY * 0.75))
                proc.send_signal(signal.SIGKILL)
                proc.wait()
            proc = worker(agents, db_url, log)
            try:
                final = await toren.wait_for_run(runtime.store, run.id, timeout=90)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            assert final.status == "completed", final.error
            assert final.output == {
                "order": "A-17",
                "status": "shipped",
                "notes": [f"{EMAILS} emails"],
            }
            assert final.lease_recoveries >= 1

            # Paid: each model call's request, counted by the server per step.
            served = Counter(step_of(r.body) for r in fake.openai.requests)
            assert set(served) == set(range(EMAILS + 1))
            repeats = sum(n - 1 for n in served.values())
            assert repeats <= KILLS, served  # only calls in flight at a kill, never a recorded one
            events = await runtime.store.load_events(run.id)
            models = sorted(e.position for e in events if e.type == "ModelCallRecorded")
            tools = sorted(e.position for e in events if e.type == "ToolCallRecorded")
            assert models == list(range(0, 2 * EMAILS + 1, 2))
            assert tools == list(range(1, 2 * EMAILS, 2))
            # Executed: the side effect happened once per call, never twice.
            sent = Counter(line["to"] for line in outbox_lines(outbox))
            assert sent == Counter({f"user{n}@example.com": 1 for n in range(EMAILS)})
        finally:
            await close_runtime(runtime)
