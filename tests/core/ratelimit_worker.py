"""A worker process for the rate-limit fleet tests and bench: serves the `ask` agent (one
model call to ``openai:gpt-4o-mini``, max_tokens 5) against a loopback OpenAI server,
with the fleet's rate limits given as JSON (``{}``: none), until SIGTERM.

    python -m tests.core.ratelimit_worker DB_URL OPENAI_URL LIMITS_JSON CONCURRENCY
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import toren
from tests.providers.fakes import FAKE_KEY
from toren.config import LeaseSettings, rate_limits
from toren.providers.openai import OpenAIProvider

MODEL = "openai:gpt-4o-mini"
ROOT = Path(__file__).resolve().parents[2]


def spawn(
    url: str, openai_url: str, limits: dict[str, Any], concurrency: int
) -> subprocess.Popen[str]:
    """Start this worker in a process of its own; returns once it is ready."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.core.ratelimit_worker",
            url,
            openai_url,
            json.dumps(limits),
            str(concurrency),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'src'}"},
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


async def ask(ctx: toren.Context, input: Any) -> Any:
    reply = await ctx.model(
        MODEL, [{"role": "user", "content": f"question {input['i']}"}], max_tokens=5
    )
    return reply.text


def registry() -> toren.Registry:
    reg = toren.Registry()
    reg.add("ask", ask)
    return reg


async def main(url: str, openai_url: str, limits: str, concurrency: int) -> None:
    settings = toren.Settings(
        lease=LeaseSettings(ttl=5.0, heartbeat=0.5),
        poll_interval=0.05,
        rate_limits=rate_limits(json.loads(limits), "argv"),
    )
    store = await toren.connect(url)
    provider = OpenAIProvider(api_key=FAKE_KEY, base_url=openai_url)
    deps = toren.TickDeps(
        store=store, agents=registry(), settings=settings, providers={"openai": provider}
    )
    worker = toren.LocalWorkerRuntime(deps, concurrency=concurrency)
    await worker.start()
    worker.install_signal_handlers()
    print("ready", flush=True)
    await worker.wait_stopped()
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
