"""Retry and fork as a user meets them, on both backends, against a loopback server that
speaks the OpenAI wire format (through the real ``openai`` SDK), counting every request:

* a tool that raises fails the run after 3 paid model calls; tools.py is fixed on disk;
  ``toren runs retry`` (and ``POST /v1/runs/{id}/retry`` through the Python client)
  completes the run with 0 new requests and no email sent twice;
* ``toren runs fork --at main:2`` of a completed 6-call run, with an edited prompt: the
  loopback server sees exactly the requests from position 2 on, and the source run's
  log is byte-identical before and after.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import toren
from tests.cli.conftest import invoke
from tests.providers.fakes import FAKE_KEY, Completion, FakeModelServer, serve_fake_models
from toren.api import create_app
from toren.api.server import running_server
from toren.client import AsyncTorenClient, TorenAPIError
from toren.runtime import close_runtime, open_runtime
from toren.store.sql import EVENT_COLUMNS

DESK_AGENT = '''\
"""Three model calls, an email after each of the first two, then a report."""
import json

MODEL = "openai:gpt-4o-mini"


async def main(ctx, input):
    messages = [{"role": "system", "content": "You run the desk."},
                {"role": "user", "content": str(input)}]
    reply = None
    for i in range(3):
        reply = await ctx.model(MODEL, messages)
        messages.append(reply.message())
        if i < 2:
            sent = await ctx.tool("send_email", {"to": "c@example.com", "body": reply.text})
            messages.append({"role": "user", "content": json.dumps(sent)})
    report = await ctx.tool("file_report", {"text": reply.text})
    return {"answer": reply.text, "report": report}
'''

TOOLS = '''\
import json
import os


def send_email(to: str, body: str) -> dict:
    """Send an email (appends to $DESK_OUTBOX)."""
    with open(os.environ["DESK_OUTBOX"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"to": to, "body": body}) + "\\n")
    return {"status": "sent"}


def file_report(text: str) -> dict:
    """File the report."""
    queues = {}
    return {"filed": True, "queue": QUEUE}
'''
BROKEN = '    return {"filed": True, "queue": QUEUE}\n'
FIXED = '    return {"filed": True, "queue": "reports"}\n'

SIX_AGENT = """\
from pathlib import Path

PROMPT = (Path(__file__).parent / "prompts" / "system.md").read_text(encoding="utf-8")


async def main(ctx, input):
    messages = [{"role": "system", "content": PROMPT.strip()}]
    for i in range(6):
        messages.append({"role": "user", "content": f"{input} #{i}"})
        reply = await ctx.model("openai:gpt-4o-mini", messages)
        messages.append(reply.message())
    return {"answer": reply.text}
"""


def raw_log(db_url: str, run_id: str) -> list[tuple[Any, ...]]:
    """A run's log rows exactly as stored (payload text included), and its run row."""

    async def read() -> list[tuple[Any, ...]]:
        store = await toren.connect(db_url)
        try:
            sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = ? ORDER BY seq"
            rows = await store._event_rows(sql, (run_id,))  # type: ignore[attr-defined]
            run = await store.get_run(run_id)
            return [tuple(r) for r in rows] + [(run,)]
        finally:
            await store.close()

    return asyncio.run(read())


