"""Bad input around a pydantic-ai entry: each gets a clear error naming what to do, and
none becomes a stuck run (the agent fails to load, so no run is created; or the run
fails with the reason)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import toren
from toren.agents import load_agent
from toren.errors import AgentConfigError
from toren.integrations import adapt_entry
from toren.runtime import close_runtime, open_runtime

pytest.importorskip("pydantic_ai")


def agent_dir(root: Path, app: str, entry: str = "app:agent") -> Path:
    directory = root / "agents" / "broken"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "agent.yaml").write_text(f"name: broken\nentry: {entry}\n")
    (directory / "app.py").write_text(app)
    return directory


def refused(directory: Path) -> str:
    with pytest.raises(AgentConfigError) as caught:
        load_agent(directory, adapt_entry=adapt_entry)
    return str(caught.value)


def test_a_wrong_object_names_what_an_entry_may_be(tmp_path: Path) -> None:
    message = refused(agent_dir(tmp_path, "agent = {'model': 'openai:gpt-4o'}\n"))
    assert "entry" in message and "'app:agent'" in message
    assert "an object of type dict" in message
    assert "async def main(ctx, input)" in message and "pydantic_ai.Agent instance" in message


def test_another_pydantic_ai_object_is_not_an_agent(tmp_path: Path) -> None:
    app = "from pydantic_ai.models.test import TestModel\nagent = TestModel()\n"
    message = refused(agent_dir(tmp_path, app))
    assert "pydantic_ai.models.test.TestModel" in message
    assert "pydantic_ai.Agent instance" in message


def test_an_agent_without_a_model_is_refused(tmp_path: Path) -> None:
    app = "from pydantic_ai import Agent\nagent = Agent(instructions='hi')\n"
    message = refused(agent_dir(tmp_path, app))
    assert "without a model" in message and "Agent(model=...)" in message


def test_pydantic_ai_not_installed_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What an environment without the extra looks like to the import system.
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)
    app = "from pydantic_ai import Agent\nagent = Agent('test')\n"
    message = refused(agent_dir(tmp_path, app))
    assert "'pydantic_ai', which is not installed" in message
    assert "pip install 'toren-run[pydantic-ai]'" in message


async def test_a_refused_entry_creates_no_run(db_url: str, tmp_path: Path) -> None:
    agent_dir(tmp_path, "from pydantic_ai import Agent\nagent = Agent()\n")
    runtime = await open_runtime(tmp_path / "agents", db_url)
    try:
        with pytest.raises(AgentConfigError, match="without a model"):
            await toren.start_run(runtime.store, runtime.resolver, "broken", "hi")
        assert await runtime.store.list_runs() == []
    finally:
        await close_runtime(runtime)


NATIVE = """\
from pydantic_ai import Agent, WebSearchTool
from pydantic_ai.capabilities import NativeTool
from pydantic_ai.models.openai import OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

model = OpenAIResponsesModel(
    "gpt-4o-mini", provider=OpenAIProvider(base_url="http://127.0.0.1:9/v1", api_key="sk-x")
)
agent = Agent(model, capabilities=[NativeTool(WebSearchTool())])
"""

PLAIN = """\
from pydantic_ai import Agent
from pydantic_ai.models.test import TestModel

agent = Agent(TestModel())
"""


@pytest.mark.parametrize(
    ("app", "input", "reason"),
    [
        (NATIVE, "hi", "native (provider-side) tools ['WebSearchTool']"),
        (PLAIN, ["not", "a", "prompt"], "a pydantic-ai agent takes a text prompt"),
    ],
    ids=["native-tools", "non-text-input"],
)
async def test_an_unsupported_request_fails_the_run_with_its_reason(
    db_url: str, tmp_path: Path, app: str, input: object, reason: str
) -> None:
    agent_dir(tmp_path, app)
    runtime = await open_runtime(tmp_path / "agents", db_url, toren.Settings(poll_interval=0.05))
    try:
        run = await toren.start_run(runtime.store, runtime.resolver, "broken", input)
        async with toren.LocalWorkerRuntime(runtime.deps):
            final = await toren.wait_for_run(runtime.store, run.id, timeout=30)
        assert final.status == "failed"
        assert reason in final.error["message"]
    finally:
        await close_runtime(runtime)
