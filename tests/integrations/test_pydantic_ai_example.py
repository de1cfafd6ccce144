"""examples/pydantic-ai-support runs offline as shipped, emails once, and answers with its
structured Ticket."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import toren
from toren.runtime import close_runtime, open_runtime

pytest.importorskip("pydantic_ai")

EXAMPLE = Path(__file__).parents[2] / "examples" / "pydantic-ai-support"


async def test_the_example_runs_offline(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(EXAMPLE, tmp_path / "agents" / "support")
    outbox = tmp_path / "outbox.jsonl"
    monkeypatch.setenv("SUPPORT_AGENT_OUTBOX", str(outbox))
    monkeypatch.delenv("PYDANTIC_AI_SUPPORT_MODEL", raising=False)
    runtime = await open_runtime(tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05))
    try:
        run = await toren.start_run(
            runtime.store, runtime.resolver, "pydantic-ai-support", "Where is A-17?"
        )
        async with toren.LocalWorkerRuntime(runtime.deps):
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        assert final.status == "completed", final.error
        assert final.output == {"order": "A-17", "status": "shipped", "emailed": True}
        sent = [json.loads(line) for line in outbox.read_text().splitlines()]
        assert sent == [{"to": "c@example.com", "body": "Your order A-17 has shipped."}]
        events = await runtime.store.load_events(run.id)
        tools = [e.payload.name for e in events if e.type == "ToolCallRecorded"]
        assert tools == ["lookup_order", "send_email"]
    finally:
        await close_runtime(runtime)