def write_agents(root: Path) -> Path:
    desk = root / "desk"
    desk.mkdir(parents=True)
    (desk / "agent.yaml").write_text("name: desk\nmodel: openai:gpt-4o-mini\nentry: agent:main\n")
    (desk / "agent.py").write_text(DESK_AGENT)
    (desk / "tools.py").write_text(TOOLS.replace("    queues = {}\n", ""))
    six = root / "six"
    (six / "prompts").mkdir(parents=True)
    (six / "agent.yaml").write_text("name: six\nmodel: openai:gpt-4o-mini\nentry: agent:main\n")
    (six / "agent.py").write_text(SIX_AGENT)
    (six / "prompts" / "system.md").write_text("Answer briefly.\n")
    return root


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeModelServer]:
    for var in ("TOREN_DATABASE_URL", "TOREN_API_URL", "TOREN_API_TOKEN", "TOREN_AGENTS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("DESK_OUTBOX", str(tmp_path / "outbox.jsonl"))
    with serve_fake_models() as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        yield server


def outbox(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "outbox.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def fix_tools(root: Path) -> None:
    tools = root / "desk" / "tools.py"
    tools.write_text(tools.read_text().replace(BROKEN, FIXED))


def three_replies(fake: FakeModelServer) -> None:
    fake.openai.script(*(Completion(text=f"reply {i}") for i in range(3)))


def test_cli_retry_after_fixing_a_tool_pays_nothing_again(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    root = write_agents(tmp_path / "agents")
    runner = CliRunner()
    where = ("--agents", str(root), "--database-url", db_url)
    three_replies(fake)
    started = invoke(runner, "run", "desk", "open the desk", *where)
    assert started.exit_code == 1, started.output  # failed
    assert "name 'QUEUE' is not defined" in started.output and "tools.py:" in started.output
    assert "in file_report; the traceback: toren runs show" in started.output
    assert "toren runs retry run_" in started.output  # the hint
    assert fake.openai.served == 3 and len(outbox(tmp_path)) == 2
    listed = invoke(runner, "runs", "list", "--json", *where)
    run_id = json.loads(listed.stdout)[0]["id"]
    shown = invoke(runner, "runs", "show", run_id, *where)
    assert "NameError" in shown.output and "traceback" in shown.output
    assert "in file_report" in shown.output and f"toren runs retry {run_id}" in shown.output

    fix_tools(root)
    retried = invoke(runner, "runs", "retry", run_id, *where)
    assert retried.exit_code == 0, retried.output
    assert "↻ retry 1" in retried.output and "completed" in retried.output
    assert fake.openai.served == 3  # 0 new requests for the three recorded calls
    assert [m["body"] for m in outbox(tmp_path)] == ["reply 0", "reply 1"]  # not re-sent
    final = json.loads(invoke(runner, "runs", "show", run_id, "--json", *where).stdout)
    assert final["status"] == "completed" and final["retries"] == 1
    assert final["output"]["report"] == {"filed": True, "queue": "reports"}
    again = invoke(runner, "runs", "retry", run_id, *where)
    assert again.exit_code == 5 and "nothing to retry" in again.output


async def test_http_retry_through_the_client(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    root = write_agents(tmp_path / "agents")
    runtime = await open_runtime(root, db_url, toren.Settings(poll_interval=0.05))
    try:
        worker = toren.LocalWorkerRuntime(runtime.deps)
        app = create_app(runtime.store, runtime.resolver, runtime=worker, tokens=["t" * 32])
        async with (
            worker,
            running_server(app) as server,
            AsyncTorenClient(server.url, "t" * 32) as client,
        ):
            three_replies(fake)
            run = await client.start_run("desk", "open the desk")
            failed = await client.wait(run.id, timeout=30)
            assert failed.status == "failed" and fake.openai.served == 3
            assert failed.error is not None and "in file_report" in failed.error["traceback"]
            with pytest.raises(TorenAPIError) as refused:
                await client.fork(run.id, at="main:99")
            assert refused.value.status == 409 and refused.value.code == "fork_point_not_found"
            fix_tools(root)
            queued = await client.retry(run.id)
            assert queued.status == "queued" and queued.retries == 1
            done = await client.wait(run.id, timeout=30)
            assert done.status == "completed", done.error
            assert fake.openai.served == 3 and len(outbox(tmp_path)) == 2
            with pytest.raises(TorenAPIError) as again:
                await client.retry(run.id)
            assert again.value.status == 409 and again.value.code == "run_not_retryable"
            types = [e.type for e in (await client.events(run.id, limit=100)).events]
            assert types[-3:] == ["RunRetried", "ToolCallRecorded", "RunCompleted"]
    finally:
        await close_runtime(runtime)


def test_cli_fork_with_an_edited_prompt_sees_exactly_the_requests_from_the_fork(
    db_url: str, tmp_path: Path, fake: FakeModelServer
) -> None:
    root = write_agents(tmp_path / "agents")
    runner = CliRunner()
    where = ("--agents", str(root), "--database-url", db_url)
    fake.openai.script(*(Completion(text=f"answer {i}") for i in range(6)))
    assert invoke(runner, "run", "six", "q", *where).exit_code == 0
    assert fake.openai.served == 6
    source = json.loads(invoke(runner, "runs", "list", "--json", *where).stdout)[0]["id"]
    before = invoke(runner, "runs", "events", source, "--json", *where).stdout
    shown_before = json.loads(invoke(runner, "runs", "show", source, "--json", *where).stdout)
    stored_before = raw_log(db_url, source)

    (root / "six" / "prompts" / "system.md").write_text("Answer in great detail.\n")
    fake.openai.reset()
    fake.openai.script(*(Completion(text=f"detailed {i}") for i in range(4)))
    forked = invoke(runner, "runs", "fork", source, "--at", "main:2", *where)
    assert forked.exit_code == 0, forked.output
    assert "⑂ forked" in forked.output
    bodies = [r.body["messages"] for r in fake.openai.requests]
    assert len(bodies) == 4  # exactly positions 2-5
    for n, messages in enumerate(bodies, start=2):
        assert messages[0] == {"role": "system", "content": "Answer in great detail."}
        assert messages[-1] == {"role": "user", "content": f"q #{n}"}
    # The replayed history is the source's: its answers at positions 0 and 1.
    assert [m["content"] for m in bodies[0] if m["role"] == "assistant"] == [
        "answer 0",
        "answer 1",
    ]
    runs = json.loads(invoke(runner, "runs", "list", "--json", *where).stdout)
    fork = runs[0]
    assert fork["forked_from"] == {"run_id": source, "at": "main:2"}
    assert fork["status"] == "completed" and fork["output"] == {"answer": "detailed 3"}
    shown = invoke(runner, "runs", "show", fork["id"], *where).output
    assert f"run {source} at main:2" in shown
    # The source is untouched: its log byte for byte, its row as it was.
    assert invoke(runner, "runs", "events", source, "--json", *where).stdout == before
    after = json.loads(invoke(runner, "runs", "show", source, "--json", *where).stdout)
    assert after == shown_before
    assert raw_log(db_url, source) == stored_before  # byte for byte, as stored


GATED_AGENT = '''\
"""A step, then a failure until the file named by the input exists (a fix deployed);
retried, one more step behind a gate the test opens."""
from pathlib import Path


async def main(ctx, input):
    await ctx.tool("note", {"text": "before the failure"})
    if not Path(input["fixed"]).exists():
        raise RuntimeError("not fixed yet")
    return await ctx.tool("gate", {"path": input["gate"]})
'''

GATED_TOOLS = '''\
import asyncio
from pathlib import Path


def note(text: str) -> dict:
    """Note something."""
    return {"noted": text}


async def gate(path: str) -> dict:
    """Wait until the file at path exists (the test opens the gate)."""
    Path(path + ".started").write_text("started")
    for _ in range(6000):
        if Path(path).exists():
            return {"gate": "open"}
        await asyncio.sleep(0.01)
    raise TimeoutError("the gate never opened")
'''


class _WatchStreams:
    """ASGI middleware noting each SSE body chunk that carried a RunRetried event."""

    def __init__(self, app: Any, seen: list[bytes]) -> None:
        self.app = app
        self.seen = seen

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/stream"):
            return await self.app(scope, receive, send)

        async def watching(message: Any) -> None:
            await send(message)
            body = message.get("body", b"") if message["type"] == "http.response.body" else b""
            if b'"RunRetried"' in body:
                self.seen.append(body)

        return await self.app(scope, receive, watching)


async def test_cli_retry_over_http_follows_the_new_attempt_to_its_end(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``toren runs retry ID --url``: the run's stream holds the earlier attempt's
    RunFailed; the command follows the new attempt (held at a gate until the stream has
    passed that RunFailed) until it ends, and marks only the steps recorded before the
    retry as replayed (issue 40 item 1)."""
    for var in ("TOREN_DATABASE_URL", "TOREN_API_URL", "TOREN_API_TOKEN", "TOREN_AGENTS"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "agents"
    (root / "gated").mkdir(parents=True)
    (root / "gated" / "agent.yaml").write_text("name: gated\nentry: agent:main\n")
    (root / "gated" / "agent.py").write_text(GATED_AGENT)
    (root / "gated" / "tools.py").write_text(GATED_TOOLS)
    fixed, gate = tmp_path / "fixed", tmp_path / "gate"
    runtime = await open_runtime(root, db_url, toren.Settings(poll_interval=0.05))
    try:
        worker = toren.LocalWorkerRuntime(runtime.deps)
        app = create_app(runtime.store, runtime.resolver, runtime=worker, tokens=["t" * 32])
        streamed: list[bytes] = []
        app.add_middleware(_WatchStreams, seen=streamed)
        async with (
            worker,
            running_server(app) as server,
            AsyncTorenClient(server.url, "t" * 32) as client,
        ):
            run = await client.start_run("gated", {"fixed": str(fixed), "gate": str(gate)})
            assert (await client.wait(run.id, timeout=30)).status == "failed"
            fixed.write_text("fixed")
            where = ("--url", server.url, "--token", "t" * 32)
            retried = asyncio.create_task(
                asyncio.to_thread(invoke, CliRunner(), "runs", "retry", run.id, *where)
            )
            # The gate opens once the command's stream has sent the RunRetried (past the
            # old RunFailed), or once the command gave up following.
            deadline = asyncio.get_running_loop().time() + 30
            while not streamed and not retried.done():
                assert asyncio.get_running_loop().time() < deadline, "the command never streamed"
                await asyncio.sleep(0.02)
            gate.write_text("open")
            result = await asyncio.wait_for(retried, 60)
            assert (await client.wait(run.id, timeout=30)).status == "completed"
    finally:
        await close_runtime(runtime)
    assert result.exit_code == 0, result.output
    assert "✔ completed" in result.output, result.output
    lines = result.output.splitlines()
    (gate_line,) = [line for line in lines if "tool gate(" in line]
    (note_line,) = [line for line in lines if "tool note(" in line]
    assert "replayed" in note_line and "replayed" not in gate_line, result.output
