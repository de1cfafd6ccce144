"""The example agent (examples/support-agent) beyond the offline default:

* switched to ``openai:gpt-4o-mini`` by one line of agent.yaml, it runs through the real
  ``openai`` SDK against a loopback server speaking the Chat Completions wire format;
* a worker process running it is killed with SIGKILL in the middle of the run, and a new
  worker completes it with no tool performed twice and no model call paid twice.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import toren
from tests.providers.fakes import FAKE_KEY, Break, Completion, FakeToolCall, serve_fake_models
from toren.providers.scripted import read_ledger
from toren.runtime import close_runtime, open_runtime

EXAMPLE = Path(__file__).parents[2] / "examples" / "support-agent"
SCRIPTED_LINE = "model: scripted:script.yaml\n"


def copy_example(tmp_path: Path) -> Path:
    return Path(shutil.copytree(EXAMPLE, tmp_path / "agents" / "support-agent"))


def emails(outbox: Path) -> list[dict[str, Any]]:
    if not outbox.exists():
        return []
    return [json.loads(line) for line in outbox.read_text().splitlines() if line.strip()]


async def run_example(db_url: str, tmp_path: Path, question: str) -> tuple[Any, list[Any]]:
    """Run the copied example once on an in-process worker: its final record and events."""
    runtime = await open_runtime(tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05))
    try:
        run = await toren.start_run(runtime.store, runtime.resolver, "support-agent", question)
        async with toren.LocalWorkerRuntime(runtime.deps):
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        return final, await runtime.store.load_events(run.id)
    finally:
        await close_runtime(runtime)


async def test_the_example_switches_to_openai_by_one_line(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agent = copy_example(tmp_path)
    yaml_text = (agent / "agent.yaml").read_text()
    assert yaml_text.count(SCRIPTED_LINE) == 1
    (agent / "agent.yaml").write_text(
        yaml_text.replace(SCRIPTED_LINE, "model: openai:gpt-4o-mini\n")
    )
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(outbox))
    with serve_fake_models() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        fake.openai.script(
            Completion(tool_calls=(FakeToolCall("c1", "lookup_order", {"order_id": "A-17"}),)),
            Completion(
                tool_calls=(
                    FakeToolCall(
                        "c2",
                        "send_email",
                        {"to": "c@example.com", "subject": "A-17", "body": "shipped"},
                    ),
                )
            ),
            Completion(text="Your order A-17 has shipped."),
        )
        final, _ = await run_example(db_url, tmp_path, "Where is A-17?")
        assert final.status == "completed", final.error
        assert final.output["answer"] == "Your order A-17 has shipped."
        assert fake.openai.served == 3 and len(emails(outbox)) == 1
        first = fake.openai.requests[0].body
        assert first["model"] == "gpt-4o-mini" and first["temperature"] == 0.2
        assert first["messages"][0]["role"] == "system"
        assert {t["function"]["name"] for t in first["tools"]} >= {"lookup_order", "send_email"}
        third = fake.openai.requests[2].body
        assert [m["role"] for m in third["messages"]][-2:] == ["assistant", "tool"]
        assert final.output_tokens == 3 * 7  # the fake server's usage, recorded per call


async def test_garbled_tool_arguments_go_back_to_the_model_on_the_engine(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A model writing invalid JSON for a tool's arguments made the whole model call fail
    # (and the run with it). Now the call is recorded as served, the tool is not run, and
    # the model is told what was wrong; here it corrects itself.
    agent = copy_example(tmp_path)
    yaml_text = (agent / "agent.yaml").read_text()
    (agent / "agent.yaml").write_text(
        yaml_text.replace(SCRIPTED_LINE, "model: openai:gpt-4o-mini\n")
    )
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(outbox))
    email = {"to": "c@example.com", "subject": "A-17", "body": "shipped"}
    garbled = '{"to": "c@example.com", "subject": "A-17" "body": "shipped"}'
    with serve_fake_models() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        fake.openai.script(
            Completion(tool_calls=(FakeToolCall("c1", "send_email", {}, raw=garbled),)),
            Completion(tool_calls=(FakeToolCall("c2", "send_email", email),)),
            Completion(text="Sent."),
        )
        final, events = await run_example(db_url, tmp_path, "Email me about A-17.")
        assert final.status == "completed", final.error
        assert final.output["answer"] == "Sent."
        sent = emails(outbox)
        assert [(e["to"], e["body"]) for e in sent] == [(email["to"], email["body"])]
        assert final.output_tokens == 3 * 7  # all three calls were served and recorded
        second = fake.openai.requests[1].body["messages"]
        assert second[-2]["tool_calls"][0]["function"]["arguments"] == "{}"
        assert second[-1]["content"].startswith(
            "error: ToolArgumentsError: invalid arguments for tool 'send_email': not valid JSON"
        )
    recorded = [e.payload for e in events if e.type == "ModelCallRecorded"]
    first = recorded[0].response  # type: ignore[attr-defined]
    assert first["tool_calls"][0]["raw_arguments"] == garbled
    assert [e.payload.name for e in events if e.type == "ToolCallRecorded"] == ["send_email"]  # type: ignore[attr-defined]


async def run_into_a_broken_stream(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any]:
    """Run the example on openai:gpt-4o-mini against a stream that reports its usage
    (30 input, 2 output tokens) and then drops before [DONE]. The run's final record and
    its ModelCallRecorded payload."""
    agent = copy_example(tmp_path)
    yaml_text = (agent / "agent.yaml").read_text()
    (agent / "agent.yaml").write_text(
        yaml_text.replace(SCRIPTED_LINE, "model: openai:gpt-4o-mini\n")
    )
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(tmp_path / "outbox.jsonl"))
    broken = Break(after=5, how="reset")  # after the usage chunk, before [DONE]
    with serve_fake_models() as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.openai_url)
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        fake.openai.script(
            Completion(text="abcdefgh", input_tokens=30, output_tokens=2, broken=broken)
        )
        final, events = await run_example(db_url, tmp_path, "Where is A-17?")
    (recorded,) = [e.payload for e in events if e.type == "ModelCallRecorded"]
    return final, recorded


async def test_a_broken_stream_hands_its_reported_usage_to_the_engine(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The provider's part: the failure carries the usage in its details, which the
    # engine records with the error.
    final, recorded = await run_into_a_broken_stream(db_url, tmp_path, monkeypatch)

    assert final.status == "failed"
    assert "broke off after it had begun" in final.error["message"]
    assert recorded.error["usage"] == {"input_tokens": 30, "output_tokens": 2}


async def test_a_broken_streams_reported_usage_is_counted_and_priced(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    final, recorded = await run_into_a_broken_stream(db_url, tmp_path, monkeypatch)

    assert (recorded.input_tokens, recorded.output_tokens) == (30, 2)
    assert recorded.cost_usd != "0"
    assert (final.input_tokens, final.output_tokens) == (30, 2)
    assert final.cost_usd > 0


def toren_worker(agents: Path, db_url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
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
        stderr=subprocess.DEVNULL,
    )


async def test_sigkill_mid_run_repeats_no_tool_and_no_paid_call(
    db_url: str, tmp_path: Path
) -> None:
    agent = copy_example(tmp_path)
    script = (agent / "script.yaml").read_text()
    # The final answer is slow: the kill lands while it is in flight, after the email.
    script = script.replace('  - text: "Your order', '  - latency: 30\n    text: "Your order')
    (agent / "script.yaml").write_text(script)
    outbox, ledger = tmp_path / "outbox.jsonl", tmp_path / "ledger.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOREN_")}
    env.update(SUPPORT_AGENT_OUTBOX=str(outbox), TOREN_SCRIPTED_LEDGER=str(ledger))

    runtime = await open_runtime(tmp_path / "agents", db_url, toren.Settings())
    try:
        run = await toren.start_run(
            runtime.store, runtime.resolver, "support-agent", "Where is A-17?"
        )
        store = runtime.store
        worker = toren_worker(tmp_path / "agents", db_url, env)
        try:
            deadline = time.monotonic() + 60
            while True:  # until the email is recorded and the last model call is in flight
                events = await store.load_events(run.id)
                tools = [e.payload.name for e in events if e.type == "ToolCallRecorded"]
                if tools == ["lookup_order", "send_email"]:
                    break
                assert time.monotonic() < deadline and worker.poll() is None, tools
                await asyncio.sleep(0.02)
            worker.send_signal(signal.SIGKILL)
            worker.wait()
            assert (await store.get_run(run.id)).status == "running"  # type: ignore[union-attr]

            # Restart: same worker id, so the dead process's lease is taken back at once.
            (agent / "script.yaml").write_text(script.replace("latency: 30", "latency: 0"))
            worker = toren_worker(tmp_path / "agents", db_url, env)
            final = await toren.wait_for_run(store, run.id, timeout=60)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
        assert final.status == "completed", final.error
        assert final.output["answer"].startswith("Your order A-17 has shipped")
        assert len(emails(outbox)) == 1  # the side effect happened exactly once
        turns = [line["turn"] for line in read_ledger(ledger)]
        assert turns == [0, 1, 2]  # each model call paid once (the killed one never finished)
        events = await store.load_events(run.id)
        assert [e.type for e in events].count("ToolCallRecorded") == 2
        assert final.lease_recoveries == 1
    finally:
        await close_runtime(runtime)
