"""A built-in-loop agent on the OpenAI Responses API (``openai-responses:``), through the
real ``openai`` SDK against the loopback server's ``/v1/responses`` (issue 36 item 3):

* its token deltas reach an SSE client of the HTTP API, and tokens and cost are recorded;
* a stream that breaks after it began is not sent again (not paid twice);
* a worker killed with SIGKILL while a Responses stream is in flight resumes with no
  recorded call sent again and no tool executed twice.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.agents.test_example_openai_and_crash import (
    SCRIPTED_LINE,
    copy_example,
    emails,
    run_example,
)
from tests.providers.fakes import (
    FAKE_KEY,
    Break,
    Completion,
    FakeToolCall,
    Reply,
    serve_fake_models,
)
from toren.api import create_app, running_server
from toren.client import AsyncTorenClient, Delta, Event
from toren.runtime import close_runtime, open_runtime

TOKEN = "tok-responses-0123456789"


def toren_worker(agents: Path, db_url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A `toren worker` process; its stderr goes to agents/../worker.err (quoted by the
    assertions, so a worker that exits early says why)."""
    with (agents.parent / "worker.err").open("ab") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from toren.cli.main import main; main()",
                "worker",
                "--agents",
                str(agents),
                "--worker-id",
                "crash-test-worker",
                "--log-level",
                "warning",
            ],
            env={**env, "TOREN_DATABASE_URL": db_url},
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def worker_err(agents: Path) -> str:
    path = agents.parent / "worker.err"
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


EMAIL = {"to": "c@example.com", "subject": "A-17", "body": "shipped"}
ANSWER = "Your order A-17 has shipped."


def on_responses(tmp_path: Path) -> Path:
    """The example agent switched to the Responses API by its model line (and its
    ``max_tokens`` renamed as the Responses API names it)."""
    agent = copy_example(tmp_path)
    text = (agent / "agent.yaml").read_text()
    text = text.replace(SCRIPTED_LINE, "model: openai-responses:gpt-4o-mini\n")
    (agent / "agent.yaml").write_text(text.replace("max_tokens:", "max_output_tokens:"))
    return agent


def replies(**last: Any) -> list[Completion]:
    return [
        Completion(tool_calls=(FakeToolCall("c1", "lookup_order", {"order_id": "A-17"}),)),
        Completion(tool_calls=(FakeToolCall("c2", "send_email", EMAIL),)),
        Completion(text=ANSWER, **last),
    ]


async def test_a_builtin_loop_agent_streams_its_responses_deltas_to_sse(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_responses(tmp_path)
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(outbox))
    subscribed = threading.Event()
    pending = replies(chunk_size=3)

    def answer(body: dict[str, Any]) -> Reply:
        # The first request waits until the SSE client is reading, so no delta is
        # published before anyone listens (the server's own thread waits, not the test).
        assert subscribed.wait(30)
        return pending.pop(0)

    hub = toren.LiveHub()
    with serve_fake_models() as fake:
        fake.responses.responder = answer
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        runtime = await open_runtime(
            tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05), live=hub
        )
        try:
            async with toren.LocalWorkerRuntime(runtime.deps) as worker:
                app = create_app(
                    runtime.store, runtime.resolver, tokens=[TOKEN], live=hub, runtime=worker
                )
                async with (
                    running_server(app) as server,
                    AsyncTorenClient(server.url, TOKEN, stream_timeout=20) as client,
                ):
                    run = await client.start_run("support-agent", "Where is A-17?")
                    items: list[Event | Delta] = []
                    async for item in client.stream(run.id, deltas=True):
                        subscribed.set()
                        items.append(item)
            final = await runtime.store.get_run(run.id)
        finally:
            await close_runtime(runtime)
        bodies = [r.body for r in fake.responses.requests]

    assert final is not None and final.status == "completed", final
    assert final.output["answer"] == ANSWER
    assert fake.openai.served == 0 and len(bodies) == 3  # all on /v1/responses
    assert all(b["stream"] is True and b["max_output_tokens"] == 800 for b in bodies)
    assert [i["type"] for i in bodies[2]["input"][-2:]] == ["function_call", "function_call_output"]
    assert len(emails(outbox)) == 1
    # Tokens and cost as the Responses usage reported them, priced as openai:gpt-4o-mini.
    assert (final.input_tokens, final.output_tokens) == (3 * 11, 3 * 7)
    assert final.cost_usd > 0
    events = [i for i in items if isinstance(i, Event)]
    last_call = [e for e in events if e.type == "ModelCallRecorded"][-1]
    deltas = [i for i in items if isinstance(i, Delta) and i.position == last_call.position]
    assert "".join(d.text for d in deltas) == ANSWER
    assert len(deltas) > 1  # streamed in pieces, as the server sent them
    assert last_call.payload["response"]["text"] == ANSWER


async def test_a_responses_stream_broken_after_it_began_is_not_sent_again(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_responses(tmp_path)
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(tmp_path / "outbox.jsonl"))
    with serve_fake_models() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        fake.responses.script(Completion(text="abcdefgh", broken=Break(after=5, how="reset")))
        final, events = await run_example(db_url, tmp_path, "Where is A-17?")
        served = fake.responses.served

    assert final.status == "failed"
    assert "broke off after it had begun" in final.error["message"]
    assert served == 1  # begun, so billed: never sent a second time
    assert [e.type for e in events].count("ModelCallRecorded") == 1


async def test_sigkill_mid_responses_stream_pays_no_recorded_call_twice(
    db_url: str, tmp_path: Path
) -> None:
    on_responses(tmp_path)
    outbox = tmp_path / "outbox.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOREN_")}
    env.update(SUPPORT_AGENT_OUTBOX=str(outbox))
    runtime = await open_runtime(tmp_path / "agents", db_url, toren.Settings())
    with serve_fake_models() as fake:
        env.update(OPENAI_BASE_URL=fake.openai_url, OPENAI_API_KEY=FAKE_KEY)
        # The final answer streams slowly: the kill lands while it is in flight.
        fake.responses.script(*replies(pace=5.0))
        try:
            run = await toren.start_run(
                runtime.store, runtime.resolver, "support-agent", "Where is A-17?"
            )
            worker = toren_worker(tmp_path / "agents", db_url, env)
            try:
                deadline = time.monotonic() + 60
                while fake.responses.served < 3:  # the third call is in flight
                    assert time.monotonic() < deadline, worker_err(tmp_path / "agents")
                    assert worker.poll() is None, worker_err(tmp_path / "agents")
                    await asyncio.sleep(0.02)
                worker.send_signal(signal.SIGKILL)
                worker.wait()
                fake.responses.script(Completion(text=ANSWER))
                worker = toren_worker(tmp_path / "agents", db_url, env)
                final = await toren.wait_for_run(runtime.store, run.id, timeout=60)
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
            events = await runtime.store.load_events(run.id)
        finally:
            await close_runtime(runtime)
        bodies = [r.body for r in fake.responses.requests]

    assert final.status == "completed", final.error
    assert final.output["answer"] == ANSWER
    assert len(emails(outbox)) == 1  # the side effect happened exactly once
    # Four requests: the two recorded calls once each, the killed one (never recorded,
    # never finished) once more, and nothing else.
    assert len(bodies) == 4
    assert bodies[2] == bodies[3]
    assert bodies[0] != bodies[1] != bodies[2]
    assert [e.type for e in events].count("ModelCallRecorded") == 3
    assert [e.type for e in events].count("ToolCallRecorded") == 2
