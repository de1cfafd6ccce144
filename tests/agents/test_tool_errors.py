"""Tool errors in the built-in loop are visible (issue 40, item 3): a tool that raises is
counted on the run (``tool_errors``: the run row, the API, ``toren runs list`` and
``show``), and ``on_tool_error: fail`` fails the run instead, retryable, with the tool's
traceback. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from click.testing import CliRunner

import toren
from toren.agents import DirectoryResolver
from toren.agents.config import AgentConfig
from toren.agents.pricing import cost
from toren.cli.main import cli
from toren.errors import AgentConfigError
from toren.store import Store

SCRIPT = """
responses:
  - tool_calls: [{name: flaky, arguments: {order_id: "A-17"}}]
  - tool_calls: [{name: flaky, arguments: {order_id: "A-17"}}, {name: fine, arguments: {}}]
  - text: "done"
default: {text: "done"}
"""

TOOLS = '''
import os
from pathlib import Path


def flaky(order_id: str) -> dict:
    """Look an order up; raises until the marker file exists."""
    marker = Path(os.environ["FLAKY_MARKER"])
    with open(os.environ["FLAKY_CALLS"], "a") as calls:
        calls.write(order_id + "\\n")
    if not marker.exists():
        raise RuntimeError(f"the order service is down for {order_id}")
    return {"order_id": order_id, "status": "shipped"}


def fine() -> str:
    """Always works."""
    return "ok"
'''


def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, extra: str = "") -> Path:
    agents = tmp_path / "agents"
    root = agents / "shop"
    root.mkdir(parents=True)
    (root / "agent.yaml").write_text(f"name: shop\nmodel: scripted:script.yaml\n{extra}")
    (root / "script.yaml").write_text(SCRIPT)
    (root / "tools.py").write_text(TOOLS)
    monkeypatch.setenv("FLAKY_MARKER", str(tmp_path / "fixed"))
    monkeypatch.setenv("FLAKY_CALLS", str(tmp_path / "calls.txt"))
    return agents


def _calls(tmp_path: Path) -> int:
    path = tmp_path / "calls.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_tool_errors_are_counted_and_the_run_still_completes_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    agents = _agent(tmp_path, monkeypatch)

    async def record() -> tuple[str, str]:
        store = await toren.connect(db_url)
        try:
            with DirectoryResolver(agents) as resolver:
                deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
                run = await toren.start_run(store, resolver, "shop", "where is A-17?")
                clean = await toren.start_run(store, resolver, "shop", "hello")
                result = await toren.tick(run.id, deps)
            assert result.status == "completed", result
            found = await store.get_run(run.id)
            assert found is not None and found.tool_errors == 2
            assert found.to_dict()["tool_errors"] == 2
            listed = {r.id: r for r in await store.list_runs(summary=True)}
            assert listed[run.id].tool_errors == 2 and listed[clean.id].tool_errors == 0
            return run.id, clean.id
        finally:
            await store.close()

    run_id, clean_id = asyncio.run(record())
    assert _calls(tmp_path) == 2  # both flaky calls ran, and raised

    runner = CliRunner()
    shown = runner.invoke(cli, ["runs", "list", "--database-url", db_url])
    assert shown.exit_code == 0, shown.output
    line = next(x for x in shown.output.splitlines() if run_id in x)
    assert "completed" in line and "2 tool errors" in line
    other = next(x for x in shown.output.splitlines() if clean_id in x)
    assert "tool error" not in other
    one = runner.invoke(cli, ["runs", "show", run_id, "--database-url", db_url])
    assert one.exit_code == 0 and "tool errors" in one.output
    assert any(x.split()[-1] == "2" for x in one.output.splitlines() if "tool errors" in x)


async def test_on_tool_error_fail_fails_the_run_and_a_retry_runs_the_tool_again(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    agents = _agent(tmp_path, monkeypatch, "on_tool_error: fail\n")
    with DirectoryResolver(agents) as resolver:
        deps = toren.TickDeps(store=store, agents=resolver, pricing=cost)
        run = await toren.start_run(store, resolver, "shop", "where is A-17?")
        failed = await toren.tick(run.id, deps)
        assert failed.status == "failed", failed
        error = failed.error or {}
        assert error["type"] == "ToolFailed" and "order service is down" in error["message"]
        assert "RuntimeError" in error.get("traceback", "") and "tools.py" in error["traceback"]
        record = await store.get_run(run.id)
        assert record is not None and record.status == "failed" and record.tool_errors == 1
        assert _calls(tmp_path) == 1

        (tmp_path / "fixed").write_text("")  # the service is back
        await toren.retry_run(store, resolver, run.id)
        done = await toren.tick(run.id, deps)
    assert done.status == "completed", done
    # The failed call ran again on the retry, then both calls of the second turn.
    assert _calls(tmp_path) == 3
    final = await store.get_run(run.id)
    assert final is not None and final.tool_errors == 1


def test_on_tool_error_is_checked_and_defaults_to_continue(tmp_path: Path) -> None:
    assert AgentConfig.model_validate({"name": "a"}).on_tool_error is None  # inherits
    proc = AgentConfig.model_validate(
        {"name": "a", "on_tool_error": "fail", "processes": {"p": {"on_tool_error": "continue"}}}
    )
    assert proc.on_tool_error == "fail" and proc.processes["p"].on_tool_error == "continue"
    root = tmp_path / "agents" / "a"
    root.mkdir(parents=True)
    (root / "agent.yaml").write_text("name: a\nmodel: scripted:echo\non_tool_error: stop\n")
    with pytest.raises(AgentConfigError) as caught, DirectoryResolver(tmp_path / "agents") as r:
        r.resolve("a", "main")
    assert "on_tool_error" in str(caught.value) and "continue" in str(caught.value)
